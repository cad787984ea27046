"""Draft trees' passes on GPUs: RoPE at a position per row, and which models can run such a pass.

A tree pass (tree.py) puts node m at position offset + depth(m), not offset + m. On the CPU the fused
block places each row itself. On a GPU the pass runs mlx-lm's own blocks, whose attention calls
`self.rope(x, offset=cache.offset)` with one offset for all rows: tree.py hands each block a cache view
whose `offset` is the rows' positions, an (M,) array, and RowPositionsRoPE, wrapped around the model's
own RoPE module, turns that into M one-row calls in one (mx.fast.rope takes one offset per batch entry):
row m gets what a one-row step at its position gets. Every other call passes through unchanged.

    use_row_positions(model)          # on GPUs (install_kernels): the attention modules' RoPE wrapped
    tree_passes_ready(model, caches, dtype)   # can a tree pass run this model here, row for row as one-row steps?
    restore_row_positions(model)
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from ..cache import HalfKVCache
from . import registry
from .hooks import routed

# mlx-lm models whose attention reads cache.offset only to place RoPE, whose layers pass it the mask they are
# given, and whose decoder is embed, layers, norm (tree.py runs those itself): a tree pass through them needs
# nothing but the positions and the attention kernel (MoE experts: the grouped gather, row for row)
TREE_FAMILIES = ("mlx_lm.models.llama", "mlx_lm.models.qwen2", "mlx_lm.models.qwen3", "mlx_lm.models.qwen3_moe",
                 "mlx_lm.models.qwen2_moe", "mlx_lm.models.phi3")


class RowPositionsRoPE(nn.Module):
    """A model's RoPE module that also takes one position per row: offset an (M,) array for x (1, H, M, D)."""

    def __init__(self, rope: nn.Module):
        super().__init__()
        object.__setattr__(self, "_origin", rope)  # not a child: the model's parameters keep their names

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        if isinstance(offset, mx.array) and offset.ndim == 1 and x.ndim == 4 and x.shape[0] == 1 and x.shape[2] > 1:
            if offset.shape[0] != x.shape[2]:
                raise ValueError(f"{offset.shape[0]} positions for {x.shape[2]} rows")
            return self._origin(x.swapaxes(0, 2), offset=offset).swapaxes(0, 2)  # rows as a batch of one-row calls
        return self._origin(x, offset=offset)


def use_row_positions(model: nn.Module) -> int:
    """Wrap the RoPE module of every TREE_FAMILIES attention module of this model; returns how many."""
    count = 0
    for _, m in model.named_modules():
        rope = getattr(m, "rope", None) if type(m).__module__ in TREE_FAMILIES else None
        if isinstance(rope, nn.Module) and not isinstance(rope, RowPositionsRoPE):
            m.rope = RowPositionsRoPE(rope)
            count += 1
    return count


def restore_row_positions(model: nn.Module) -> None:
    for _, m in model.named_modules():
        if isinstance(getattr(m, "rope", None), RowPositionsRoPE):
            m.rope = m.rope._origin


def tree_passes_ready(model: nn.Module, caches: list, dtype: mx.Dtype) -> bool:
    """Can a tree pass run this model on this GPU, each row as its one-row step would: every block a
    TREE_FAMILIES one whose attention is routed to the attention kernel, with its RoPE wrapped, plain KV
    caches (`caches`: fresh ones of the kinds the model decodes with: no sliding windows), and the kernel's
    self-check passed for the model's attention, tree rows included, in the family that serves it (run now if it has
    not run: it may turn trees off)?"""
    from .attention import NAME, few_row_attention, serving_function

    layers = getattr(getattr(model, "model", None), "layers", None)
    if (not layers or registry.device_backend_name() == "cpu" or len(caches) != len(layers)
            or any(type(c) not in (KVCache, HalfKVCache) for c in caches)):
        return False
    rec = registry.kernel("sdpa")
    if rec.error or not getattr(rec.fn, "trees", False):
        return False
    signatures = set()
    for layer in layers:
        attn = getattr(layer, "self_attn", None)
        if (attn is None or type(attn).__module__ not in TREE_FAMILIES or routed(attn, NAME) is not few_row_attention
                or not isinstance(getattr(attn, "rope", None), RowPositionsRoPE)):
            return False
        signatures.add((attn.n_heads, attn.n_kv_heads, round(attn.scale**-2)))
    kv_dtype = mx.float16 if type(caches[0]) is HalfKVCache else dtype
    # the function each signature's layers will call (the FMA kernel, or on a GPU the matrix family its timing chose)
    serving = [serving_function(h, kv, d, d, dtype, kv_dtype) for h, kv, d in signatures]
    return all(getattr(fn, "trees", False) for fn in serving)
