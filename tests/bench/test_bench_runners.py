"""Runners: mlx-lm peers produce plain greedy output, and their rounds are rebuilt correctly."""

from __future__ import annotations

import pytest

from mlxspec import loading
from mlxspec.bench.configs import ENGINE, MLX_LM, MLX_LM_SPECULATIVE, Config
from mlxspec.bench.runners import Runners


@pytest.fixture(scope="module")
def runners(tiny_llama):
    target = loading.load(str(tiny_llama))
    return Runners(target, draft=target)  # a draft identical to the target: every draft is kept


@pytest.fixture(scope="module")
def ids(runners):
    return runners.target.tokenizer.encode("Once upon a time")


def test_peers_match_plain_decoding(runners, ids):
    plain = runners.run(Config("plain", ENGINE), ids, 10)
    assert plain.tokens and plain.stats.rounds >= len(plain.tokens)
    assert runners.run(Config("mlx-lm", MLX_LM), ids, 10).tokens == plain.tokens
    assert runners.run(Config("spec", MLX_LM_SPECULATIVE, "draft-model", 3), ids, 10).tokens == plain.tokens


def test_speculative_rounds_rebuilt_from_from_draft_flags(runners, ids):
    run = runners.run(Config("spec", MLX_LM_SPECULATIVE, "draft-model", 3), ids, 10)
    s = run.stats
    assert s.accepted == s.drafted > 0  # the draft is the target itself
    assert s.generated_tokens == len(run.tokens)
    assert len(run.tokens) == 10  # no end-of-sequence within 10 tokens for this model and prompt
    # rounds of 3 kept drafts + the target's token: 4 + 4, then 2 drafts cut by max_tokens
    assert (s.rounds, s.drafted, s.drafted_per_position, s.accepted_per_position) == (3, 8, [3, 3, 2], [3, 3, 2])


def test_runs_are_timed(runners, ids):
    run = runners.run(Config("plain", ENGINE), ids, 6)
    assert run.ttft > 0 and run.decode_seconds > 0
    assert run.decode_tokens == len(run.tokens) - 1  # plain emits one token per event
    assert run.tokens_per_second == pytest.approx(run.decode_tokens / run.decode_seconds)
    assert run.peak_memory > 0


def test_no_run_is_drafted_from_an_earlier_runs_answer(runners, ids):
    """Lookup remembers answers across requests; a benchmark repeat must not draft from its own."""
    config = Config("lookup", ENGINE, "lookup", 4, adaptive=False)
    first = runners.run(config, ids, 24)
    engine = runners.engine("lookup")
    assert engine.drafter.memory.tokens > 0  # the answer was remembered after the run...
    again = runners.run(config, ids, 24)
    assert again.tokens == first.tokens
    assert (again.stats.drafted, again.stats.accepted) == (first.stats.drafted, first.stats.accepted)  # ...not used
