"""The one drafter interface: propose up to k next tokens, then hear how many were kept.

The engine calls, per request: `start(prompt[, hidden])`, then per round `propose(context, k, ...)` and
`accept(n)`, and finally `finish()`. `context` is every token so far (prompt + output); the last one
has not been fed to the target yet. Plain decoding is the drafter that proposes nothing.

Learned drafters (EAGLE, Medusa) read the target's features: with `wants_hidden = True` the loop
computes the target's final hidden states and passes them to `start(prompt, hidden=...)` (the
prompt's) and `accept(n, hidden=...)` (each round's).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from ..sampling import Sampling


@dataclass
class Draft:
    tokens: mx.array  # (n,) drafted ids; may be lazy (still computing on the device)
    probs: mx.array | None  # (n, V) distribution each token was drawn from; None = deterministic
    count: int  # n, known on the host without reading `tokens` back
    # A tree of drafts (from `propose(..., width > 1)`): parents[i] is the node draft i hangs under,
    # 0 for the last context token, j for draft j-1 (always < i + 1). None: a chain.
    parents: list[int] | None = None

    @classmethod
    def empty(cls) -> "Draft":
        return cls(mx.array([], dtype=mx.uint32), None, 0)

    @classmethod
    def favourites_tree(cls, ranked: mx.array) -> "Draft":
        """ranked (k, w): per depth, the drafter's w best candidates, its favourite first. The
        favourites form a chain; each depth's runners-up hang beside its favourite (under the
        favourite one depth up), so the tree holds the chain and w - 1 alternatives per depth."""
        k, w = ranked.shape
        parents = [0 if i == 0 else (i - 1) * w + 1 for i in range(k) for _ in range(w)]
        return cls(ranked.reshape(-1).astype(mx.uint32), None, k * w, parents)


class Drafter:
    name = "none"
    syncs = 0  # host read-backs the drafter made itself (the loop adds them to the statistics)
    wants_hidden = False  # True: accept() also gets the target's hidden states (same pass, split before the head)
    feature_layers: tuple[int, ...] | None = None  # with wants_hidden: the inputs of these layers instead (EAGLE-3)
    trees = False  # True: propose(..., width=w) may return a tree of up to w candidates per depth

    @property
    def wants_features(self) -> bool | tuple[int, ...]:
        """What the target's passes hand this drafter: False (nothing), True (the final hidden states), or
        the layers whose inputs (features.target_forward's `layers`)."""
        return (self.feature_layers or True) if self.wants_hidden else False

    def start(self, prompt: list[int], hidden: mx.array | None = None) -> None:
        """A new request begins with these prompt tokens (a model drafter prefills here).
        `hidden` (only when `wants_hidden`): the target's final hidden states of prompt[:-1], (L-1, H)."""

    def propose(self, context: list[int], k: int, sampling: Sampling, key: mx.array, width: int = 1) -> Draft:
        """Up to k tokens likely to follow `context`; sampled from `sampling` when not greedy.
        `width` > 1 (asked only of a drafter with `trees`, greedy): a tree of depth k, up to `width`
        candidates per depth (Draft.parents)."""
        return Draft.empty()

    def accept(self, n: int, hidden: mx.array | None = None) -> None:
        """The target kept the first n tokens of the last proposal (of a tree: the n tokens of the
        path it kept, which the context now ends with).

        `hidden` (only when `wants_hidden`): the target's final hidden states (n+1, H), lazy, of the
        tokens it just read: the last context token and the n kept drafts (rows 0..n of the verify
        pass). A wants_hidden drafter also hears accept(0, hidden) after each plain round (no
        proposal), so it sees the features of every position.
        """

    def bind_cache(self, cache: list) -> None:
        """The target's cache of this request, before `start` (a drafter that attends to the target's keys
        and values reads it at `propose`: Gemma 4's assistant); it holds the context less its last token."""

    def bind_cancel(self, cancel) -> None:
        """Before `start`: the request's cancel flag (a threading.Event, or None). A drafter that reads
        the prompt itself (a draft model's prefill) checks it between chunks and raises
        cache.PrefillCancelled once set, as the target's prefill does."""

    def reproducible(self, on: bool) -> None:
        """Before `start`: does this request need drafts that depend on the request alone (a seeded
        sampling run)? A round's random draws depend on its drafts, so a drafter whose proposals also
        depend on earlier requests (lookup's memory of earlier answers) must leave them out while `on`,
        or the same seed would give another sample each time. Greedy runs need nothing: their tokens
        never depend on the drafts."""

    def has_guess(self, context: list[int]) -> bool:
        """A look on the host, cheap enough for every plain round: would `propose` now offer a
        guess worth a verify row? Only drafters that know (lookup) say yes; while adaptive
        speculation waits out a back-off, a yes ends the wait early (adaptive.py)."""
        return False

    def finish(self) -> None:
        """The request ended (done, stopped or cancelled): drop per-request state."""

    def forget(self) -> None:
        """Drop what was learned across requests (lookup's memory of earlier answers): a benchmark
        repeating a prompt must not be drafted from that prompt's own earlier answer."""

    def kernel_modules(self) -> list:
        """The drafter's own nn.Modules the engine may install mlxspec's kernels into (speed only)."""
        return []


class NoDrafter(Drafter):
    """Plain decoding: one target pass per token."""


class FeatureTap(NoDrafter):
    """Plain decoding that keeps the target's final hidden states of every position it reads: the
    prompt's, then one row per step (`Engine.generate(..., tap=...)`). heads/record.py trains
    learned drafters on them without a second forward pass over the answer (about a fifth of
    the recording time). The rows equal a full-sequence forward's: each is a one-row step's."""

    wants_hidden = True

    def __init__(self):
        self.rows: list[mx.array] = []

    def start(self, prompt: list[int], hidden: mx.array | None = None) -> None:
        self.rows = [] if hidden is None or hidden.shape[0] == 0 else [hidden]

    def accept(self, n: int, hidden: mx.array | None = None) -> None:
        if hidden is not None:
            self.rows.append(hidden)

    def features(self) -> mx.array | None:
        """(rows, H): positions 0, 1, ... of the last request, as far as the target read them."""
        return mx.concatenate(self.rows) if self.rows else None
