"""Real weights: stories260K (target) with its own 4-bit quantization (draft); SmolLM2 GGUF.

Skipped with a reason where the weights are absent (a fresh clone has no ../shared).
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.generate import speculative_generate_step
from mlx_lm.sample_utils import make_sampler
from test_decode_greedy import run

from mlxspec.engine import Engine

STORY_PROMPTS = ["Once upon a time", "Tom and Sue went to the park.", "The little cat"]


@pytest.fixture(scope="module")
def stories_engines(stories):
    plain = Engine.load(str(stories))
    spec = Engine.load(str(stories), draft=str(stories), draft_quantize="q4g32")
    return plain, spec


def test_documented_output(stories_engines):
    _, text, _ = run(stories_engines[0], "Once upon a time", max_tokens=40)
    assert text.startswith(", there was a little girl named Lily. She loved to play outside in the park.")


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
def test_stories_speculative_equals_plain(stories_engines, k):
    plain, spec = stories_engines
    for prompt in STORY_PROMPTS:
        expected = run(plain, prompt, max_tokens=120)[0]
        tokens, _, last = run(spec, prompt, max_tokens=120, draft_length=k, adaptive=False)
        assert tokens == expected
        assert last.stats.acceptance_rate > 0.3  # a real pair that mostly agrees


def test_sampling_accepts_more_than_mlx_lm(stories_engines):
    """At temperature 1, min(1, p/q) keeps far more drafts than mlx-lm's 'equal to my sample' rule."""
    _, spec = stories_engines
    ours = theirs = total_ours = total_theirs = 0
    for seed, prompt in enumerate(STORY_PROMPTS):
        _, _, last = run(spec, prompt, max_tokens=100, temperature=1.0, seed=seed, draft_length=4, adaptive=False)
        ours += last.stats.accepted
        total_ours += last.stats.generated_tokens
        mx.random.seed(seed)
        ids = mx.array(spec.encode(prompt))
        for _, _, from_draft in speculative_generate_step(
            ids, spec.target.model, spec.draft.model, num_draft_tokens=4, max_tokens=100, sampler=make_sampler(1.0)
        ):
            theirs += bool(from_draft)
            total_theirs += 1
    assert ours / total_ours > theirs / total_theirs + 0.15, (ours / total_ours, theirs / total_theirs)


@pytest.mark.slow
def test_smollm2_lookup_greedy_equals_plain(smollm2):
    plain = Engine.load(str(smollm2))
    lookup = Engine.load(str(smollm2), drafter="lookup")
    ids = plain.chat_prompt([{"role": "user", "content": "Repeat exactly: the cat sat on the mat, the cat sat."}])
    expected, text, _ = run(plain, ids, max_tokens=24)
    assert "cat" in text
    tokens, _, last = run(lookup, ids, max_tokens=24, draft_length=4, adaptive=False)
    assert tokens == expected and last.stats.accepted > 0
