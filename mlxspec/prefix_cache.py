"""The prompt cache kept between requests: a new prompt's prefix shared with what it holds is not read again.

    kv = PrefixCache(model)
    reused = kv.prepare(prompt_ids)   # the cache now holds prompt_ids; `reused` of them were already there
    ... decoding ...
    kv.tokens = what_it_holds         # set by the request's owner when it ends (None: do not trust the cache)

A chat resends its whole history every turn. KV caches go back to the shared prefix (trim), where every layer can
(a sliding window must keep the positions the prompt's tail needs). Recurrent layers (Qwen3.5's, Qwen3-Next's,
Falcon-H1's...) cannot go back: they reuse all they hold where the new prompt extends it, and otherwise the nearest
checkpoint of their states at or before the shared prefix. Checkpoints are taken, as llama.cpp's context checkpoints,
where a prompt ends and CHECKPOINT_MARGIN tokens before (a chat template ends the prompt with the answer's opening,
`<|im_start|>assistant\\n<think>\\n`, which the next turn's history may render otherwise); the last MAX_CHECKPOINTS
are kept, each the states' size in memory.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import can_trim_prompt_cache

from .cache import PrefillCancelled, can_rewind, has_states, kv_can_rewind, new_cache, prefill, restore, rewind, \
    snapshot

CHECKPOINT_MARGIN = 8  # a second checkpoint this many tokens before a prompt's end
MAX_CHECKPOINTS = 3


class PrefixCache:
    """A model's cache and the tokens it holds. `tokens` is None while a request uses the cache; its owner sets it
    when the request ends, and leaves it None if a forward pass was cut off, so the next request rebuilds the cache
    instead of trusting it. With `features=True` (a learned drafter's request) `prepare` also keeps the final
    hidden states of the tokens (`hidden`); those of the last prompt it prefilled are kept, so only that prefix is
    reused then."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.cache: list | None = None
        self.tokens: list[int] | None = None
        self.hidden: mx.array | None = None  # (n, H) features of tokens[:n], from the last prefill with them
        self.checkpoints: list[tuple[int, list]] = []  # (n, snapshot): recurrent states after tokens[:n], by n

    def prepare(self, tokens: list[int], features: bool | tuple[int, ...] = False, cancel=None) -> int:
        """Make the cache hold exactly `tokens`; returns how many were reused, not recomputed.
        With features, `self.hidden` then holds the hidden states of all of `tokens`.
        `cancel` set while a long prompt is read: PrefillCancelled, the cache keeping the prefix it holds
        (a client that asks again reuses it)."""
        reused = self._reusable(tokens, features) if self.cache is not None and self.tokens is not None else 0
        if reused == 0:
            self.cache, self.checkpoints = new_cache(self.model), []
        elif reused < len(self.tokens):
            rewind(self.cache, len(self.tokens) - reused)  # KV rows
            if not can_trim_prompt_cache(self.cache):  # recurrent states: the checkpoint _reusable went back to
                restore(next(saved for n, saved in self.checkpoints if n == reused))
        self.tokens, fed, rows = None, reused, []
        self.checkpoints = [(n, saved) for n, saved in self.checkpoints if n <= reused]  # prefixes of `tokens` too
        recurrent = has_states(self.cache)
        cut = len(tokens) - CHECKPOINT_MARGIN
        for part in ([tokens[reused:cut], tokens[cut:]] if recurrent and cut > reused else [tokens[reused:]]):
            try:
                rows.append(prefill(self.model, self.cache, part, features=features, cancel=cancel))
            except PrefillCancelled as e:
                if not features:  # (with features, the hidden states of the fed chunks are not kept: start afresh)
                    self.tokens = list(tokens[: fed + e.fed])
                    if reused < (0 if self.hidden is None else self.hidden.shape[0]):
                        self.hidden = self.hidden[:reused]
                raise
            fed += len(part)
            if recurrent and not any(n == fed for n, _ in self.checkpoints):
                self.checkpoints = (self.checkpoints + [(fed, snapshot(self.cache))])[-MAX_CHECKPOINTS:]
        if features:
            parts = [p for p in ([self.hidden[:reused]] if reused else []) + rows if p is not None]
            self.hidden = mx.concatenate(parts) if parts else None
        elif reused < (0 if self.hidden is None else self.hidden.shape[0]):
            self.hidden = self.hidden[:reused]  # features past the reused prefix belong to other tokens
        self.tokens = list(tokens)
        return reused

    def _reusable(self, tokens: list[int], features) -> int:
        """How many of `tokens` the cache can keep: their common prefix with what it holds, where every layer can go
        back to it (a sliding window keeps the positions the prompt's tail needs; a recurrent state goes back only to
        a checkpoint, and needs not where the prompt extends what the cache holds)."""
        reused = common_prefix(self.tokens, tokens)
        if features:
            reused = min(reused, 0 if self.hidden is None else self.hidden.shape[0])
        back = len(self.tokens) - reused
        if back == 0:
            return reused
        if can_trim_prompt_cache(self.cache):
            return reused if can_rewind(self.cache, back) else 0
        for n, _ in reversed(self.checkpoints):  # the nearest first
            if n <= reused and kv_can_rewind(self.cache, len(self.tokens) - n):
                return n
        return 0


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
