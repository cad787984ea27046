"""The one draft/verify loop. Plain decoding is this loop with a drafter that proposes nothing.

One round (consecutive plain rounds, k = 0, overlap: see _rounds):
  1. drafter.propose(context, k)      -> k drafted ids (lazy) [+ their probabilities]
  2. target(last token + drafts)      -> k+1 rows of logits, one forward pass
  3. verify: (n accepted, next token) -> the round's single host read-back
  4. rewind the target cache by k-n, tell the drafter n, emit drafts[:n] + [next]
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import mlx.core as mx
import mlx.nn as nn

from .adaptive import CostModel, DraftController
from .cache import PrefixCache, rewind
from .drafters.base import Draft, Drafter
from .errors import PromptError
from .options import GenerateOptions
from .sampling import Sampling, penalize, probabilities
from .stats import Stats
from .kernels.accept import fused_greedy_accept, fused_rejection_accept
from .verify import greedy_accept, rejection_accept

# The fused GPU acceptance kernels are opt-in until measured on a device (they self-check either way).
FUSED_ACCEPT = os.environ.get("MLXSPEC_FUSED_ACCEPT", "0") == "1"
# Plain decoding queues each step before reading the previous token (MLXSPEC_PIPELINE=0: one at a time).
PIPELINE_PLAIN = os.environ.get("MLXSPEC_PIPELINE", "1") != "0"


@dataclass
class Round:
    tokens: list[int]  # tokens to emit: accepted drafts then the target's own (cut at EOS / limits)
    from_draft: list[bool]


class Decoder:
    """Iterate to get Rounds; afterwards `finish_reason` is 'stop', 'length' or 'cancelled'."""

    def __init__(
        self,
        target: nn.Module,
        drafter: Drafter,
        prompt: list[int],
        options: GenerateOptions,
        *,
        draft_length: int,
        eos_ids: set[int],
        context_length: int,
        stats: Stats,
        cancel: threading.Event | None = None,
        adaptive: bool = True,
        costs: CostModel | None = None,
        kv: PrefixCache | None = None,
    ):
        if not prompt:
            raise PromptError("the prompt is empty: at least one token is needed")
        self.target, self.drafter, self.prompt, self.opts = target, drafter, list(prompt), options
        self.kv = kv or PrefixCache(target)  # the engine passes its own to reuse prompt prefixes
        self.k = draft_length
        # Timing decisions are left out of seeded sampling runs so they stay reproducible.
        timing = options.greedy or options.seed is None
        costs = (costs or CostModel()) if timing else None
        self.controller = DraftController(draft_length, costs) if adaptive and draft_length > 0 else None
        self.eos_ids = eos_ids
        self.num_ctx = min(options.num_ctx or context_length, context_length)
        if len(self.prompt) >= self.num_ctx:
            raise PromptError(f"the prompt is {len(self.prompt)} tokens; the context window is {self.num_ctx}")
        self.stats, self.cancel = stats, cancel
        self.sampling = Sampling.from_options(options)
        seed = options.seed if options.seed is not None else int.from_bytes(os.urandom(4), "little")
        self.key = mx.random.key(seed)
        self.finish_reason: str | None = None

    def __iter__(self) -> Iterator[Round]:
        stats = self.stats
        start = time.perf_counter()
        stats.cached_tokens = self.kv.prepare(self.prompt[:-1])
        cache = self.kv.cache
        self.drafter.start(self.prompt)
        stats.prompt_tokens = len(self.prompt)
        decode_start = time.perf_counter()
        stats.prompt_time = decode_start - start

        context = list(self.prompt)
        self.kv.tokens = None  # in use; what it holds is recorded once, when the loop ends
        self.in_flight = False
        try:
            yield from self._rounds(cache, context, decode_start)
        finally:
            # Kept for the next request unless a round was cut off half-way (an exception in it).
            self.kv.tokens = None if self.in_flight else context[:-1]

    def _rounds(self, cache: list, context: list[int], decode_start: float) -> Iterator[Round]:
        stats, opts = self.stats, self.opts
        remaining = opts.max_tokens if opts.max_tokens >= 0 else float("inf")
        k = None  # this round's draft length, when the round before already planned it
        queued, ahead = None, 0  # a plain step queued ahead (its lazy token); tokens the cache holds past context[:-1]
        try:
            while True:
                room = self.num_ctx - len(context)  # tokens the context can still take
                if self._ended(remaining, room):
                    return
                k = self._plan(remaining, room) if k is None else k
                round_start = time.perf_counter()
                self.in_flight = True  # the cache is not trusted until the round completes
                if k == 0 and self._can_queue():
                    # Plain round, pipelined as mlx-lm does: if the next round is plain too, queue it
                    # from this token still lazy, before reading it, so building the next graph
                    # overlaps the device's work on this one. Same tokens, keys and read-backs.
                    if queued is None:
                        queued, ahead = self._plain_step(cache, mx.array(context[-1:], dtype=mx.uint32)), ahead + 1
                    nxt, queued = queued, None
                    k = self._plan(remaining - 1, room - 1)  # the next round's, before this token is known
                    if k == 0 and remaining > 1 and room > 1:
                        queued, ahead = self._plain_step(cache, nxt.reshape(1).astype(mx.uint32)), ahead + 1
                    tokens, n, drafted = [int(nxt.item())], 0, 0  # the round's one host synchronisation
                    stats.host_syncs += 1
                    stats.record_round(0, 0)
                    ahead -= 1
                else:
                    tokens, n, drafted = self._round(cache, context, k)
                    k = None
                context.extend(tokens)  # the cache now holds every token of context but the newest (+ ahead)
                self.in_flight = False
                if self.controller:
                    self.controller.record(drafted, n, time.perf_counter() - round_start)
                    stats.draft_length, stats.backoffs = self.controller.k, self.controller.backoffs
                out, from_draft = [], []
                for i, t in enumerate(tokens):
                    if t in self.eos_ids:
                        self.finish_reason = "stop"
                        break
                    out.append(t)
                    from_draft.append(i < n)
                    remaining -= 1
                    if remaining <= 0:
                        break
                stats.generated_tokens += len(out)
                stats.decode_time = time.perf_counter() - decode_start
                if out:
                    yield Round(out, from_draft)
                if self.finish_reason is not None:
                    return
        finally:  # a plain step queued past the end (EOS, cancel, the caller leaving) is dropped
            rewind(cache, ahead)

    def _plan(self, remaining: float, room: int) -> int:
        """Draft length for a round that may add `remaining` tokens to a context with `room` left."""
        want = self.controller.next_k() if self.controller else self.k
        return int(max(0, min(want, remaining - 1, room - 1)))

    def _ended(self, remaining: float, room: int) -> bool:
        """Before a round: cancelled, or no token may be added (sets finish_reason)."""
        if self.cancel is not None and self.cancel.is_set():
            self.finish_reason = "cancelled"
        elif remaining <= 0 or room <= 0:
            self.finish_reason = "length"
        return self.finish_reason is not None

    def _can_queue(self) -> bool:
        """Can a plain step be queued before the token before it is known? Not when a repeat penalty
        needs the whole history (MLXSPEC_PIPELINE=0 turns queueing off)."""
        return PIPELINE_PLAIN and (self.opts.repeat_penalty == 1.0 or self.opts.repeat_last_n == 0)

    def _plain_step(self, cache: list, token: mx.array) -> mx.array:
        """Queue one target step on a (1,) token -> its next token (lazy, already being computed)."""
        verify_key = self._keys()[1]
        logits = self.target(token[None], cache=cache)[0]
        _, nxt = self._accept(logits, Draft.empty(), verify_key)
        mx.async_eval(nxt)
        return nxt

    def _keys(self) -> tuple[mx.array | None, mx.array | None]:
        """This round's (draft key, verify key): one split per round, whatever the round drafts."""
        if self.sampling.greedy:
            return None, None
        self.key, draft_key, verify_key = mx.random.split(self.key, 3)
        return draft_key, verify_key

    def _accept(self, logits: mx.array, draft: Draft, verify_key) -> tuple[mx.array, mx.array]:
        """(accepted count, next token), lazy: greedy, or rejection sampling against the draft."""
        greedy, rejection = (
            (fused_greedy_accept, fused_rejection_accept) if FUSED_ACCEPT else (greedy_accept, rejection_accept)
        )
        if self.sampling.greedy:
            return greedy(logits, draft.tokens)
        return rejection(probabilities(logits, self.sampling), draft.tokens, draft.probs, verify_key)

    def _round(self, cache: list, context: list[int], k: int) -> tuple[list[int], int, int]:
        """One draft/verify round -> (drafts[:n] + [next], n, number drafted)."""
        draft_key, verify_key = self._keys()
        drafter_syncs = self.drafter.syncs
        draft = self.drafter.propose(context, k, self.sampling, draft_key) if k > 0 else Draft.empty()
        self.stats.host_syncs += self.drafter.syncs - drafter_syncs
        x = mx.concatenate([mx.array(context[-1:], dtype=mx.uint32), draft.tokens])  # (1 + kd,)
        logits = self.target(x[None], cache=cache)[0]  # (1 + kd, V)
        logits = penalize(logits, context, draft.tokens, self.opts.repeat_penalty, self.opts.repeat_last_n)
        n, nxt = self._accept(logits, draft, verify_key)
        mx.eval(n, nxt, draft.tokens)  # the round's one host synchronisation
        self.stats.host_syncs += 1
        n = int(n.item())
        rewind(cache, draft.count - n)
        if k > 0:
            self.drafter.accept(n)
        self.stats.record_round(draft.count, n)
        return draft.tokens.tolist()[:n] + [int(nxt.item())], n, draft.count
