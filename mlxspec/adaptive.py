"""Adaptive speculation: choose each round's draft length so speculation never costs speed.

The expected number of tokens a round yields with per-draft acceptance a and k drafts is
(1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023). The controller measures, while it runs:
  - costs (engine-wide, kept across requests): seconds per plain step and per round drafting k,
    fitted as t(k) = t0 + t1*k, which is a property of the machine, model and drafter;
  - acceptance a (per request, recent rounds weigh more), which is a property of the prompt.
It picks the k with the best expected tokens per second, or plain decoding when no k beats a plain
step. While plain, it probes one speculative round now and then, spaced so that a probe that
loses costs at most ~2% (acceptance can rise later, e.g. when the answer starts quoting the input).

Output never depends on k (every round is exact). For a seeded sampling run the timing signal is
left out: wall-clock noise must not change which random numbers a reproducible run draws; then k
follows acceptance alone.
"""

from __future__ import annotations


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

    def round_cost(self, k: int) -> float | None:
        """Measured cost of a k-round, else the least-squares line through the measured ones."""
        if k in self.rounds:
            return self.rounds[k]
        if len(self.rounds) < 2:
            return None
        ks, ts = list(self.rounds), list(self.rounds.values())
        mk, mt = sum(ks) / len(ks), sum(ts) / len(ts)
        slope = sum((x - mk) * (y - mt) for x, y in zip(ks, ts)) / sum((x - mk) ** 2 for x in ks)
        return max(mt + slope * (k - mk), 1e-9)


def expected_tokens(a: float, k: int) -> float:
    """Tokens a round yields on average: accepted drafts plus the target's own token."""
    return k + 1.0 if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


class DraftController:
    MARGIN = 0.93  # speculate only when it promises >= 7% more than plain: timing noise must not make it lose
    PROBE_BUDGET = 0.02  # fraction of time a losing probe may cost
    DECAY = 0.9  # weight of older rounds in the acceptance estimate

    def __init__(self, k_max: int, costs: CostModel | None = None, prior: float = 0.5):
        self.k_max = k_max
        self.costs = costs  # None: no timing, k follows acceptance only
        self.hits, self.trials = 2 * prior, 2.0  # pseudo-counts of a prior acceptance
        self.k = k_max
        self.plain_left = 0  # plain rounds before the next probe
        self.probing = False  # the next speculative round is a probe, whatever the estimate says
        self.backoffs = 0  # times speculation was set aside for losing

    @property
    def acceptance(self) -> float:
        return self.hits / self.trials

    def next_k(self) -> int:
        if self.k_max == 0:
            return 0
        if self.costs is None:
            return self.k
        if self.costs.plain is None:
            return 0  # measure a plain step first
        for k in (self.k_max, 1):  # measure two draft lengths to fit t(k)
            if self.costs.round_cost(k) is None:
                return k
        if self.plain_left > 0:
            return 0
        best = max(range(1, self.k_max + 1), key=self._rate)
        if self.probing or self._rate(best) * self.costs.plain >= 1.0 / self.MARGIN:
            self.probing = False
            self.k = best
            return best
        # Losing: go plain, and come back for one probe once it costs at most PROBE_BUDGET.
        loss = self.costs.round_cost(best) - expected_tokens(self.acceptance, best) * self.costs.plain
        self.plain_left = max(4, int(loss / (self.PROBE_BUDGET * self.costs.plain)))
        self.probing = True
        self.backoffs += 1
        self.k = best
        return 0

    def _rate(self, k: int) -> float:
        return expected_tokens(self.acceptance, k) / self.costs.round_cost(k)

    def record(self, drafted: int, accepted: int, seconds: float) -> None:
        """A round finished: `drafted` proposed, `accepted` kept, in `seconds` wall time."""
        if self.costs is not None:
            self.costs.add(drafted, seconds)
        if drafted == 0:
            self.plain_left = max(0, self.plain_left - 1)
            return
        # Each kept draft is a success; the first rejected one (if any) a failure.
        self.hits = self.DECAY * self.hits + accepted
        self.trials = self.DECAY * self.trials + accepted + (accepted < drafted)
        if self.costs is None:  # acceptance-only rule
            if accepted == drafted:
                self.k = min(self.k + 1, self.k_max)
            elif accepted < drafted / 2:
                self.k = max(self.k - 1, 1)
