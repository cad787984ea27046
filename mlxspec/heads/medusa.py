"""Medusa heads: head i maps the target's final hidden state h_t to logits of token t+i+2.

Each head is a residual SiLU block, h + SiLU(W_i h + b_i), then the target's own frozen output
head, so only D x D weights per head are learned. W_i starts at zero: an untrained head repeats
the target's next-token guess one position later (a baseline training must beat).

File format (files.py): one safetensors file whose metadata holds the JSON config (kind, heads, dims,
the target's identity, training facts), written atomically.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..features import head as target_head
from . import files
from .files import check_target, identity  # noqa: F401  (the names callers know)

KIND = "medusa"


class MedusaHeads(nn.Module):
    def __init__(self, dims: int, heads: int):
        super().__init__()
        self.blocks = [nn.Linear(dims, dims) for _ in range(heads)]
        for b in self.blocks:  # zero start: each head begins as the identity on h
            b.weight = mx.zeros_like(b.weight)
            b.bias = mx.zeros_like(b.bias)

    @property
    def count(self) -> int:
        return len(self.blocks)

    def __call__(self, h: mx.array, count: int | None = None) -> mx.array:
        """(..., D) hidden -> (count, ..., D) features of the first `count` heads (default all)."""
        return mx.stack([h + nn.silu(b(h)) for b in self.blocks[:count]])


def save(path: Path, heads: MedusaHeads, config: dict) -> Path:
    """Write heads + config to `path` (.safetensors) atomically."""
    return files.save(path, files.module_tensors(heads), {**config, "kind": KIND, "heads": heads.count})


def read(path: Path) -> tuple[MedusaHeads, dict]:
    """(heads, config) from a file `save` wrote; anything else is refused with an MlxspecError."""
    tensors, config = files.read(path, KIND)
    try:
        heads = MedusaHeads(int(config["dims"]), int(config["heads"]))
    except (KeyError, ValueError, TypeError) as e:
        raise files.MlxspecError(f"{path} is not a medusa drafter file mlxspec wrote: {e}") from None
    files.load_into(heads, tensors, path)
    return heads, config


def logits(heads: MedusaHeads, model: nn.Module, h: mx.array, count: int | None = None) -> mx.array:
    """(..., D) hidden -> (count, ..., V) logits through the target's own output head."""
    return target_head(model)(heads(h.astype(heads.blocks[0].weight.dtype), count))
