"""mlxspec.sampling: the filters computed on the top-k candidates are mlx-lm's filters over the whole
vocabulary (same kept tokens, same probabilities), and `sample` draws from the rows it is given."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

from benchmark_scripts import load

from mlxspec.sampling import Sampling, probabilities, sample


def mlx_lm_probabilities(logits: mx.array, s: Sampling) -> mx.array:
    """The definition: mlx-lm's filters in mlx-lm's order over the vocabulary, then temperature."""
    return mx.softmax(load("bench_sampling").mlx_lm_filtered(logits, s) / s.temperature, axis=-1)


SETTINGS = [Sampling(0.8), Sampling(0.8, 40, 0.9), Sampling(1.0, 0, 0.9), Sampling(0.7, 40, 1.0, 0.05),
            Sampling(1.3, 5, 0.5, 0.1), Sampling(1.0, 3, 0.999), Sampling(0.5, 200, 0.95, 0.01)]


@pytest.mark.parametrize("s", SETTINGS, ids=str)
def test_candidate_filters_are_mlx_lms_filters(s):
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal(5000) * 3,  # a spread-out distribution
            np.round(rng.standard_normal(5000), 1),  # many ties, at the cut too
            np.where(np.arange(5000) % 997 == 0, rng.standard_normal(5000), -np.inf),  # a grammar's mask: 6 allowed
            np.r_[8.0, 7.5, rng.standard_normal(4998)]]  # a confident one
    logits = mx.array(np.stack(rows).astype(np.float32))
    got, want = np.array(probabilities(logits, s)), np.array(mlx_lm_probabilities(logits, s))
    assert ((got > 0) == (want > 0)).all()  # the same tokens kept
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)


def test_sample_draws_each_row_from_its_own_mass():
    probs = mx.array([[0.5, 0.0, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 0.1, 0.3]])  # the second unnormalized (a residual)
    keys = mx.random.split(mx.random.key(3), 4000)
    draws = np.array(mx.stack([sample(probs, key) for key in keys]))  # (4000, 2)
    for row, want in ((0, [0.5, 0.3, 0.2]), (1, [0.25, 0.75])):
        support = [0, 2, 3] if row == 0 else [3, 4]
        counts = [(draws[:, row] == t).sum() for t in support]
        assert sum(counts) == len(keys)  # never a token of zero probability
        assert chisquare(counts, np.array(want) * len(keys)).pvalue > 1e-3
