"""Gemma 2's attention through the few-row attention kernels, per model.

mlx-lm writes Gemma 2's attention out (models/gemma2.py): scores as a matmul, capped as
c * tanh(s / c), a precise softmax, a matmul with the values. On a GPU those matmuls change their
arithmetic with the row count, so verify rows would not equal one-row steps. `use_softcap_attention`
gives this model's Gemma 2 attention modules a class that computes q, k, v and the cache exactly as
mlx-lm's does, then calls few_row_attention with the cap: the kernel where it takes caps (CPU and
GPU kernels do), else those very ops (attention.softcapped_attention).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import gemma2
from mlx_lm.models.cache import KVCache

from .attention import few_row_attention


class SoftcapAttention(gemma2.Attention):
    def __call__(self, x: mx.array, mask: mx.array | None = None, cache=None) -> mx.array:
        B, L, _ = x.shape
        queries, keys, values = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        queries = queries.reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)  # (B, H, L, D)
        keys = keys.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        values = values.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        if cache is not None:
            queries = self.rope(queries, offset=cache.offset)
            keys = self.rope(keys, offset=cache.offset)
            keys, values = cache.update_and_fetch(keys, values)
        else:
            queries, keys = self.rope(queries), self.rope(keys)
        if isinstance(mask, mx.array) and (cache is None or isinstance(cache, KVCache)):
            mask = "causal"  # what mlx-lm's array stands for over a whole KV cache (create_causal_mask)
        out = few_row_attention(queries, keys, values, cache, self.scale, mask, softcap=self.attn_logit_softcapping)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


def use_softcap_attention(model: nn.Module, fn) -> int:
    """Swap this model's Gemma 2 attention modules where the attention kernel `fn` takes caps; returns how many."""
    if not getattr(fn, "softcaps", False):
        return 0
    swapped = 0
    for _, m in model.named_modules():
        if type(m) is gemma2.Attention:
            m.__class__ = SoftcapAttention  # same parameters, same names
            swapped += 1
    return swapped


def restore_softcap_attention(model: nn.Module) -> None:
    for _, m in model.named_modules():
        if type(m) is SoftcapAttention:
            m.__class__ = gemma2.Attention
