"""Adaptive speculation: the controller's policy on simulated costs, and backing off in the engine."""

from __future__ import annotations

import random
import time

import mlx.core as mx
from test_decode_greedy import run

from mlxspec.adaptive import CostModel, DraftController, expected_tokens
from mlxspec.drafters import Draft, Drafter
from mlxspec.engine import Engine


def simulate(acceptance: float, verify_cost, n_tokens: int = 4000, k_max: int = 6, seed: int = 0) -> float:
    """Simulated time to produce n_tokens with the controller; a plain step costs 1.0.

    verify_cost(k) is the cost of a round that drafts k tokens (drafting + verifying k+1 rows).
    Each draft is kept with probability `acceptance`, independently (the usual i.i.d. model).
    """
    rng = random.Random(seed)
    ctl = DraftController(k_max, CostModel())
    produced, clock = 0, 0.0
    while produced < n_tokens:
        k = ctl.next_k()
        n = 0
        while n < k and rng.random() < acceptance:
            n += 1
        cost = 1.0 if k == 0 else verify_cost(k)
        clock += cost
        produced += n + 1
        ctl.record(k, n, cost)
    return clock * n_tokens / produced


def test_backs_off_when_speculation_loses():
    """The CPU 4-bit case: verifying k+1 rows costs k+1 plain steps. Speculation cannot pay."""
    for acceptance in (0.0, 0.3, 0.6):
        slowdown = simulate(acceptance, lambda k: 1.0 + k * 1.0) / 4000
        assert slowdown <= 1.05, (acceptance, slowdown)  # the promise: never more than 5% slower


def test_keeps_speculating_when_it_pays():
    """Apple GPU-like: verifying k+1 rows costs little more than one step."""
    time_taken = simulate(0.8, lambda k: 1.0 + 0.08 * k)
    assert time_taken < 4000 / 2.0  # more than 2x faster than plain
    always_plain = simulate(0.8, lambda k: 100.0)  # rounds so slow they never pay
    assert always_plain <= 4000 * 1.05


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert abs(expected_tokens(0.5, 2) - 1.75) < 1e-12  # 1 + 0.5 + 0.25


def test_costs_learned_once_serve_later_requests():
    costs = CostModel()
    for k, t in ((0, 1.0), (1, 2.0), (6, 7.0)):
        costs.add(k, t)
    assert abs(costs.round_cost(3) - 4.0) < 1e-9  # fitted line t = 1 + k
    ctl = DraftController(6, costs)
    assert ctl.next_k() == 0 and ctl.backoffs == 1  # known to lose: starts plain, no probing first


def test_draft_length_follows_acceptance():
    ctl = DraftController(6)
    assert ctl.next_k() == 6
    for _ in range(5):
        ctl.record(ctl.next_k(), 0, 1.0)
    assert ctl.next_k() == 1
    for _ in range(3):
        ctl.record(ctl.next_k(), ctl.next_k(), 1.0)
    assert ctl.next_k() == 4
    ctl.record(4, 1, 1.0)  # fewer than half kept
    assert ctl.next_k() == 3


def test_no_timing_means_no_backoff():
    ctl = DraftController(4)
    for _ in range(50):
        k = ctl.next_k()
        assert k > 0
        ctl.record(k, 0, 10.0)
    assert ctl.backoffs == 0


class WrongAndSlowDrafter(Drafter):
    """Always proposes a token the target will not pick, and takes its time doing it."""

    name = "wrong"

    def propose(self, context, k, sampling, key):
        time.sleep(0.004)
        return Draft(mx.array([context[-1]] * k, dtype=mx.uint32), None, k)


def test_engine_backs_off_a_losing_drafter_and_stays_exact(tiny_llama):
    plain = Engine.load(str(tiny_llama))
    losing = Engine(plain.target, WrongAndSlowDrafter(), None, 4)
    tokens, _, last = run(losing, "Once upon a time", max_tokens=120)
    assert tokens == run(plain, "Once upon a time", max_tokens=120)[0]
    s = last.stats
    assert s.backoffs >= 1
    assert s.drafted < 4 * 20  # most rounds ran plain
    fixed = run(losing, "Once upon a time", max_tokens=40, adaptive=False)[2].stats
    assert fixed.backoffs == 0 and fixed.drafted >= 4 * (fixed.rounds - 4)  # adaptive=False: drafts every round
