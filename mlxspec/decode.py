"""The one decode loop: plan a round, run its strategy, learn from it, emit its tokens.

    plan      draft length k for the next round (adaptive controller, capped by what may follow)
    run       PlainRound (k = 0, pipelined) or a speculative strategy (ChainRound, or TreeRound at
              the width the controller chose, where trees apply):
              one target pass, one host read-back, the cache rewound to the tokens kept
    learn     the controller records what the round cost and kept
    emit      the Emitter cuts at EOS / limits / stop strings / cancel and counts tokens

Iterating a Decoder yields Events; the last one has done=True, the finish reason and the Stats.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, Iterator

import mlx.core as mx
import mlx.nn as nn

from .adaptive import CostModel, DraftController
from .cache import PrefillCancelled
from .prefix_cache import PrefixCache
from .drafters.base import Drafter
from .emit import Emitter, Event
from .errors import PromptError
from .options import GenerateOptions, context_window
from .rounds import ChainRound, Outcome, PlainRound, RoundStrategy, Verifier
from .settings import DecodeSettings
from .stats import Stats
from .step_graph import StepGraphs
from .tree import MAX_TREE_NODES, tree_refusal, tree_round


class Decoder:
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
        settings: DecodeSettings | None = None,
        detokenizer=None,
        speculative: Callable[[Verifier], RoundStrategy] = ChainRound,
        constraint=None,
        width: int = 1,
        tree_costs: dict[int, CostModel] | None = None,
        steps: StepGraphs | None = None,
        window_note: str = "",
        takes_trees: bool | None = None,
    ):
        if not prompt:
            raise PromptError("the prompt is empty: at least one token is needed")
        self.target, self.drafter, self.prompt = target, drafter, list(prompt)
        self.kv = kv or PrefixCache(target)  # the engine passes its own to reuse prompt prefixes
        refusal = tree_refusal(target, drafter, options, constraint, width, takes_trees) if draft_length else ""
        tree = refusal is None  # tree.py
        if refusal and (options.draft_width or 1) > 1:  # asked for trees, drafts chains: say why
            stats.trees = f"chains: {refusal}"
        tree_table = None
        if tree:  # trees of this width have a cost table of their own (engine-wide, as the chains')
            draft_length = min(draft_length, MAX_TREE_NODES // width)
            tree_table = (tree_costs if tree_costs is not None else {}).setdefault(width, CostModel())
        self.k, self.stats = draft_length, stats
        # Timing decisions are left out of seeded sampling runs so they stay reproducible.
        timing = options.greedy or options.seed is None
        self.seeded = not timing
        costs = (costs or CostModel()) if timing else None
        self.controller = None
        if adaptive and draft_length > 0:  # it chooses chain or tree, and the length, per round
            self.controller = DraftController(draft_length, costs, tree=(width, tree_table) if tree else None)
        self.width = width if tree else 1  # of the next speculative round (the controller may change it)
        num_ctx = context_window(options.num_ctx, context_length)
        if len(self.prompt) >= num_ctx:
            raise PromptError(f"the prompt is {len(self.prompt)} tokens; the context window is {num_ctx}{window_note}")
        limit = num_ctx - len(self.prompt)  # every emitted token enters the context
        if options.max_tokens >= 0:
            limit = min(limit, options.max_tokens)
        self.emitter = Emitter(limit, eos_ids, stats, stops=options.stop, detokenizer=detokenizer, cancel=cancel)
        settings = settings or DecodeSettings()
        seed = options.seed if options.seed is not None else int.from_bytes(os.urandom(4), "little")
        self.constraint = constraint  # structured output: masks in the rounds, advanced here by what they emit
        verifier = Verifier(target, drafter, options, settings, stats, mx.random.key(seed), constraint, steps)
        # compiled step graphs (the target's, a draft model's): a round that traces a new one is not timed
        self.graphs = [s.graphs for s in (verifier.steps, getattr(drafter, "steps", None)) if isinstance(s, StepGraphs)]
        self.plain = PlainRound(verifier, settings)
        # the strategies of rounds that draft (k > 0), by width: the chain, and a tree where it applies
        self.speculative = {1: speculative(verifier)} | ({width: tree_round(width)(verifier)} if tree else {})

    @property
    def finish_reason(self) -> str | None:
        return self.emitter.finish_reason

    def __iter__(self) -> Iterator[Event]:
        stats = self.stats
        start = time.perf_counter()
        features = self.drafter.wants_features  # a learned drafter reads the prompt's hidden states too
        try:
            stats.cached_tokens = self.kv.prepare(self.prompt[:-1], features=features, cancel=self.emitter.cancel)
            self._start_drafter(features)
        except PrefillCancelled:  # the client left while its prompt was read (the target's or the draft's)
            stats.prompt_tokens, stats.prompt_time = len(self.prompt), time.perf_counter() - start
            self.emitter.ended()  # finish_reason 'cancelled'
            yield self.emitter.close()
            return
        stats.prompt_tokens = len(self.prompt)
        decode_start = time.perf_counter()
        stats.prompt_time = decode_start - start

        context = list(self.prompt)
        self.kv.tokens = None  # in use; what it holds is recorded once, when the loop ends
        self.in_flight, self.last = False, None  # self.last: the strategy of the last round that ran
        try:
            yield from self._rounds(self.kv.cache, context, decode_start)
        finally:
            # Kept for the next request unless a round was cut off half-way (an exception in it).
            self.kv.tokens = None if self.in_flight else self._settled(context)[:-1]
        yield self.emitter.close()

    def _settled(self, context: list[int]) -> list[int]:
        """The context as plain decoding would leave it in the cache: a last round's tokens past where the run ended
        (an EOS or a stop string among its kept drafts) taken out, recurrent states too (the strategy's `settle`), so
        a next request sharing this prefix reuses the same cache whether this one drafted or not."""
        end = len(self.prompt) + self.stats.generated_tokens + self.emitter.eos_ended
        if end >= len(context) or self.last is None:
            return context
        self.last.settle(self.kv.cache, len(context) - end)
        return context[:end]

    def _start_drafter(self, features) -> None:
        self.drafter.bind_cache(self.kv.cache)
        self.drafter.reproducible(self.seeded)  # drafts from this request alone (lookup's memory left out)
        self.drafter.bind_cancel(self.emitter.cancel)  # a draft model reads the prompt too: as stoppable
        if features:
            self.drafter.start(self.prompt, hidden=self.kv.hidden)
        else:
            self.drafter.start(self.prompt)

    def _rounds(self, cache: list, context: list[int], decode_start: float) -> Iterator[Event]:
        k = None  # this round's draft length, when the round before already planned it
        try:
            while not self.emitter.ended():
                k = self._plan(self.emitter.left) if k is None else k
                width = self.width if k else 1
                strategy = self.plain if k == 0 else self.speculative[width]
                round_start, traced = time.perf_counter(), sum(map(len, self.graphs))
                self.in_flight = True  # the cache is not trusted until the round completes
                out = strategy.run(cache, context, k, self._plan_after)
                self.last = strategy
                if self.constraint is not None:
                    self.constraint.commit(out.tokens)
                context.extend(out.tokens)  # the cache holds all of context but the newest (+ a queued step)
                self.in_flight = False
                seconds = time.perf_counter() - round_start
                self._learn(out, None if sum(map(len, self.graphs)) != traced else seconds, width)
                if self.controller is not None and self.controller.waiting and self.drafter.has_guess(context):
                    self.controller.hint()  # takes effect at the round after the one already queued
                k = out.planned
                event = self.emitter.emit(out.tokens, out.accepted, out.logprobs)
                self.stats.decode_time = time.perf_counter() - decode_start
                if event.tokens:
                    yield event
        finally:
            self.plain.drop(cache)
            for strategy in self.speculative.values():
                strategy.drop(cache)

    def _plan(self, budget: int) -> int:
        """Draft length for a round that may emit `budget` more tokens (it yields up to k+1)."""
        if self.controller is None:
            want = self.k
        else:
            plan = self.controller.plan()
            self.controller.commit(plan)
            want = plan.k
            if plan.k:
                self.width = plan.width
        return int(max(0, min(want, budget - 1)))

    def _plan_after(self, produced: int) -> int | None:
        """The next round's draft length, planned while this round (adding `produced`) still runs."""
        budget = self.emitter.left - produced
        return self._plan(budget) if budget > 0 else None

    def _learn(self, out: Outcome, seconds: float | None, width: int) -> None:
        if self.controller is not None:
            self.controller.record(out.drafted, out.accepted, seconds, width)
            self.stats.draft_length, self.stats.backoffs = self.controller.k, self.controller.backoffs
