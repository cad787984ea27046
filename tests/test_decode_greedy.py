"""Greedy exactness: speculative output is token-identical to plain decoding of the target.

Plain decoding here is both our loop with nothing drafted and mlx-lm's own `generate_step`
(an independent reference). Drafts: the target's own 4-bit quantization (mostly agrees) and a
model with other weights (mostly disagrees), for draft lengths 1..8 on several prompts.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlxspec.adaptive import CostModel
from mlxspec.engine import Engine
from mlxspec.options import GenerateOptions

PROMPTS = [
    "Once upon a time",
    "def add(a, b):",
    "The quick brown fox",
    "Hello world! How are you",
    "Speculative decoding drafts tokens",
    "a",
]


def run(engine: Engine, prompt, **options):
    """(tokens, text, last event) of one generation."""
    tokens, text = [], ""
    for ev in engine.generate(prompt, GenerateOptions(**options)):
        tokens += ev.tokens
        text += ev.text
    return tokens, text, ev


def mlx_lm_greedy(engine: Engine, prompt: str, n: int) -> list[int]:
    ids = mx.array(engine.encode(prompt))
    out = []
    for tok, _ in generate_step(ids, engine.target.model, max_tokens=n):
        t = int(tok)
        if t in engine.tokenizer.eos_token_ids:
            break
        out.append(t)
    return out


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tiny_llama, tiny_qwen2, tiny_llama_other):
    """(plain engine, engine drafting with the target's own q4 quantization, engine drafting with other weights)."""
    target = str(tiny_llama if request.param == "llama" else tiny_qwen2)
    plain = Engine.load(target)
    q4 = Engine.load(target, draft=target, draft_quantize="q4g32")
    other = Engine.load(str(tiny_llama), draft=str(tiny_llama_other)) if request.param == "llama" else None
    return plain, q4, other


def test_plain_loop_matches_mlx_lm(pair):
    plain = pair[0]
    for prompt in PROMPTS[:3]:
        assert run(plain, prompt, max_tokens=40)[0] == mlx_lm_greedy(plain, prompt, 40)


def speculate_always(engine: Engine) -> None:
    """Tell the adaptive controller plain steps are very slow, so it keeps drafting and only adapts k."""
    engine.costs = CostModel()
    engine.costs.add(0, 1e3)


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed-k", "adaptive-k"])
@pytest.mark.parametrize("k", range(1, 9))
def test_speculative_equals_plain(pair, k, adaptive):
    plain, q4, other = pair
    for prompt in PROMPTS:
        expected = run(plain, prompt, max_tokens=48)[0]
        for engine in (q4, other):
            if engine is None:
                continue
            if adaptive:
                speculate_always(engine)
            tokens, _, last = run(engine, prompt, max_tokens=48, draft_length=k, adaptive=adaptive)
            assert tokens == expected, (prompt, k, engine.info["draft"])
            assert last.stats.drafted > 0


def test_draft_actually_helps_and_statistics_add_up(pair):
    _, q4, _ = pair
    tokens, _, last = run(q4, PROMPTS[0], max_tokens=64, draft_length=4, adaptive=False)
    s = last.stats
    assert s.accepted > 0, "the q4 self-draft should agree with its fp32 target at least sometimes"
    assert s.generated_tokens == len(tokens) == 64
    # every pass yields the accepted drafts plus one token of the target's own (the last pass may be cut)
    assert s.accepted + s.rounds >= s.generated_tokens
    assert s.accepted_per_position[0] >= s.accepted_per_position[-1]
    assert sum(s.accepted_per_position) == s.accepted and sum(s.drafted_per_position) == s.drafted
    assert s.host_syncs == s.rounds
    assert s.mean_accepted_length == pytest.approx(64 / s.rounds)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 6, 7, 11, 13])
def test_max_tokens_landing_mid_block(pair, max_tokens):
    plain, q4, _ = pair
    full = run(plain, PROMPTS[0], max_tokens=20)[0]
    tokens, _, last = run(q4, PROMPTS[0], max_tokens=max_tokens, draft_length=4, adaptive=False)
    assert tokens == full[:max_tokens]
    assert last.finish_reason == "length"


def test_eos_inside_a_drafted_block(pair):
    """Make a token of the plain output the EOS: spec must stop right before it, as plain does."""
    plain, q4, _ = pair
    full = run(plain, PROMPTS[0], max_tokens=40)[0]
    tok = q4.tokenizer
    saved = set(tok.eos_token_ids)
    hits = 0
    try:
        firsts = [i for i, t in enumerate(full) if full.index(t) == i and i >= 2]
        for pos in firsts[:8]:
            eos = full[pos]
            cut = full[:pos]
            tok.eos_token_ids = {eos}
            plain.tokenizer.eos_token_ids = {eos}
            for k in (2, 4, 7):
                tokens, _, last = run(q4, PROMPTS[0], max_tokens=40, draft_length=k, adaptive=False)
                assert tokens == cut
                assert last.finish_reason == "stop"
                # the EOS came from the draft, not as the pass's own last token, when fewer
                # tokens were emitted than the last pass produced
                hits += last.stats.accepted + last.stats.rounds > len(cut) + 1
    finally:
        tok.eos_token_ids = saved
        plain.tokenizer.eos_token_ids = saved
    assert hits > 0, "no case put EOS inside a drafted block"


def test_stop_strings(pair):
    plain, q4, _ = pair
    tokens, text, _ = run(plain, PROMPTS[0], max_tokens=40)
    assert len(text) > 12
    for start in (3, 8, len(text) // 2):
        stop = text[start : start + 3]
        if not stop.strip():
            continue
        expected = text[: text.index(stop)]
        for engine, k in ((plain, 0), (q4, 3), (q4, 6)):
            t2, text2, last = run(engine, PROMPTS[0], max_tokens=40, draft_length=k, stop=[stop, "\x00never"], adaptive=False)
            assert text2 == expected
            assert last.finish_reason == "stop"
            assert t2 == tokens[: len(t2)]
