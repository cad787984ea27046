"""Multi-head latent attention (DeepSeek-V3's MLA) computed one way in every decoding pass, per model.

mlx-lm's MLA layers (DeepSeek-V3/R1 and Kimi K2: models/deepseek_v3.py; GLM-4.7-Flash: glm4_moe_lite.py)
take two routes to the same attention. A one-row step absorbs the key and value up-projections into the
query and the output (attention over the latent cache itself); several rows decompress the latent cache
into per-head keys and values. Equal in exact arithmetic, not in floating point: a verify pass's rows
differed from one-row steps even on the CPU, so speculation could change a greedy token (and the engine
said `exact: false`). `use_absorbed_steps` gives this model's MLA modules a class that takes the absorbed
route in every decoding pass (up to passes.DECODE_ROWS rows); a prompt chunk keeps mlx-lm's
decompressed route, cheaper at hundreds of rows (plain and speculative decoding feed prompts alike).
On GPUs (`use_latent_rows`, with the kernels) each row of a decoding pass attends alone, as a one-row step.
"""

from __future__ import annotations

import functools
import inspect

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import deepseek_v3, glm4_moe_lite
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import CacheList, KVCache

from .hooks import swap_classes
from .passes import prompt_chunk


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
        out = self._attend(q_nope, q_pe, kv_latent, k_pe, mask, cache)  # (B, H, L, v_head_dim)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))

    def _attend(self, q_nope, q_pe, kv_latent, k_pe, mask, cache) -> mx.array:
        """All rows at once (MLX's CPU ops give each row a one-row call's bits)."""
        pe_scores = (q_pe * self.scale) @ k_pe.swapaxes(-1, -2)  # (B, H, L, S): the rotary part of the scores
        if mask is not None:
            pe_scores = mx.where(mask, pe_scores, mx.array(mx.finfo(pe_scores.dtype).min, pe_scores.dtype))
        out = scaled_dot_product_attention(self.embed_q(q_nope), kv_latent, kv_latent, cache=cache,
                                           scale=self.scale, mask=pe_scores)  # (B, H, L, kv_lora_rank)
        return self.unembed_out(out)


class _RowByRow(_AbsorbedSteps):
    """On GPUs MLX's matmuls and attention change their arithmetic with the row count: each row of a decoding
    pass over a KV cache attends alone, over the keys up to its own, with a one-row step's very shapes and ops.
    Over exactly those keys: a compiled step's cache is a buffer of a capacity bucket with a mask (step_graph.py),
    whose length MLX's attention would see, so a model with these layers decodes eagerly."""

    EAGER_STEPS = True

    def _attend(self, q_nope, q_pe, kv_latent, k_pe, mask, cache) -> mx.array:
        rows, keys = q_nope.shape[2], kv_latent.shape[2]
        if type(cache) is not KVCache:
            return super()._attend(q_nope, q_pe, kv_latent, k_pe, mask, cache)
        out = []
        for t in range(rows):
            seen = keys - rows + t + 1  # what a one-row step at this position fetches from the cache
            pe = (q_pe[:, :, t : t + 1] * self.scale) @ k_pe[:, :, :seen].swapaxes(-1, -2)  # (B, H, 1, seen)
            row = scaled_dot_product_attention(self.embed_q(q_nope[:, :, t : t + 1]), kv_latent[:, :, :seen],
                                               kv_latent[:, :, :seen], cache=cache, scale=self.scale, mask=pe)
            out.append(self.unembed_out(row))
        return mx.concatenate(out, axis=2)


class _TokenByToken:
    """Other MLA layers (Kimi Linear's, Mistral 4's, LongCat's, DeepSeek-V3.2's, Bailing's: each its own text around
    the same two routes): a decoding pass's tokens go through the layer one at a time, each call exactly a one-row
    step (over mlx-lm's KV caches a one-row step's mask is None; arrays with a row per token are sliced, as
    Mistral 4's attention scale). Exact by construction, on any device; the layer's projections are read once a
    token, as one-row steps read them. Eager steps only (a compiled step's cache is a masked buffer)."""

    EAGER_STEPS = True

    def __call__(self, x: mx.array, *args, **kwargs) -> mx.array:
        tokens = x.shape[1]
        if tokens == 1 or prompt_chunk(x):  # a one-row step, a prompt chunk: the layer's own call
            return self._whole(x, *args, **kwargs)
        call = self._parameters.bind(x, *args, **kwargs)
        caches = call.arguments.get("cache")
        if not all(type(c) is KVCache for c in (caches.caches if isinstance(caches, CacheList) else [caches])):
            return self._whole(x, *args, **kwargs)
        rows = []
        for t in range(tokens):
            one = {name: None if name == "mask" else _row(value, t, tokens)
                   for name, value in call.arguments.items()}
            rows.append(self._whole(**one))
        return mx.concatenate(rows, axis=1)


def _row(value, t: int, tokens: int):
    """Row t of an array with a row per token along axis -2 ((B, T, D) inputs, (T, 1) scales); else the value."""
    if isinstance(value, mx.array) and value.ndim >= 2 and value.shape[-2] == tokens:
        return value[..., t : t + 1, :]
    return value


def _latent_layer(cls: type) -> bool:
    """Does `cls` hold MLA's two routes: mlx-lm's embed_q / unembed_out (MultiLinear) absorbed projections?"""
    try:
        source = inspect.getsource(cls.__call__)
    except (OSError, TypeError):
        return False
    return "self.embed_q(" in source and "self.unembed_out(" in source


@functools.lru_cache(maxsize=None)
def _token_by_token(cls: type) -> type:
    parameters = inspect.signature(cls.__call__)  # once a class: binding runs in every decoding pass
    parameters = parameters.replace(parameters=list(parameters.parameters.values())[1:])  # without self
    return type(f"TokenByToken{cls.__name__}", (_TokenByToken, cls), {"_whole": cls.__call__, "_parameters": parameters})


MLA_CLASSES = (deepseek_v3.DeepseekV3Attention, glm4_moe_lite.Glm4MoeLiteAttention)
_ABSORBED = {base: type(f"Absorbed{base.__name__}", (_AbsorbedSteps, base), {}) for base in MLA_CLASSES}
_ROW_BY_ROW = {_ABSORBED[base]: type(f"RowByRow{base.__name__}", (_RowByRow, base), {}) for base in MLA_CLASSES}


def use_absorbed_steps(model: nn.Module) -> int:
    """Give this model's MLA modules the absorbed route in decoding passes (mlx-lm's DeepSeek-V3 and GLM-4.7-Flash
    classes), or their tokens one at a time (any other class with both routes); returns how many."""
    swapped = swap_classes(model, _ABSORBED)
    for _, m in model.named_modules():
        if type(m) not in _ROW_BY_ROW and not isinstance(m, _TokenByToken) and _latent_layer(type(m)):
            m.__class__ = _token_by_token(type(m))  # same parameters, same names
            swapped += 1
    return swapped


def use_latent_rows(model: nn.Module) -> int:
    """On a GPU: this model's absorbed MLA modules attend row by row in decoding passes; returns how many."""
    return swap_classes(model, _ROW_BY_ROW)


def restore_latent_rows(model: nn.Module) -> None:
    swap_classes(model, {rows: absorbed for absorbed, rows in _ROW_BY_ROW.items()})


