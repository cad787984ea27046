"""MoE routers that multiply by a raw weight, one token at a time on a GPU.

Many of mlx-lm's mixture-of-experts gates are not Linear layers: `gates = x @ self.weight.T`, then
a softmax or sigmoid and a top-k (DeepSeek V2/V3, GLM-4.5, dots.llm1, EXAONE MoE, MiMo ...). On a
GPU MLX's matmul changes its arithmetic with the row count, so a verify pass would route its tokens
with other gate values than one-token steps do, and an expert chosen on a near tie could differ.
The dense kernel cannot be slipped in (the operator is not a module), but a gate maps each token's
row to that token's routing alone, so calling the model's own gate on one token at a time gives
every row exactly a one-token step's arithmetic. `use_rowwise_gates` gives this model's such gates
a subclass that does so for decoding passes (a prompt chunk, as everywhere on a GPU, runs whole:
passes.py). The gates are small (experts x hidden): the extra calls cost launches, not reads.
"""

from __future__ import annotations

import functools
import inspect
import re

import mlx.core as mx
import mlx.nn as nn

from .passes import prompt_chunk

_RAW_WEIGHT = re.compile(r"@\s*self\.weight\b")  # `x @ self.weight.T`: a matmul that is not a module


def raw_weight_gate(cls: type) -> bool:
    """Is `cls` a router that multiplies its input by its own raw weight (not a Linear layer)?"""
    if issubclass(cls, (nn.Linear, nn.QuantizedLinear)) or not re.search(r"(Gate|Router)$", cls.__name__):
        return False
    try:
        return bool(_RAW_WEIGHT.search(inspect.getsource(cls.__call__)))
    except (OSError, TypeError):
        return False


def _one_token_at_a_time(self, x: mx.array):
    """The base class's call on each token's row alone (x (..., T, hidden), batch 1), joined along T."""
    tokens = x.shape[-2] if x.ndim >= 2 else 1
    if tokens <= 1 or x.size != tokens * x.shape[-1] or prompt_chunk(x):
        return self._whole(x)
    outs = [self._whole(x[..., t : t + 1, :]) for t in range(tokens)]
    if isinstance(outs[0], tuple):
        return tuple(mx.concatenate(parts, axis=-2) for parts in zip(*outs))
    return mx.concatenate(outs, axis=-2)


@functools.lru_cache(maxsize=None)
def _rowwise(cls: type) -> type:
    return type(f"Rowwise{cls.__name__}", (cls,), {"__call__": _one_token_at_a_time, "_whole": cls.__call__,
                                                    "__module__": cls.__module__})


def use_rowwise_gates(model: nn.Module) -> int:
    """Give this model's raw-weight routers the one-token-at-a-time call; returns how many."""
    swapped = 0
    for _, m in model.named_modules():
        if not getattr(type(m), "_whole", None) and raw_weight_gate(type(m)):
            m.__class__ = _rowwise(type(m))
            swapped += 1
    return swapped


def restore_rowwise_gates(model: nn.Module) -> None:
    for _, m in model.named_modules():
        if getattr(type(m), "_whole", None):
            m.__class__ = type(m).__mro__[1]
