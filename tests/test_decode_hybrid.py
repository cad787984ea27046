"""Speculation over models whose layers cannot all trim their cache.

Qwen3-Next mixes gated delta-net layers (a recurrent state that takes in every row it is fed) with
attention layers. A rejected draft cannot be trimmed out of that state: the round snapshots the
recurrent states before its verify pass and, when drafts are rejected, restores them and feeds the
kept rows again (rounds.ChainRound). Before this, rejected drafts stayed in the state and the
output drifted from plain decoding. A cache that can neither trim nor be restored turns speculation off.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache, RotatingKVCache

from mlxspec.cache import new_cache, restore, rewind, snapshot
from mlxspec.engine import Engine
from mlxspec.options import GenerateOptions
from model_factory import make_model_dir

PROMPTS = ["the world and the world and the world and the", "Once upon a time", "def add(a, b):"]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return str(make_model_dir(tmp_path_factory.mktemp("qwen3-next"), "qwen3_next", layers=4, seed=3))


def run(engine, prompt, **kw):
    tokens = []
    for ev in engine.generate(prompt, GenerateOptions(max_tokens=40, temperature=0, **kw)):
        tokens += ev.tokens
    return tokens, ev.stats


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_speculation_over_recurrent_layers_equals_plain(hybrid, k):
    plain, lookup = Engine.load(hybrid), Engine.load(hybrid, drafter="lookup")
    rejected = 0
    for prompt in PROMPTS:
        tokens, stats = run(lookup, prompt, draft_length=k)
        assert tokens == run(plain, prompt)[0], prompt
        assert stats.exact  # verify rows measured equal to one-row steps, recurrent layers restored
        rejected += stats.drafted - stats.accepted
    assert rejected > 0  # rounds did restore and replay


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe"])
def qwen35_gguf(request, tmp_path_factory):
    """Qwen3.5 (dense, MoE) as a 4-bit GGUF in llama.cpp's layout: its projections run mlxspec's kernels."""
    from gguf_fixtures import Dims, write_tiny_llama_gguf

    dims = Dims(layers=4, head_dim=32, rope_dims=8, experts=8, experts_used=3)
    path = tmp_path_factory.mktemp(request.param) / f"{request.param}.gguf"
    return str(write_tiny_llama_gguf(path, "Q4_0", arch=request.param, dims=dims, pre="qwen35"))


def test_qwen35_gguf_speculates_exactly(qwen35_gguf):
    plain, lookup = Engine.load(qwen35_gguf), Engine.load(qwen35_gguf, drafter="lookup")
    swapped = plain.kernels["target"]["layers"]["swapped"]
    assert sum(".linear_attn." in p for p in swapped) == 5 * 2  # q/k/v, z, a, b and out of both delta-net layers
    accepted = rejected = 0
    for k in (2, 7):
        for prompt in PROMPTS:
            tokens, stats = run(lookup, prompt, draft_length=k)
            assert tokens == run(plain, prompt)[0], (k, prompt)
            assert stats.exact
            accepted, rejected = accepted + stats.accepted, rejected + stats.drafted - stats.accepted
    assert accepted > 0 and rejected > 0  # kept drafts, and rounds that restored the recurrent states


def test_snapshot_restores_a_recurrent_state(hybrid):
    model = Engine.load(hybrid).target.model
    cache = new_cache(model)
    import mlx.core as mx

    model(mx.array([[5, 6, 7]]), cache=cache)
    saved = snapshot(cache)
    assert saved and all(any(a is not None for a in arrays) for _, arrays in saved)
    before = model(mx.array([[9]]), cache=cache)
    rewind(cache, 1)
    restore(saved)
    model(mx.array([[11, 12]]), cache=cache)  # rows that are then undone
    rewind(cache, 2)
    restore(saved)
    assert mx.array_equal(model(mx.array([[9]]), cache=cache), before).item()


def test_a_cache_that_cannot_undo_turns_speculation_off(tiny_llama):
    """mlx-lm's RotatingKVCache with kept tokens neither trims nor restores: plain rounds, said so."""
    plain, lookup = Engine.load(str(tiny_llama)), Engine.load(str(tiny_llama), drafter="lookup")
    model = lookup.target.model
    model.make_cache = lambda: [RotatingKVCache(max_size=512, keep=4) for _ in model.layers]
    stuck = Engine(lookup.target, lookup.drafter, draft_length=4)
    assert not stuck.speculable and "cannot undo" in stuck.info["speculation"]
    tokens, stats = run(stuck, PROMPTS[0])
    assert stats.drafted == 0 and stats.drafter == "none"
    del model.make_cache
    assert tokens == run(plain, PROMPTS[0])[0]
    assert type(new_cache(model)[0]) is KVCache


def test_a_chat_s_next_turn_reuses_the_recurrent_states(hybrid):
    """A second turn that carries the first's prompt and answer reuses the whole cache (the states were rebuilt for
    every request before), and one that keeps only the first's prompt goes back to its checkpoint; speculation
    keeps plain decoding's tokens on those states, and both equal a fresh engine's on the same pieces (a first
    request, then the turn)."""
    plain, lookup = Engine.load(hybrid), Engine.load(hybrid, drafter="lookup")
    tokenizer = plain.tokenizer
    first = tokenizer.encode(PROMPTS[0])
    answer, _ = run(plain, first)
    turns = [first + answer + tokenizer.encode(" and the"), first + tokenizer.encode(" once more")]
    want = []
    for turn in turns:  # a fresh engine that read the first request, then this turn
        fresh = Engine.load(hybrid)
        run(fresh, first)
        want.append(run(fresh, turn)[0])
    run(lookup, first, draft_length=3)
    for turn, expected, reused in zip(turns, want, (len(first) + len(answer) - 1, len(first) - 1)):
        for engine in (plain, lookup):
            tokens, stats = run(engine, turn, draft_length=3)
            assert tokens == expected and stats.cached_tokens == reused, (engine.drafter.name, reused)
        run(plain, first), run(lookup, first, draft_length=3)  # both back to holding the first request


def test_a_step_queued_past_the_end_leaves_the_cache_as_it_says(hybrid, monkeypatch):
    """Plain decoding queues its next step before it reads a token; a request that ends there (EOS, a stop string)
    takes the queued step out of the cache. Recurrent states cannot be trimmed: they must come back from before it,
    or the next request, reusing the cache, would read that token twice. The cache after a request that stops so is
    the cache of the same request decoded without queued steps, bit for bit."""
    from mlx_lm.models.cache import ArraysCache

    from mlxspec.cache import layer_caches

    engine = Engine.load(hybrid)
    tokens, _ = run(engine, PROMPTS[0])
    stop = engine.tokenizer.decode(tokens[4:6])  # ends the request early, a step queued
    monkeypatch.setenv("MLXSPEC_PIPELINE", "0")
    unqueued = Engine.load(hybrid)
    caches = []
    for e in (engine, unqueued):
        events = list(e.generate(PROMPTS[0], GenerateOptions(max_tokens=40, temperature=0, stop=[stop])))
        assert events[-1].finish_reason == "stop"
        caches.append([c for c in layer_caches(e.kv.cache) if isinstance(c, ArraysCache)])
    assert engine.kv.tokens == unqueued.kv.tokens and caches[0]
    for a, b in zip(*caches):
        assert all(mx.array_equal(x, y).item() for x, y in zip(a.cache, b.cache))


def test_a_run_that_ends_inside_a_round_leaves_plain_decoding_s_cache(hybrid, monkeypatch):
    """A stop string (or EOS) among a round's kept drafts ends the run before the round's last tokens, which the
    cache already holds. They are taken out (recurrent states restored and the rows that count read again), so the
    cache holds what plain decoding's would, the same tokens and states: a next request sharing this prefix reuses
    the same cache whether this one drafted or not."""
    from mlx_lm.models.cache import ArraysCache

    from mlxspec.cache import layer_caches
    from mlxspec.rounds import ChainRound

    settled = []
    original = ChainRound.settle
    monkeypatch.setattr(ChainRound, "settle", lambda self, cache, extra: settled.append(extra) or
                        original(self, cache, extra))
    plain, lookup = Engine.load(hybrid), Engine.load(hybrid, drafter="lookup")
    prompt = PROMPTS[0]
    tokens, _ = run(plain, prompt)
    for cut in range(3, 12):
        stop = plain.tokenizer.decode(tokens[cut : cut + 1])
        options = GenerateOptions(max_tokens=40, temperature=0, stop=[stop], draft_length=4, adaptive=False)
        answers = [[t for e in engine.generate(prompt, options) for t in e.tokens] for engine in (plain, lookup)]
        assert answers[0] == answers[1] and plain.kv.tokens == lookup.kv.tokens, cut
        states = [[a for c in layer_caches(e.kv.cache) if isinstance(c, ArraysCache) for a in c.cache]
                  for e in (plain, lookup)]
        assert all(mx.array_equal(a, b).item() for a, b in zip(*states)), cut
    assert settled  # some runs ended inside a round
