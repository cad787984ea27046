"""Sampling exactness end to end: speculative sampling draws sequences from the target's law.

On a tiny vocabulary the exact probability of every 3-token continuation is computable from the
target alone (product of its per-position distributions after the same filters). Generated
sequences with speculation must fit it (chi-square); a deliberately wrong rule must not.
"""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest
from model_factory import build_model
from scipy.stats import chisquare

import mlxspec.rounds as rounds
from mlxspec.decode import Decoder
from mlxspec.drafters import Draft, Drafter, ModelDrafter, NoDrafter
from mlxspec.options import GenerateOptions
from mlxspec.sampling import Sampling, probabilities, sample
from mlxspec.stats import Stats
from mlxspec.verify import leading_true

V, PROMPT, LENGTH = 4, [0, 1, 2, 3, 1], 3
CONFIG = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-5,
    "vocab_size": V,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def models():
    return build_model(CONFIG, seed=3, scale=0.8), build_model(CONFIG, seed=4, scale=0.8)


class FixedDrafter(Drafter):
    """A deterministic drafter (like prompt lookup): always proposes the same tokens."""

    name = "fixed"

    def propose(self, context, k, sampling, key):
        guess = [2, 0, 1, 3][:k]
        return Draft(mx.array(guess, dtype=mx.uint32), None, len(guess))


def generate(target, drafter, options: GenerateOptions, k: int):
    stats = Stats()
    dec = Decoder(target, drafter, PROMPT, options, draft_length=k, eos_ids=set(), context_length=64, stats=stats)
    return [t for r in dec for t in r.tokens], stats


def exact_law(target, options: GenerateOptions) -> dict[tuple, float]:
    """P(t1, t2, t3) under plain sampling from the target with these options."""
    s = Sampling.from_options(options)
    law = {}
    for seq in itertools.product(range(V), repeat=LENGTH):
        ids = mx.array(PROMPT + list(seq[:-1]))[None]
        rows = target(ids)[0, len(PROMPT) - 1 :]  # (LENGTH, V): the distribution at each new position
        if options.repeat_penalty != 1.0:
            from mlxspec.sampling import penalize

            rows = mx.concatenate(
                [
                    penalize(rows[i : i + 1], PROMPT + list(seq[:i]), None, options.repeat_penalty, -1)
                    for i in range(LENGTH)
                ]
            )
        probs = np.array(probabilities(rows, s))
        law[seq] = float(np.prod([probs[i, t] for i, t in enumerate(seq)]))
    return law


def fit(target, drafter, options_kwargs, k=2, n=1500):
    """Chi-square p-value of n speculative samples against the exact law (cells pooled to >= 5)."""
    counts: dict[tuple, int] = {}
    accepted = drafted = 0
    for seed in range(n):
        tokens, stats = generate(target, drafter, GenerateOptions(max_tokens=LENGTH, seed=seed, **options_kwargs), k)
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
        accepted, drafted = accepted + stats.accepted, drafted + stats.drafted
    law = exact_law(target, GenerateOptions(**options_kwargs))
    cells = sorted(law, key=law.get, reverse=True)
    obs, exp = [], []
    for cell in cells:  # pool the rare tail into one cell so every expected count is >= 5
        if law[cell] * n >= 5:
            obs.append(counts.get(cell, 0))
            exp.append(law[cell] * n)
    obs.append(n - sum(obs))
    exp.append(n - sum(exp))
    if exp[-1] < 1e-6:
        obs, exp = obs[:-1], exp[:-1]
    exp = np.array(exp) * sum(obs) / sum(exp)  # float32 probabilities sum to 1 only up to rounding
    assert sum(c for cell, c in counts.items() if law[cell] == 0) == 0, "drew a sequence the target forbids"
    return chisquare(obs, exp).pvalue, accepted / max(drafted, 1)


SETTINGS = [
    {"temperature": 1.0},
    {"temperature": 1.0, "top_k": 3, "top_p": 0.95, "min_p": 0.05},
    {"temperature": 1.3, "repeat_penalty": 1.5, "repeat_last_n": -1},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=["plain", "filters", "penalty"])
def test_draft_model_sampling_matches_target_law(models, settings):
    target, draft = models
    pvalue, acceptance = fit(target, ModelDrafter(draft), settings)
    assert pvalue > 1e-3
    assert acceptance > 0.2  # drafts were really in play


def test_deterministic_drafter_sampling_matches_target_law(models):
    target, _ = models
    pvalue, acceptance = fit(target, FixedDrafter(), {"temperature": 1.0})
    assert pvalue > 1e-3 and acceptance > 0.05


def test_plain_sampling_matches_target_law(models):
    pvalue, _ = fit(models[0], NoDrafter(), {"temperature": 1.0}, k=0)
    assert pvalue > 1e-3


def test_a_wrong_rule_is_caught(models, monkeypatch):
    """Resampling from p (not the residual max(0, p - q)) biases the output: the test must see it."""

    def wrong(p, drafts, q, key):
        k = drafts.shape[0]
        ka, kb = mx.random.split(key)
        if k == 0:
            return mx.array(0), sample(p[0], kb)
        idx = drafts.astype(mx.int32)[:, None]
        p_d = mx.take_along_axis(p[:k], idx, axis=-1)[:, 0]
        q_d = mx.take_along_axis(q, idx, axis=-1)[:, 0]
        n = leading_true(mx.random.uniform(shape=(k,), key=ka) * q_d < p_d)
        return n, sample(p[n], kb)

    monkeypatch.setattr(rounds, "rejection_accept", wrong)
    target, draft = models
    pvalue, _ = fit(target, ModelDrafter(draft), {"temperature": 1.0})
    assert pvalue < 1e-3


def test_seed_makes_a_run_reproducible(models):
    target, draft = models
    opts = dict(max_tokens=12, temperature=1.0, seed=1234)
    a, _ = generate(target, ModelDrafter(draft), GenerateOptions(**opts), 3)
    b, _ = generate(target, ModelDrafter(draft), GenerateOptions(**opts), 3)
    c, _ = generate(target, ModelDrafter(draft), GenerateOptions(**{**opts, "seed": 99}), 3)
    assert a == b and len(a) == 12
    assert a != c


def test_confidence_cut_drafts_keep_the_target_law(models):
    """Stopping a proposal on the draft's own confidence depends only on drafted tokens: still exact."""
    target, draft = models
    drafter = ModelDrafter(draft, min_confidence=0.4)
    pvalue, _ = fit(target, drafter, {"temperature": 1.0}, k=3)
    assert pvalue > 1e-3 and drafter.syncs > 0


def test_a_repeat_window_past_the_context_is_the_whole_context(models):
    """repeat_last_n beyond any context (the fuzz test sent 4e17) penalises like -1, no error."""
    target, _ = models
    opts = dict(max_tokens=6, repeat_penalty=1.5)
    huge, _ = generate(target, NoDrafter(), GenerateOptions(**opts, repeat_last_n=403375854678179968), 0)
    whole, _ = generate(target, NoDrafter(), GenerateOptions(**opts, repeat_last_n=-1), 0)
    assert huge == whole and len(huge) == 6


class Remembering(Drafter):
    """Prompt lookup whose memory keeps every earlier run's sample (finish() runs at the next start)."""

    name = "lookup"

    def __init__(self):
        from mlxspec.drafters.lookup import LookupDrafter

        self.inner, self.runs = LookupDrafter(), 0

    def start(self, prompt, hidden=None):
        if self.runs:
            self.inner.finish()
        self.runs += 1
        self.inner.start(prompt)

    def propose(self, context, k, sampling, key):
        return self.inner.propose(context, k, sampling, key)


def test_lookup_drafting_from_its_memory_of_earlier_samples_keeps_the_target_law(models):
    """The memory changes with every run (drafts depend on earlier samples, never on this run's)."""
    drafter = Remembering()
    pvalue, acceptance = fit(models[0], drafter, {"temperature": 1.0})
    assert drafter.inner.memory.tokens > 1000  # ~1500 samples of 3 tokens, remembered
    assert pvalue > 1e-3 and acceptance > 0.05
