"""The acceptance rules as pure functions, against their closed forms."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.sampling import sample
from mlxspec.verify import accept_equal, greedy_accept, leading_true, rejection_accept

V = 6


def test_leading_true():
    assert leading_true(mx.array([True, True, False, True])).item() == 2
    assert leading_true(mx.array([False, True])).item() == 0
    assert leading_true(mx.array([True, True, True])).item() == 3


def test_greedy_accept_keeps_the_agreeing_prefix_and_adds_the_target_token():
    logits = mx.array(np.eye(V, dtype=np.float32)[[3, 1, 4, 2]])  # target argmax per row: 3, 1, 4, 2
    for drafts, n, nxt in (([3, 1, 4], 3, 2), ([3, 1, 0], 2, 4), ([0, 1, 4], 0, 3), ([3, 0, 4], 1, 1)):
        got_n, got_next = greedy_accept(logits, mx.array(drafts))
        assert (got_n.item(), got_next.item()) == (n, nxt)
    got_n, got_next = greedy_accept(logits[:1], mx.array([], dtype=mx.uint32))
    assert (got_n.item(), got_next.item()) == (0, 3)


def _rows(seed: int, k: int):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(V) * 0.7, size=k + 1).astype(np.float32)
    q = rng.dirichlet(np.ones(V) * 0.7, size=k).astype(np.float32)
    return p, q


def _first_tokens(p, q, n_samples, rule, deterministic_draft=None):
    """Sample the first output token of a round n_samples times (drafts drawn from q)."""
    pm, qm = mx.array(p), mx.array(q)
    keys = mx.random.split(mx.random.key(7), n_samples)
    firsts, accepted = [], 0
    for i in range(n_samples):
        kd, kv = mx.random.split(keys[i])
        if deterministic_draft is None:
            drafts = sample(qm, kd).astype(mx.uint32)
            n, nxt = rule(pm, drafts, qm, kv)
        else:
            drafts = mx.array(deterministic_draft, dtype=mx.uint32)
            n, nxt = rule(pm, drafts, None, kv)
        mx.eval(n, nxt, drafts)
        n = n.item()
        accepted += n > 0
        firsts.append(drafts[0].item() if n > 0 else nxt.item())
    return np.bincount(firsts, minlength=V) / n_samples, accepted / n_samples


def test_rejection_sampling_output_is_distributed_as_the_target():
    p, q = _rows(0, 3)
    freq, acc = _first_tokens(p, q, 6000, rejection_accept)
    assert np.abs(freq - p[0]).max() < 0.03, (freq, p[0])
    # acceptance of the first draft is sum(min(p, q)) (Leviathan et al., section 3.3)
    assert acc == pytest.approx(np.minimum(p[0], q[0]).sum(), abs=0.03)


def test_deterministic_draft_is_accepted_with_its_target_probability():
    p, q = _rows(1, 2)
    freq, acc = _first_tokens(p, q, 5000, rejection_accept, deterministic_draft=[2, 5])
    assert np.abs(freq - p[0]).max() < 0.03
    assert acc == pytest.approx(p[0][2], abs=0.03)


def test_our_rule_accepts_more_than_mlx_lms_equality_rule():
    """mlx-lm keeps a draft only if it equals the target's own sample: sum(p*q) < sum(min(p, q))."""
    p, q = _rows(2, 3)
    wrapped_equal = lambda pm, d, qm, key: accept_equal(pm, d, key)  # noqa: E731
    _, ours = _first_tokens(p, q, 4000, rejection_accept)
    freq_eq, theirs = _first_tokens(p, q, 4000, wrapped_equal)
    assert theirs == pytest.approx((p[0] * q[0]).sum(), abs=0.03)
    assert ours > theirs + 0.1
    assert np.abs(freq_eq - p[0]).max() < 0.03  # theirs is exact too, only wasteful


def test_no_residual_mass_falls_back_to_the_target():
    """p == q: every draft is kept in theory; rounding may still reject, then draw from p."""
    p = mx.array([[0.5, 0.5, 0, 0, 0, 0]] * 2, dtype=mx.float32)
    n, nxt = rejection_accept(p, mx.array([1], dtype=mx.uint32), p[:1], mx.random.key(0))
    assert n.item() == 1 and nxt.item() in (0, 1)
