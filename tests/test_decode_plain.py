"""Plain decoding, pipelined: step n+1 is queued before step n's token is read.

Against the one-step-at-a-time loop (DecodeSettings(pipeline=False), MLXSPEC_PIPELINE=0): the same
tokens, greedy and seeded sampling, whatever ends the run (EOS, max_tokens, the context window, a cancel, the caller
walking away), one host read-back per token, and a KV cache that the next request can trust.
"""

from __future__ import annotations

import threading

import mlx.core as mx
import pytest

from mlxspec.engine import Engine
from mlxspec.options import GenerateOptions
from mlxspec.settings import DecodeSettings

PROMPTS = ["Once upon a time", "def add(a, b):", "a"]


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine.load(str(tiny_llama))


def run(engine, prompt, **options):
    tokens = []
    for ev in engine.generate(prompt, GenerateOptions(**options)):
        tokens += ev.tokens
    assert_cache_holds_what_it_says(engine)
    return tokens, ev


def assert_cache_holds_what_it_says(engine):
    """The prefix cache's token list and its KV cache agree (no queued step left in it)."""
    kv = engine.kv
    assert kv.tokens is not None and all(c.offset == len(kv.tokens) for c in kv.cache)


def one_at_a_time(engine, prompt, monkeypatch, **options):
    with monkeypatch.context() as m:
        m.setattr(engine, "settings", DecodeSettings(pipeline=False))
        return run(engine, prompt, **options)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 17, 40])
def test_same_tokens_as_one_step_at_a_time(engine, monkeypatch, max_tokens):
    for prompt in PROMPTS:
        tokens, last = run(engine, prompt, max_tokens=max_tokens)
        expected, ref = one_at_a_time(engine, prompt, monkeypatch, max_tokens=max_tokens)
        assert tokens == expected and last.finish_reason == ref.finish_reason == "length"
        assert last.stats.host_syncs == last.stats.rounds == len(tokens)


def test_seeded_sampling_draws_the_same_tokens(engine, monkeypatch):
    opts = dict(max_tokens=30, temperature=0.9, top_k=20, seed=11)
    assert run(engine, PROMPTS[0], **opts)[0] == one_at_a_time(engine, PROMPTS[0], monkeypatch, **opts)[0]


def test_eos_stops_and_the_cache_stays_usable(engine, monkeypatch):
    full, _ = one_at_a_time(engine, PROMPTS[0], monkeypatch, max_tokens=30)
    saved = set(engine.tokenizer.eos_token_ids)
    try:
        pos = next(i for i, t in enumerate(full) if i >= 3 and full.index(t) == i)
        engine.tokenizer.eos_token_ids = {full[pos]}
        tokens, last = run(engine, PROMPTS[0], max_tokens=30)
        assert tokens == full[:pos] and last.finish_reason == "stop"
    finally:
        engine.tokenizer.eos_token_ids = saved
    # the queued step past EOS was dropped from the cache: a longer prompt reuses it correctly
    ids = engine.encode(PROMPTS[0]) + full[:pos]
    assert run(engine, ids, max_tokens=10)[0] == full[pos : pos + 10]


def test_context_window_ends_the_run(engine, monkeypatch):
    ids = engine.encode(PROMPTS[1])
    tokens, last = run(engine, ids, max_tokens=50, num_ctx=len(ids) + 7)
    expected, _ = one_at_a_time(engine, ids, monkeypatch, max_tokens=50, num_ctx=len(ids) + 7)
    assert tokens == expected and len(tokens) == 7 and last.finish_reason == "length"


def test_cancel_and_walking_away_leave_the_engine_ready(engine):
    expected, _ = run(engine, PROMPTS[2], max_tokens=25)
    cancel = threading.Event()
    stream = engine.generate(PROMPTS[0], GenerateOptions(max_tokens=40), cancel=cancel)
    next(stream)
    cancel.set()
    events = list(stream)
    assert events[-1].finish_reason == "cancelled"
    assert_cache_holds_what_it_says(engine)
    assert run(engine, PROMPTS[2], max_tokens=25)[0] == expected
    stream = engine.generate(PROMPTS[0], GenerateOptions(max_tokens=40))
    next(stream)
    stream.close()
    assert_cache_holds_what_it_says(engine)
    assert run(engine, PROMPTS[2], max_tokens=25)[0] == expected


def test_one_read_back_per_token_and_steps_queued_ahead(engine, monkeypatch):
    evals, queued = [], []
    real_eval, real_async = mx.eval, mx.async_eval
    monkeypatch.setattr(mx, "eval", lambda *a: (evals.append(1), real_eval(*a))[1])
    monkeypatch.setattr(mx, "async_eval", lambda *a: (queued.append(1), real_async(*a))[1])
    reads = []
    real_item = mx.array.item
    monkeypatch.setattr(mx.array, "item", lambda self: (reads.append(1), real_item(self))[1])
    tokens, last = run(engine, PROMPTS[0] + " there was", max_tokens=20)
    assert len(tokens) == 20 and last.stats.host_syncs == 20
    assert len(queued) == 20  # every step queued before its token was read
    assert len(reads) == 20 and len(evals) <= 1  # one read per token (plus at most the prompt's prefill)


def test_plain_stretches_of_an_adaptive_engine_are_pipelined_too(tiny_llama, engine, monkeypatch):
    """When adaptation decodes plain, consecutive plain rounds queue ahead as well; output unchanged."""
    from mlxspec.adaptive import CostModel

    spec = Engine.load(str(tiny_llama), drafter="lookup", draft_length=4)

    def dear_drafting() -> CostModel:
        """Plain looks cheap and drafting dear: the controller backs off to plain. Fresh for every
        request: the table is engine-wide, and the probes of one request time real (cheap) drafting
        rounds, which could let the next start drafting (seen once in a loaded CI run)."""
        costs = CostModel()
        costs.add(0, 1e-4)
        for k in (1, 4):
            costs.add(k, 1.0)
        return costs

    expected = {p: run(engine, p, max_tokens=30)[0] for p in PROMPTS}
    queued = []
    real_async = mx.async_eval
    monkeypatch.setattr(mx, "async_eval", lambda *a: (queued.append(1), real_async(*a))[1])
    for prompt in PROMPTS:
        spec.costs = dear_drafting()
        tokens, last = run(spec, prompt, max_tokens=30)
        assert tokens == expected[prompt]
        assert last.stats.backoffs > 0 or last.stats.drafted == 0
    assert len(queued) > len(PROMPTS), "plain rounds were not queued ahead"


def test_an_engine_without_a_drafter_decodes_plain_rounds(engine):
    """drafter 'none' with a nonzero draft length still queues plain rounds ahead."""
    tokens, last = run(engine, PROMPTS[0], max_tokens=12, draft_length=4)
    assert last.stats.draft_length == 0 and last.stats.drafted == 0 and len(tokens) == 12
