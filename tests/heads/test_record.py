"""record(): the target's answers are recorded until the tokens asked for, and no further."""

from __future__ import annotations

import pytest

from mlxspec.engine import Engine
from mlxspec.errors import MlxspecError
from mlxspec.heads.record import load_prompts, record


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine.load(str(tiny_llama))


def counting(engine, monkeypatch) -> list:
    calls = []
    generate = engine.generate

    def counted(ids, *args, **kwargs):
        calls.append(len(ids))
        return generate(ids, *args, **kwargs)

    monkeypatch.setattr(engine, "generate", counted)
    return calls


@pytest.mark.parametrize("tokens", [10, 25])
def test_recording_stops_at_the_tokens_asked_for(engine, tokens, monkeypatch):
    """An answer cut at its budget keeps one token less than it generated (its last has no row):
    the last answer's budget allows for that, so the total is reached and no prompt after it is
    answered (it was: every remaining prompt got a 1-token answer too short to keep)."""
    calls = counting(engine, monkeypatch)
    samples = record(engine, load_prompts()[:30], tokens=tokens, max_answer=16, show=False)
    assert sum(len(s.ids) - s.answer_start for s in samples) == tokens
    assert len(calls) == len(samples)


def test_recording_stops_when_what_is_left_is_too_short_to_keep(engine, monkeypatch):
    """Fewer tokens left than the shortest answer kept (3): no answer is generated for them."""
    calls = counting(engine, monkeypatch)
    with pytest.raises(MlxspecError, match="no usable answers"):
        record(engine, load_prompts()[:30], tokens=2, max_answer=16, show=False)
    assert calls == []


def test_batched_recording_stops_at_the_tokens_asked_for(engine):
    """Side by side (record_batch.py) the same budget rule holds."""
    samples = record(engine, load_prompts()[:30], tokens=25, max_answer=16, show=False, batch=2)
    assert sum(len(s.ids) - s.answer_start for s in samples) == 25
