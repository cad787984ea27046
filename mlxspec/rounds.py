"""Round strategies: each runs one target pass and returns an Outcome, all through one `run`.

  PlainRound (k = 0): one token per pass, pipelined: the next plain step is queued from this
                      step's still-lazy token before it is read (building the next graph overlaps
                      the device's work on this one).
  ChainRound (k > 0): the drafter proposes k tokens; the target scores last token + drafts
                      (k+1 rows) in one pass; verification keeps a prefix and adds one token.
  TreeRound (tree.py): a tree of drafts, every node scored in one pass; the same `run(cache,
                      context, k, plan_next)` on the shared Verifier, chosen per round by width.
Every round ends in exactly one host read-back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import mlx.core as mx
import mlx.nn as nn

from .cache import restore, rewind, snapshot
from .drafters.base import Draft, Drafter
from .kernels.accept import fused_greedy_accept, fused_rejection_accept
from .logprobs import LogprobRows, TokenLogprob
from .options import GenerateOptions
from .sampling import Sampling, penalize, probabilities
from .settings import DecodeSettings
from .stats import Stats
from .step_graph import StepGraphs
from .verify import greedy_accept, rejection_accept

# tokens this round adds -> the next round's draft length, or None when no round can follow
PlanNext = Callable[[int], "int | None"]


@dataclass
class Outcome:
    tokens: list[int]  # the kept drafts, then the target's own token
    accepted: int  # kept drafts
    drafted: int
    planned: int | None = None  # the next round's draft length, when this round had to plan it early
    logprobs: list[TokenLogprob] | None = None  # per token, when the options ask for them


class RoundStrategy(Protocol):
    def run(self, cache: list, context: list[int], k: int, plan_next: PlanNext) -> Outcome: ...

    def drop(self, cache: list) -> None:
        """The run ended: take out of the cache any work queued past the last emitted round."""

    def settle(self, cache: list, extra: int) -> None:
        """The run ended `extra` tokens before the end of this strategy's last round (an EOS or a stop string among
        its kept drafts): take those rows out of the cache, as plain decoding would never have fed them."""


class Verifier:
    """What every strategy shares: the target pass, the per-round keys, the acceptance rule."""

    def __init__(self, target: nn.Module, drafter: Drafter, options: GenerateOptions, settings: DecodeSettings,
                 stats: Stats, key: mx.array, constraint=None, steps: StepGraphs | None = None):
        self.target, self.drafter, self.opts, self.stats, self.key = target, drafter, options, stats, key
        self.steps = steps or StepGraphs(target, enabled=False)  # decoding passes: compiled graphs, or eager
        self.sampling = Sampling.from_options(options)
        self.fused = settings.fused_accept
        self.constraint = constraint  # constraints.Constraint: structured output masks every scored row

    def keys(self) -> tuple[mx.array | None, mx.array | None]:
        """This round's (draft key, verify key): one split per round, whatever the round drafts."""
        if self.sampling.greedy:
            return None, None
        self.key, draft_key, verify_key = mx.random.split(self.key, 3)
        return draft_key, verify_key

    def forward(self, x: mx.array, cache: list, history: list[int] | None, drafts: mx.array | None):
        """(R,) ids -> (R, V) logits (repeat-penalised against `history`), (R, H) hidden or None, and
        the model's own logits (before penalties and masks: what logprobs report). Hidden states are
        computed only for a drafter that wants them."""
        if self.drafter.wants_hidden:
            logits, hidden = self.steps(x[None], cache, hidden=self.drafter.wants_features)
            logits, hidden = logits[0], hidden[0]
        else:
            logits, hidden = self.steps(x[None], cache)[0], None
        raw = logits
        if history is not None:
            logits = penalize(logits, history, drafts, self.opts.repeat_penalty, self.opts.repeat_last_n)
        if self.constraint is not None:  # row i: what the grammar allows after the drafts before it
            ids = [] if drafts is None else drafts.tolist()  # a read-back: the grammar runs on the host
            self.stats.host_syncs += drafts is not None
            allowed = mx.array(self.constraint.masks(ids))
            logits = mx.where(allowed[:, : logits.shape[-1]], logits, mx.array(-float("inf"), dtype=logits.dtype))
        return logits, hidden, raw

    def accept(self, logits: mx.array, draft: Draft, verify_key) -> tuple[mx.array, mx.array]:
        """(accepted count, next token), lazy: greedy, or rejection sampling against the draft."""
        if self.sampling.greedy:
            return (fused_greedy_accept if self.fused else greedy_accept)(logits, draft.tokens)
        rule = fused_rejection_accept if self.fused else rejection_accept
        return rule(probabilities(logits, self.sampling), draft.tokens, draft.probs, verify_key)


class PlainRound:
    """k = 0. Queues the next plain step before reading this one's token when it can: not when a
    repeat penalty needs the whole history, nor under a grammar, nor with settings.pipeline off."""

    def __init__(self, v: Verifier, settings: DecodeSettings):
        self.v = v
        opts = v.opts
        self.can_queue = settings.pipeline and (opts.repeat_penalty == 1.0 or opts.repeat_last_n == 0)
        self.can_queue = self.can_queue and v.constraint is None  # a mask needs the grammar state, on the host
        self.queued: tuple | None = None  # (next token, hidden, logprob rows), lazy
        self.before: list = []  # recurrent states before the queued step (cache.snapshot), for drop

    def run(self, cache: list, context: list[int], k: int, plan_next: PlanNext) -> Outcome:
        if self.queued is None:
            self.queued = self._step(cache, mx.array(context[-1:], dtype=mx.uint32), context)
        (nxt, hidden, rows), self.queued = self.queued, None
        planned = plan_next(1) if self.can_queue else None  # the next round's, before this token is known
        if planned == 0:
            self.before = snapshot(cache)  # [] for KV caches alone
            self.queued = self._step(cache, nxt.reshape(1).astype(mx.uint32), None)
        token = int(nxt.item())  # the round's one host synchronisation (logprob rows were queued with it)
        self.v.stats.host_syncs += 1
        self.v.stats.record_round(0, 0)
        if hidden is not None:
            self.v.drafter.accept(0, hidden=hidden)
        return Outcome([token], 0, 0, planned, None if rows is None else rows.read(1))

    def settle(self, cache: list, extra: int) -> None:
        rewind(cache, extra)  # (a plain round yields one token: never past the end)

    def drop(self, cache: list) -> None:
        if self.queued is not None:  # a step queued past the end (EOS, cancel, the caller leaving)
            rewind(cache, 1)
            restore(self.before)  # recurrent states cannot be trimmed: the cache then holds what the request says
            self.queued = None

    def _step(self, cache: list, token: mx.array, history: list[int] | None):
        """Queue one target step on a (1,) token -> (its next token, hidden row, logprob rows), lazy, computing."""
        verify_key = self.v.keys()[1]
        logits, hidden, raw = self.v.forward(token, cache, history, None)
        _, nxt = self.v.accept(logits, Draft.empty(), verify_key)
        top = self.v.opts.logprobs
        rows = None if top is None else LogprobRows.of(raw, nxt.reshape(1), top)
        mx.async_eval(nxt, *([] if rows is None else rows.arrays))
        return nxt, hidden, rows


class ChainRound:
    """k > 0: draft a chain of k tokens, verify k+1 rows in one target pass."""

    def __init__(self, v: Verifier):
        self.v = v
        self.last: tuple[list, mx.array, int] | None = None  # the last round's (states before it, rows, kept)

    def run(self, cache: list, context: list[int], k: int, plan_next: PlanNext) -> Outcome:
        v, drafter, stats = self.v, self.v.drafter, self.v.stats
        draft_key, verify_key = v.keys()
        drafter_syncs = drafter.syncs
        draft = drafter.propose(context, k, v.sampling, draft_key)
        stats.host_syncs += drafter.syncs - drafter_syncs
        x = mx.concatenate([mx.array(context[-1:], dtype=mx.uint32), draft.tokens])  # (1 + kd,)
        saved = snapshot(cache)  # recurrent layers' states (hybrid models): their rows cannot be trimmed
        logits, hidden, raw = v.forward(x, cache, context, draft.tokens)  # (1 + kd, V)
        n, nxt = v.accept(logits, draft, verify_key)
        rows = None
        if v.opts.logprobs is not None:  # row i gives token i: the draft it kept, or (row n) the target's own
            emitted = mx.where(mx.arange(draft.count + 1) < n, mx.concatenate([draft.tokens, nxt.reshape(1)]), nxt)
            rows = LogprobRows.of(raw, emitted.astype(mx.uint32), v.opts.logprobs)
        mx.eval(n, nxt, draft.tokens, *([] if rows is None else rows.arrays))  # the round's one host synchronisation
        stats.host_syncs += 1
        n = int(n.item())
        if saved and n < draft.count:  # back to before the pass, then the kept rows again
            self._again(cache, saved, x, draft.count + 1, n + 1)
        else:
            rewind(cache, draft.count - n)
        self.last = (saved, x, n)
        if hidden is None:
            drafter.accept(n)
        else:  # rows 0..n: the last context token and the kept drafts, whose next tokens are now known
            drafter.accept(n, hidden=hidden[: n + 1])
        stats.record_round(draft.count, n)
        tokens = draft.tokens.tolist()[:n] + [int(nxt.item())]
        return Outcome(tokens, n, draft.count, logprobs=None if rows is None else rows.read(n + 1))

    def settle(self, cache: list, extra: int) -> None:
        saved, x, n = self.last  # the cache holds the round's rows x[: n + 1]; the first n + 1 - extra count
        if saved:  # recurrent states: back to before the round, then the rows that count again
            self._again(cache, saved, x, n + 1, n + 1 - extra)
        else:
            rewind(cache, extra)

    def _again(self, cache: list, saved: list, x: mx.array, fed: int, kept: int) -> None:
        """Back to before a pass that fed x[:fed] (KV rows trimmed, recurrent states restored), then x[:kept] again,
        as every pass runs: compiled where decoding passes are."""
        rewind(cache, fed)
        restore(saved)
        self.v.steps(x[None, :kept], cache)

    def drop(self, cache: list) -> None:
        """Nothing is queued past a chain round."""
