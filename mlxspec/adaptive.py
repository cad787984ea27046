"""Adaptive speculation: choose each round's draft length so speculation never costs speed.

The expected number of tokens a round yields with per-draft acceptance a and k drafts is
(1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023). The controller measures, while it runs:
  - costs (engine-wide, kept across requests): seconds per plain step and per round drafting k,
    a table per k, since the cost of an M-row target pass is neither linear nor monotonic on GPUs
    (H100, 8B 4-bit: M=4 23.3 ms, M=8 17.7 ms). An unmeasured k is estimated from its measured
    neighbours; when it looks best it is tried, which measures it;
  - acceptance a (per request, recent rounds weigh more), which is a property of the prompt.
It picks the k with the best expected tokens per second, or plain decoding when no k beats a plain
step. Offered a tree width too (`tree=(width, costs)`, tree.py), it runs a few tree rounds first (only
if a tree could pay: w times the chain's acceptance at the cost of a chain as many rows long),
then weighs trees against chains the same way, with a cost table and an acceptance per width. While plain, it probes one speculative round now and then, spaced so that a probe that
loses costs at most ~2% (acceptance can rise later, e.g. when the answer starts quoting the input).

Driving it: `plan()` is pure (the next round's Plan from the state), `commit(plan)` adopts it
(probe scheduling, back-off count), `record(...)` learns from a finished round.

Output never depends on k (every round is exact). For a seeded sampling run the timing signal is
left out: wall-clock noise must not change which random numbers a reproducible run draws; then k
follows acceptance alone.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


class CostModel:
    """Seconds per plain step and per speculative round, as moving averages per draft length."""

    ALPHA = 0.2

    def __init__(self) -> None:
        self.plain: float | None = None
        self.rounds: dict[int, float] = {}

    def add(self, k: int, seconds: float) -> None:
        if k == 0:
            self.plain = seconds if self.plain is None else (1 - self.ALPHA) * self.plain + self.ALPHA * seconds
        else:
            old = self.rounds.get(k)
            self.rounds[k] = seconds if old is None else (1 - self.ALPHA) * old + self.ALPHA * seconds

    def round_cost(self, k: int, extrapolate: bool = False) -> float | None:
        """Measured cost of a k-round; else interpolated between the nearest measured k below and
        above (flat beyond the ends, or with `extrapolate` growing past the largest measured k as
        between the two largest, never less than flat); None before any round was measured."""
        if k in self.rounds:
            return self.rounds[k]
        if not self.rounds:
            return None
        ks = sorted(self.rounds)
        i = bisect.bisect_left(ks, k)
        if i == len(ks) and extrapolate and len(ks) > 1:
            lo, hi = ks[-2], ks[-1]
            slope = max(0.0, (self.rounds[hi] - self.rounds[lo]) / (hi - lo))
            return self.rounds[hi] + slope * (k - hi)
        if i == 0 or i == len(ks):
            return self.rounds[ks[0] if i == 0 else ks[-1]]
        lo, hi = ks[i - 1], ks[i]
        return self.rounds[lo] + (self.rounds[hi] - self.rounds[lo]) * (k - lo) / (hi - lo)


def expected_tokens(a: float, k: int) -> float:
    """Tokens a round yields on average: accepted drafts plus the target's own token."""
    return k + 1.0 if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True)
class Plan:
    k: int  # the next round's draft length (0: plain)
    why: str  # 'off', 'acceptance' (no timing), 'measure', 'wait' (plain until a probe), 'speculate', 'back-off'
    best: int = 0  # the draft length the estimates favour ('speculate', 'back-off')
    wait: int = 0  # 'back-off': plain rounds before the next probe
    width: int = 1  # 1: a chain of k drafts; > 1: a tree of depth k (tree.py)


class DraftController:
    MARGIN = 0.93  # speculate only when it promises >= 7% more than plain: timing noise must not make it lose
    PROBE_BUDGET = 0.02  # fraction of time a losing probe may cost
    DECAY = 0.9  # weight of older rounds in the acceptance estimate
    TREE_TRIALS = 4  # tree rounds run first, so the tree's acceptance is measured before it is judged

    def __init__(self, k_max: int, costs: CostModel | None = None, prior: float = 0.5,
                 tree: tuple[int, CostModel] | None = None):
        self.k_max = k_max
        self.costs = costs  # None: no timing, k follows acceptance only
        # (width, its cost table): tree rounds may be chosen too, when they promise more per second
        self.tree = tree if tree is not None and costs is not None else None
        self.seen = {1: [2 * prior, 2.0]} | ({self.tree[0]: [2 * prior, 2.0]} if self.tree else {})  # width -> hits, trials
        self.width = 1
        self.tree_rounds = 0
        self.k = k_max
        self.plain_left = 0  # plain rounds before the next probe
        self.probing = False  # the next speculative round is a probe, whatever the estimate says
        self.backoffs = 0  # times speculation was set aside for losing

    @property
    def acceptance(self) -> float:
        """Per-draft acceptance of chain rounds (of tree rounds: `acceptance_of(width)`)."""
        return self.acceptance_of(1)

    def acceptance_of(self, width: int) -> float:
        """A tree's favourite path is the chain, so its per-depth acceptance is at least the chain's."""
        hits, trials = self.seen[width]
        return hits / trials if width == 1 else max(hits / trials, self.acceptance_of(1))

    def plan(self) -> Plan:
        """The next round's plan from the current state; changes nothing."""
        costs = self.costs
        if self.k_max == 0:
            return Plan(0, "off")
        if costs is None:
            return Plan(self.k, "acceptance")
        if costs.plain is None:
            return Plan(0, "measure")  # a plain step first
        for k in (self.k_max, 1):  # then two draft lengths, so the table has something to interpolate
            if len(costs.rounds) < 2 and k not in costs.rounds:
                return Plan(k, "measure")
        if self.tree and self.tree_rounds < self.TREE_TRIALS and self._tree_may_pay():
            return Plan(self.k_max, "measure", width=self.tree[0])  # a few tree rounds, at the full depth
        if self.plain_left > 0:
            return Plan(0, "wait")
        widths = [w for w in self.seen if w == 1 or self.tree_rounds >= self.TREE_TRIALS]  # trees once measured
        width, best = max(((w, k) for w in widths for k in range(1, self.k_max + 1)), key=lambda o: self._rate(*o))
        if self.probing or self._rate(width, best) * costs.plain >= 1.0 / self.MARGIN:
            return Plan(best, "speculate", best, width=width)
        # Losing: go plain, and come back for one probe once it costs at most PROBE_BUDGET.
        loss = self._table(width).round_cost(best) - expected_tokens(self.acceptance_of(width), best) * costs.plain
        return Plan(0, "back-off", best, max(4, int(loss / (self.PROBE_BUDGET * costs.plain))), width)

    def commit(self, plan: Plan) -> None:
        """The next round runs `plan`: a speculative round consumes a pending probe; backing off
        schedules the next one."""
        if plan.why == "speculate":
            self.probing, self.k, self.width = False, plan.best, plan.width
        elif plan.why == "back-off":
            self.plain_left, self.probing, self.k, self.width = plan.wait, True, plan.best, plan.width
            self.backoffs += 1

    def _tree_may_pay(self) -> bool:
        """Could the tree pay at all, given what chains showed? Taken at w times the chain's acceptance
        (capped at 1) and at the cost of a chain as many rows long (extrapolated from the chain
        table): where even that loses (a CPU, where rows cost), its trial rounds would only cost."""
        w, k = self.tree[0], self.k_max
        cost = self.costs.round_cost(k * w, extrapolate=True)
        rate = expected_tokens(min(1.0, w * self.acceptance_of(1)), k) / cost
        return rate * self.costs.plain >= 1.0 / self.MARGIN

    def _table(self, width: int) -> CostModel:
        return self.tree[1] if width > 1 else self.costs

    def _rate(self, width: int, k: int) -> float:
        return expected_tokens(self.acceptance_of(width), k) / self._table(width).round_cost(k)

    def record(self, drafted: int, accepted: int, seconds: float, width: int = 1) -> None:
        """A round finished: `drafted` proposed (a tree: its depth), `accepted` kept, in `seconds`."""
        if self.costs is not None:
            (self._table(width) if drafted else self.costs).add(drafted, seconds)
        if drafted == 0:
            self.plain_left = max(0, self.plain_left - 1)
            return
        # Each kept draft is a success; the first rejected one (if any) a failure.
        seen = self.seen[width]
        self.tree_rounds += width > 1
        seen[0] = self.DECAY * seen[0] + accepted
        seen[1] = self.DECAY * seen[1] + accepted + (accepted < drafted)
        if self.costs is None:  # acceptance-only rule
            if accepted == drafted:
                self.k = min(self.k + 1, self.k_max)
            elif accepted < drafted / 2:
                self.k = max(self.k - 1, 1)
