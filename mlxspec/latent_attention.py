"""Multi-head latent attention (DeepSeek-V3's MLA) computed one way in every decoding pass, per model.

mlx-lm's MLA layers (DeepSeek-V3/R1 and Kimi K2: models/deepseek_v3.py; GLM-4.7-Flash: glm4_moe_lite.py)
take two routes to the same attention. A one-row step absorbs the key and value up-projections into the
query and the output (attention over the latent cache itself); several rows decompress the latent cache
into per-head keys and values. Equal in exact arithmetic, not in floating point: a verify pass's rows
differed from one-row steps even on the CPU, so speculation could change a greedy token (and the engine
said `exact: false`). `use_absorbed_steps` gives this model's MLA modules a class that takes the absorbed
route in every decoding pass (up to kernels.passes.DECODE_ROWS rows); a prompt chunk keeps mlx-lm's
decompressed route, cheaper at hundreds of rows (plain and speculative decoding feed prompts alike).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import deepseek_v3, glm4_moe_lite
from mlx_lm.models.base import scaled_dot_product_attention

from .kernels.passes import prompt_chunk


class _AbsorbedSteps:
    """mlx-lm's DeepseekV3Attention.__call__ (glm4_moe_lite's is the same text), its one-row route for any
    number of rows: q_nope through embed_q, attention over the latent keys, the output through unembed_out."""

    def __call__(self, x: mx.array, mask: mx.array | None = None, cache=None) -> mx.array:
        if prompt_chunk(x):
            return super().__call__(x, mask, cache)
        B, L, _ = x.shape
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.reshape(B, L, self.num_heads, self.q_head_dim).transpose(0, 2, 1, 3)  # (B, H, L, nope + rope)
        q_nope, q_pe = mx.split(q, [self.qk_nope_head_dim], axis=-1)
        compressed_kv, k_pe = mx.split(self.kv_a_proj_with_mqa(x), [self.kv_lora_rank], axis=-1)
        k_pe = k_pe.reshape(B, L, 1, self.qk_rope_head_dim).transpose(0, 2, 1, 3)  # (B, 1, L, rope)
        kv_latent = mx.expand_dims(self.kv_a_layernorm(compressed_kv), axis=1)  # (B, 1, L, kv_lora_rank)
        offset = cache.offset if cache is not None else 0
        q_pe, k_pe = self.rope(q_pe, offset), self.rope(k_pe, offset)
        if cache is not None:
            kv_latent, k_pe = cache.update_and_fetch(kv_latent, k_pe)
        pe_scores = (q_pe * self.scale) @ k_pe.swapaxes(-1, -2)  # (B, H, L, S): the rotary part of the scores
        if mask is not None:
            pe_scores = mx.where(mask, pe_scores, mx.array(mx.finfo(pe_scores.dtype).min, pe_scores.dtype))
        out = scaled_dot_product_attention(self.embed_q(q_nope), kv_latent, kv_latent, cache=cache,
                                           scale=self.scale, mask=pe_scores)  # (B, H, L, kv_lora_rank)
        out = self.unembed_out(out).transpose(0, 2, 1, 3).reshape(B, L, -1)  # (B, L, H * v_head_dim)
        return self.o_proj(out)


_ABSORBED: dict[type, type] = {
    base: type(f"Absorbed{base.__name__}", (_AbsorbedSteps, base), {})
    for base in (deepseek_v3.DeepseekV3Attention, glm4_moe_lite.Glm4MoeLiteAttention)
}


def use_absorbed_steps(model: nn.Module) -> int:
    """Give this model's MLA modules (mlx-lm's classes exactly) the absorbed route in decoding passes;
    returns how many."""
    swapped = 0
    for _, m in model.named_modules():
        absorbed = _ABSORBED.get(type(m))
        if absorbed is not None:
            m.__class__ = absorbed  # same parameters, same names
            swapped += 1
    return swapped
