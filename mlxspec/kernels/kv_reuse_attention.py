"""AFM's KV-reuse layers at their true positions in compiled decoding steps.

mlx-lm's afm7.KVReuseAttention reads the last regular layer's keys (`cache[-1].keys_and_values()`) and places
its queries at `keys.shape[2] - L`: right for mlx-lm's KVCache, which returns exactly the keys so far. A compiled
step (step_graph.py) hands every layer the cache's whole buffer (a bucket's capacity, 256 and up) with the keys
that count marked on the mask, so those queries took the buffer's last positions: outputs unlike the model's,
and a verify pass's rows unlike one-row steps (found by the architecture sweep). `use_positioned_kv_reuse` gives
this model's such modules a class that takes the position from the mask's mark where there is one, and computes
exactly mlx-lm's otherwise. Swapped at load, on every device.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import afm7
from mlx_lm.models.base import scaled_dot_product_attention

from ..cache import mask_marks
from .hooks import swap_classes


class PositionedKVReuseAttention(afm7.KVReuseAttention):
    def __call__(self, x: mx.array, keys: mx.array, values: mx.array, mask: mx.array | None = None) -> mx.array:
        B, L, _ = x.shape
        length = mask_marks(mask)[1] if isinstance(mask, mx.array) else None  # (1,): a compiled step's keys that count
        first = keys.shape[2] - L if length is None else length[0] - L  # the position of the first query
        queries = self.q_proj(x).reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)  # (B, heads, L, dim)
        queries = self.q_norm(self.rope(queries, offset=first))
        output = scaled_dot_product_attention(queries, keys, values, cache=None, scale=self.scale, mask=mask)
        return self.out_proj(output.transpose(0, 2, 1, 3).reshape(B, L, -1))


def use_positioned_kv_reuse(model: nn.Module) -> int:
    """Swap this model's AFM KV-reuse attention modules (same parameters, same names); returns how many."""
    return swap_classes(model, {afm7.KVReuseAttention: PositionedKVReuseAttention})
