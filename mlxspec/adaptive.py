"""Adaptive speculation: choose each round's draft length so speculation never costs speed.

The expected number of tokens a round yields with per-draft acceptance a and k drafts is
(1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023). The controller measures, while it runs:
  - costs (engine-wide, kept across requests): seconds per plain step and per round drafting k,
    a table per k, since the cost of an M-row target pass is neither linear nor monotonic on GPUs
    (H100, 8B 4-bit: M=4 23.3 ms, M=8 17.7 ms). An unmeasured k is estimated from its measured
    neighbours; when it looks best it is tried, which measures it;
  - acceptance a (per request, recent rounds weigh more), which is a property of the prompt; for
    chains also per draft position (the share of drafts kept at position i when position i-1 was),
    since a drafter right once is often right again (lookup on SmolLM2 free-form: about 0.5 kept
    at position 1, 0.65-0.9 after), which a single a underrates. Positions with few rounds lean
    on the single estimate.
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
    """Seconds per plain step and per speculative round, as moving averages per draft length.

    A draft length timed fewer than TRUSTED times is not believed when it looks dearer than the
    well-timed lengths (two at least) say, interpolated or extended as a line: one slow first
    round (a new row count's first pass, a noisy moment; SmolLM2 on this CPU: a 4-draft round once
    timed 16.3 ms, steadily 11.5) would otherwise price that length out for good, since a length
    that is never chosen is never timed again."""

    ALPHA = 0.2
    TRUSTED = 3  # rounds timed before a draft length's own average is taken as it is

    def __init__(self) -> None:
        self.plain: float | None = None
        self.rounds: dict[int, float] = {}
        self.timed: dict[int, int] = {}  # draft length -> rounds timed

    def add(self, k: int, seconds: float) -> None:
        if k == 0:
            self.plain = seconds if self.plain is None else (1 - self.ALPHA) * self.plain + self.ALPHA * seconds
            return
        old, timed = self.rounds.get(k), self.timed.get(k, 0)
        if old is None or timed < self.TRUSTED:  # the first few: the fastest (noise only adds time)
            self.rounds[k] = seconds if old is None else min(old, seconds)
        else:
            self.rounds[k] = (1 - self.ALPHA) * old + self.ALPHA * seconds
        self.timed[k] = timed + 1

    def round_cost(self, k: int, extrapolate: bool = False) -> float | None:
        """Measured cost of a k-round (at most what the well-timed lengths around it suggest, until
        it is well timed itself); else interpolated between the nearest measured k below and above
        (flat beyond the ends, or with `extrapolate` growing past the largest measured k as between
        the two largest, never less than flat); None before any round was measured."""
        trusted = {j: c for j, c in self.rounds.items() if self.timed.get(j, 0) >= self.TRUSTED}
        table = {j: c if j in trusted or len(trusted) < 2 else min(c, _between(trusted, j, True))
                 for j, c in self.rounds.items()}
        return table[k] if k in table else _between(table, k, extrapolate)


def _between(table: dict[int, float], k: int, extrapolate: bool) -> float | None:
    """table[k] interpolated from the nearest keys below and above (see CostModel.round_cost)."""
    if not table:
        return None
    ks = sorted(table)
    i = bisect.bisect_left(ks, k)
    if i == len(ks) and extrapolate and len(ks) > 1:
        lo, hi = ks[-2], ks[-1]
        slope = max(0.0, (table[hi] - table[lo]) / (hi - lo))
        return table[hi] + slope * (k - hi)
    if i == 0 or i == len(ks):
        return table[ks[0] if i == 0 else ks[-1]]
    lo, hi = ks[i - 1], ks[i]
    return table[lo] + (table[hi] - table[lo]) * (k - lo) / (hi - lo)


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
    SHRINK = 2.0  # rounds' worth of weight the single estimate has in each position's estimate

    def __init__(self, k_max: int, costs: CostModel | None = None, prior: float = 0.5,
                 tree: tuple[int, CostModel] | None = None):
        self.k_max = k_max
        self.costs = costs  # None: no timing, k follows acceptance only
        # (width, its cost table): tree rounds may be chosen too, when they promise more per second
        self.tree = tree if tree is not None and costs is not None else None
        self.seen = {1: [2 * prior, 2.0]} | ({self.tree[0]: [2 * prior, 2.0]} if self.tree else {})  # width -> hits, trials
        self.positions = [[0.0, 0.0] for _ in range(k_max)]  # chain draft i: kept, tried (when i-1 was kept)
        self.width = 1
        self.tree_rounds = 0
        self.k = k_max
        self.plain_left = 0  # plain rounds before the next probe
        self.probing = False  # the next speculative round is a probe, whatever the estimate says
        self.backoffs = 0  # times speculation was set aside for losing
        self.hints = 0  # back-offs cut short because the drafter had a guess ready

    @property
    def acceptance(self) -> float:
        """Per-draft acceptance of chain rounds (of tree rounds: `acceptance_of(width)`)."""
        return self.acceptance_of(1)

    def acceptance_of(self, width: int) -> float:
        """A tree's favourite path is the chain, so its per-depth acceptance is at least the chain's."""
        hits, trials = self.seen[width]
        return hits / trials if width == 1 else max(hits / trials, self.acceptance_of(1))

    def expected(self, width: int, k: int) -> float:
        """Tokens a round of k drafts (a tree of depth k) should yield: per position for chains."""
        if width > 1:
            return expected_tokens(self.acceptance_of(width), k)
        single, total, reach = self.acceptance_of(1), 1.0, 1.0
        for kept, tried in self.positions[:k]:
            reach *= (kept + self.SHRINK * single) / (tried + self.SHRINK)
            total += reach
        return total

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
        if self.tree and self._tree_trials_left() and self._tree_may_pay():
            return Plan(self.k_max, "measure", width=self.tree[0])  # a few tree rounds, at the full depth
        if self.plain_left > 0:
            return Plan(0, "wait")
        widths = [w for w in self.seen if w == 1 or self._tree_measured()]
        width, best = max(((w, k) for w in widths for k in range(1, self.k_max + 1)), key=lambda o: self._rate(*o))
        if self.probing or self._rate(width, best) * costs.plain >= 1.0 / self.MARGIN:
            return Plan(best, "speculate", best, width=width)
        # Losing: go plain, and come back for one probe once it costs at most PROBE_BUDGET.
        loss = self._table(width).round_cost(best) - self.expected(width, best) * costs.plain
        return Plan(0, "back-off", best, max(4, int(loss / (self.PROBE_BUDGET * costs.plain))), width)

    def commit(self, plan: Plan) -> None:
        """The next round runs `plan`: a speculative round consumes a pending probe; backing off
        schedules the next one."""
        if plan.why == "speculate":
            self.probing, self.k, self.width = False, plan.best, plan.width
        elif plan.why == "back-off":
            self.plain_left, self.probing, self.k, self.width = plan.wait, True, plan.best, plan.width
            self.backoffs += 1

    @property
    def waiting(self) -> bool:
        """Plain rounds are waiting out a back-off (a hint may cut the wait short)."""
        return self.plain_left > 0

    def hint(self) -> None:
        """The drafter has a guess ready (Drafter.has_guess) while plain rounds wait out a back-off:
        probe now rather than on the timer. A losing probe backs off again, as any probe."""
        if self.waiting:
            self.plain_left, self.probing = 0, True
            self.hints += 1

    def _tree_measured(self) -> bool:
        """Trees are weighed once their trials ran and at least one was timed (a round that built a new compiled
        graph is not a timing: on a GPU the first ones may all be such)."""
        return self.tree_rounds >= self.TREE_TRIALS and bool(self.tree[1].rounds)

    def _tree_trials_left(self) -> bool:
        """Trial rounds go on until TREE_TRIALS ran and one was timed, at most twice as many."""
        return self.tree_rounds < self.TREE_TRIALS or (not self.tree[1].rounds
                                                       and self.tree_rounds < 2 * self.TREE_TRIALS)

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
        return self.expected(width, k) / self._table(width).round_cost(k)

    def record(self, drafted: int, accepted: int, seconds: float | None, width: int = 1) -> None:
        """A round finished: `drafted` proposed (a tree: its depth), `accepted` kept, in `seconds`
        (None: not a timing to learn from, e.g. the round built a new compiled step graph)."""
        if self.costs is not None and seconds is not None:
            (self._table(width) if drafted else self.costs).add(drafted, seconds)
        if drafted == 0:
            self.plain_left = max(0, self.plain_left - 1)
            return
        # Each kept draft is a success; the first rejected one (if any) a failure.
        seen = self.seen[width]
        self.tree_rounds += width > 1
        seen[0] = self.DECAY * seen[0] + accepted
        seen[1] = self.DECAY * seen[1] + accepted + (accepted < drafted)
        if width == 1:  # positions 1..accepted kept, the next one (if drafted) tried and lost
            for i, position in enumerate(self.positions[: min(accepted + 1, drafted)]):
                position[0] = self.DECAY * position[0] + (i < accepted)
                position[1] = self.DECAY * position[1] + 1
        if self.costs is None:  # acceptance-only rule
            if accepted == drafted:
                self.k = min(self.k + 1, self.k_max)
            elif accepted < drafted / 2:
                self.k = max(self.k - 1, 1)
