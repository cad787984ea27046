"""Logprobs of emitted tokens (mlxspec.logprobs): speculation reports exactly what plain decoding
reports, and every value is the log softmax of the target's own logits at that position."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.cache import new_cache
from mlxspec.engine import Engine

from mlxspec.logprobs import LogprobRows
from mlxspec.options import GenerateOptions, OptionsError

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat sat on the"


def generate(engine: Engine, prompt, **options):
    """(tokens, logprobs, events) of one generation."""
    tokens, logprobs, events = [], [], []
    for event in engine.generate(prompt, GenerateOptions(**options)):
        assert len(event.logprobs) == (len(event.tokens) if options.get("logprobs") is not None else 0)
        tokens += event.tokens
        logprobs += event.logprobs
        events.append(event)
    return tokens, logprobs, events


def full_logprobs(engine: Engine, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """log softmax of the target's logits at every emitted position, as plain decoding computes them: prompt[:-1]
    in one pass (decode.py), then one token a step (on a GPU, MLX's ops give an M-row pass other bits than M
    one-row steps: one pass over it all differed from plain decoding by 3e-4 on an H100)."""
    model, cache = engine.target.model, new_cache(engine.target.model)
    model(mx.array([prompt[:-1]]), cache=cache)
    steps = [model(mx.array([[t]]), cache=cache)[0, -1] for t in [prompt[-1]] + tokens[:-1]]
    logits = mx.stack(steps).astype(mx.float32)
    return np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))


@pytest.fixture(scope="module")
def engines(tiny_llama):
    return Engine.load(str(tiny_llama)), Engine.load(str(tiny_llama), drafter="lookup")


def test_speculation_reports_plain_decodings_logprobs_bit_for_bit(engines):
    plain, lookup = engines
    want_tokens, want, _ = generate(plain, PROMPT, max_tokens=40, logprobs=3)
    tokens, got, events = generate(lookup, PROMPT, max_tokens=40, logprobs=3, draft_length=4, adaptive=False)
    assert tokens == want_tokens and events[-1].stats.drafted > 0 and events[-1].stats.accepted > 0
    assert got == want  # token, value and the three alternatives, as floats
    assert [lp.token for lp in got] == tokens
    for lp in got:  # greedy: the token is the most likely one, and the alternatives come in order
        assert lp.top[0] == (lp.token, lp.logprob) and len(lp.top) == 3
        assert lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]


@pytest.mark.parametrize("draft_length", [0, 4])
def test_logprobs_are_the_targets_own_distribution(engines, draft_length):
    """Sampled, with a repeat penalty and a temperature: the reported values are the model's log softmax
    (before penalties, temperature and filters), as llama.cpp's server and so Ollama report them."""
    plain, lookup = engines
    prompt = plain.encode(PROMPT)
    engine = lookup if draft_length else plain
    tokens, got, _ = generate(engine, prompt, max_tokens=30, logprobs=2, temperature=0.9, top_k=20, seed=5,
                              repeat_penalty=1.3, draft_length=draft_length, adaptive=False)
    reference = full_logprobs(plain, prompt, tokens)
    np.testing.assert_allclose([lp.logprob for lp in got], reference[np.arange(len(tokens)), tokens], atol=1e-5)
    for lp, row in zip(got, reference):
        best = np.argsort(-row)[:2]
        assert [t for t, _ in lp.top] == best.tolist()
        np.testing.assert_allclose([v for _, v in lp.top], row[best], atol=1e-5)


def test_logprobs_stop_where_the_tokens_stop(engines):
    """A stop string and a token limit cut the logprobs with the tokens; without logprobs there are none."""
    plain, lookup = engines
    full, _, _ = generate(plain, PROMPT, max_tokens=12)
    stop = plain.tokenizer.decode(full[:7])[len(plain.tokenizer.decode(full[:5])):]  # what tokens 5 and 6 write
    assert stop.strip()
    for engine in engines:
        tokens, logprobs, events = generate(engine, PROMPT, max_tokens=12, stop=[stop], logprobs=0,
                                            draft_length=3 if engine is lookup else 0)
        assert [lp.token for lp in logprobs] == tokens and all(lp.top == [] for lp in logprobs)
        assert events[-1].stats.generated_tokens == len(tokens) < 12
    _, none, _ = generate(lookup, PROMPT, max_tokens=5)
    assert none == []


def test_rows_read_and_a_bad_count():
    logits = mx.array([[0.0, 1.0, 2.0], [2.0, 0.0, 0.0]])
    rows = LogprobRows.of(logits, mx.array([1, 0]), 2)
    mx.eval(*rows.arrays)
    first, second = rows.read(2)
    assert first.token == 1 and abs(first.logprob - (1 - np.log(np.exp([0, 1, 2]).sum()))) < 1e-6
    assert [t for t, _ in first.top] == [2, 1] and second.top[0][0] == 0
    assert len(rows.read(1)) == 1
    with pytest.raises(OptionsError, match="logprobs"):
        GenerateOptions(logprobs=21)
    with pytest.raises(OptionsError, match="unknown option 'logprobs'"):  # a request field, not an option
        GenerateOptions.from_dict({"logprobs": 3})
