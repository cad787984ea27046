"""The emission stage: one place where output ends and tokens are counted; the engine's thin checks."""

from __future__ import annotations

import threading

import pytest
from test_decode_greedy import run

from mlxspec.emit import Emitter
from mlxspec.engine import Engine
from mlxspec.errors import PromptError
from mlxspec.options import GenerateOptions
from mlxspec.settings import DecodeSettings
from mlxspec.stats import Stats

EOS = 0


class Letters:
    """A stand-in streaming detokenizer: token t is the letter 'a' + t."""

    def __init__(self):
        self.last_segment = ""

    def add_token(self, t):
        self.last_segment = chr(ord("a") + t)

    def finalize(self):
        self.last_segment = ""


def emitter(limit=100, stops=(), cancel=None):
    stats = Stats()
    return Emitter(limit, {EOS}, stats, stops=list(stops), detokenizer=Letters(), cancel=cancel), stats


def test_eos_ends_the_run_and_is_not_emitted():
    em, stats = emitter()
    ev = em.emit([1, 2, EOS, 3], from_draft=3)
    assert ev.tokens == [1, 2] and ev.from_draft == [True, True] and ev.text == "bc"
    assert em.finish_reason == "stop" and em.ended() and stats.generated_tokens == 2


def test_the_limit_cuts_a_round_and_ends_with_length():
    em, stats = emitter(limit=3)
    assert em.emit([1, 2], 1).tokens == [1, 2] and not em.ended()
    assert em.emit([3, 4, 5], 2).tokens == [3] and em.finish_reason == "length"
    assert stats.generated_tokens == 3


def test_a_stop_string_cuts_text_and_counts_only_the_tokens_emitted():
    em, stats = emitter(stops=["cd"])
    ev = em.emit([1, 2, 3, 4], 2)  # "bcde": the stop completes at token 3
    assert ev.text == "b" and ev.tokens == [1, 2, 3] and em.finish_reason == "stop"
    assert stats.generated_tokens == 3
    last = em.close()
    assert last.done and last.text == "" and last.finish_reason == "stop" and last.stats is stats


def test_text_held_for_a_possible_stop_is_released_at_the_end():
    em, _ = emitter(stops=["cz"])
    assert em.emit([1, 2], 0).text == "b"  # "c" may begin "cz"
    last = em.close()
    assert last.text == "c" and last.finish_reason == "stop"


def test_cancel_and_an_empty_budget_end_before_a_round():
    cancel = threading.Event()
    em, _ = emitter(cancel=cancel)
    assert not em.ended()
    cancel.set()
    assert em.ended() and em.finish_reason == "cancelled"
    em, _ = emitter(limit=0)
    assert em.ended() and em.finish_reason == "length"


@pytest.fixture(scope="module")
def spec(tiny_llama):
    return Engine.load(str(tiny_llama), draft=str(tiny_llama), draft_quantize="q4g32", draft_length=4)


def test_generated_tokens_is_exactly_what_was_emitted(spec):
    """A stop string cuts a drafted block: the count is of tokens emitted, with no fix-up after."""
    tokens, text, _ = run(spec, "Once upon a time", max_tokens=40, adaptive=False)
    stops = [s for s in (text[5:8], text[len(text) // 2 : len(text) // 2 + 2]) if s.strip()]
    assert stops
    for stop in stops:
        emitted, _, last = run(spec, "Once upon a time", max_tokens=40, stop=[stop], adaptive=False)
        assert last.finish_reason == "stop" and emitted == tokens[: len(emitted)] and len(emitted) < len(tokens)
        assert last.stats.generated_tokens == len(emitted)


def test_prompt_ids_outside_the_vocabulary_are_refused(spec):
    size = spec.target.model.model.embed_tokens.weight.shape[0]
    assert spec.vocab_size == size
    for bad in (size, size + 1000, -1):
        with pytest.raises(PromptError, match=f"{bad}.*vocabulary size {size}"):
            list(spec.generate([1, 2, bad], GenerateOptions(max_tokens=2)))
    assert len(run(spec, [1, 2, size - 1], max_tokens=2)[0]) <= 2  # the last row is a valid id


def test_stats_carry_the_engines_measured_exactness(spec, monkeypatch):
    stats = run(spec, "Hello", max_tokens=2)[2].stats
    assert stats.exact is True and stats.to_dict()["exact"] is True and "exact: yes" in stats.summary()
    monkeypatch.setattr(spec.rows, "holds", lambda rows, tree_rows=(): False)  # as on a GPU with MLX's own ops
    stats = run(spec, "Hello", max_tokens=2)[2].stats
    assert stats.exact is False and spec.exact is False and "exact: no" in stats.summary()
    assert "exact: unknown" in Stats().summary()


def test_settings_come_from_the_environment_when_the_engine_is_built(spec, monkeypatch):
    assert DecodeSettings.from_env({}) == DecodeSettings(fused_accept=False, pipeline=True)
    before = spec.settings
    monkeypatch.setenv("MLXSPEC_FUSED_ACCEPT", "1")
    monkeypatch.setenv("MLXSPEC_PIPELINE", "0")
    built = Engine(spec.target)
    assert built.settings == DecodeSettings(fused_accept=True, pipeline=False)
    assert spec.settings is before  # an engine built before keeps what it read
    assert Engine(spec.target, settings=DecodeSettings()).settings.pipeline
