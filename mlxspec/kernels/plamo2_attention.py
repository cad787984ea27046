"""PLaMo 2's attention through mlx-lm's `scaled_dot_product_attention`, so the attention kernels can be routed in.

mlx-lm's plamo2.Attention calls `mx.fast.scaled_dot_product_attention` itself, where every other model calls
mlx-lm's `scaled_dot_product_attention(..., cache=...)`: the name hooks.py routes per module to the few-row
kernels. On a GPU MLX's attention changes its arithmetic with the row count, so PLaMo 2's verify rows were not
one-row steps there (the emulated GPU flagged it). `use_routable_attention` gives this model's PLaMo 2 attention
modules a class that computes exactly what mlx-lm's does and makes that call (MLX's same op where nothing is
routed: mlx-lm's function calls it for a plain KV cache). Swapped at load, before the kernels look for the name.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import plamo2
from mlx_lm.models.base import scaled_dot_product_attention

from .hooks import swap_classes


class RoutablePlamo2Attention(plamo2.Attention):
    def __call__(self, hidden_states: mx.array, mask: mx.array | None = None, cache=None) -> mx.array:
        B, T, _ = hidden_states.shape
        q, k, v = mx.split(self.qkv_proj(hidden_states), [self.q_proj_dim, self.q_proj_dim + self.k_proj_dim], axis=-1)
        q = q.reshape(B, T, self.q_num_heads, self.qk_dim).transpose(0, 2, 1, 3)  # (B, heads, T, dim)
        k = k.reshape(B, T, self.k_num_heads, self.qk_dim).transpose(0, 2, 1, 3)
        v = v.reshape(B, T, self.v_num_heads, self.v_dim).transpose(0, 2, 1, 3)
        q = mx.fast.rms_norm(q, weight=None, eps=1e-6) * self.q_weight[:, None]
        k = mx.fast.rms_norm(k, weight=None, eps=1e-6) * self.k_weight[:, None]
        if cache is not None:
            q, k = self.rope(q, offset=cache.offset), self.rope(k, offset=cache.offset)
            k, v = cache.update_and_fetch(k, v)
        else:
            q, k = self.rope(q), self.rope(k)
        out = scaled_dot_product_attention(q, k, v, cache=cache, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, T, self.q_num_heads * self.v_dim))


def use_routable_attention(model: nn.Module) -> int:
    """Swap this model's PLaMo 2 attention modules (same parameters, same names); returns how many."""
    return swap_classes(model, {plamo2.Attention: RoutablePlamo2Attention})
