"""KV cache helpers shared by the target and model drafters (mlx-lm caches: offset, trim)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

PREFILL_CHUNK = 512  # tokens per prompt chunk: bounds the attention scratch memory


def new_cache(model: nn.Module) -> list:
    return make_prompt_cache(model)


def trimmable(model: nn.Module) -> bool:
    """Speculation rewinds caches past rejected drafts; sliding-window caches cannot."""
    return can_trim_prompt_cache(make_prompt_cache(model))


def prefill(model: nn.Module, cache: list, tokens: list[int], chunk: int = PREFILL_CHUNK) -> int:
    """Feed tokens into the cache in chunks; returns how many host syncs it took."""
    syncs = 0
    for i in range(0, len(tokens), chunk):
        model(mx.array(tokens[i : i + chunk])[None], cache=cache)
        mx.eval([c.state for c in cache])
        syncs += 1
    return syncs


def rewind(cache: list, n: int) -> None:
    if n > 0:
        trim_prompt_cache(cache, n)


class PrefixCache:
    """A model's KV cache and the tokens it holds, kept between requests of one engine.

    A chat resends its whole history every turn; `prepare` keeps the longest common prefix and
    prefills only the rest. `tokens` is None while a request uses the cache; its owner sets it when
    the request ends, and leaves it None if a forward pass was cut off, so the next request rebuilds
    the cache instead of trusting it.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.cache: list | None = None
        self.tokens: list[int] | None = None

    def prepare(self, tokens: list[int]) -> int:
        """Make the cache hold exactly `tokens`; returns how many were reused, not recomputed."""
        reused = 0
        if self.cache is not None and self.tokens is not None and can_trim_prompt_cache(self.cache):
            reused = _common_prefix(self.tokens, tokens)
        if reused == 0:
            self.cache = new_cache(self.model)
        else:
            rewind(self.cache, len(self.tokens) - reused)
        self.tokens = None
        prefill(self.model, self.cache, tokens[reused:])
        self.tokens = list(tokens)
        return reused


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
