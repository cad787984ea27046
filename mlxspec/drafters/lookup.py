"""Prompt lookup (n-gram) drafting: no weights, guesses by copying what followed last time.

If the last n tokens appeared earlier in the prompt or output, propose the tokens that followed
their most recent earlier occurrence, trying n from `max_ngram` down to `min_ngram`. It shines
where the answer copies its input (code edits, summaries, quotes). The draft is deterministic
(q = one-hot), which the rejection rule handles exactly.

A short match is a weak guess, so it proposes fewer tokens: on SmolLM2 (4 prompts, k=4) rounds
from a 1-token match kept 0.28 drafts on average (88% kept none), 2-token matches 1.5, 3-token 3.4.
"""

from __future__ import annotations

import mlx.core as mx

from ..sampling import Sampling
from .base import Draft, Drafter


class LookupDrafter(Drafter):
    name = "lookup"

    SHORT_MATCH_BUDGET = {1: 1, 2: 2}  # n-gram length -> most tokens proposed after such a match

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.start([])

    def start(self, prompt: list[int], hidden: mx.array | None = None) -> None:
        # n -> {n-gram: end position of its most recent occurrence}; ends < len(context) only,
        # so the context's own suffix never matches itself.
        self.index: dict[int, dict[tuple, int]] = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        self.indexed = 0  # ends indexed so far: 1..indexed

    def _index_until(self, context: list[int], end: int) -> None:
        for e in range(self.indexed + 1, end + 1):
            for n, table in self.index.items():
                if e >= n:
                    table[tuple(context[e - n : e])] = e
        self.indexed = max(self.indexed, end)

    def propose(self, context: list[int], k: int, sampling: Sampling, key: mx.array) -> Draft:
        self._index_until(context, len(context) - 1)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) <= n:
                continue
            end = self.index[n].get(tuple(context[-n:]))
            if end is not None:
                guess = context[end : end + min(k, self.SHORT_MATCH_BUDGET.get(n, k))]
                return Draft(mx.array(guess, dtype=mx.uint32), None, len(guess))
        return Draft.empty()

    def finish(self) -> None:
        self.start([])
