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
