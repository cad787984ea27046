"""KV caches: mlxspec's HalfKVCache (float32 keys and values stored as float16) and how a model gets it."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache, trim_prompt_cache

from mlxspec.cache import HalfKVCache, kv_cache_type, new_cache, store_kv_in_half
from mlxspec.loading import load


def test_half_cache_stores_float32_as_float16_and_trims():
    cache = HalfKVCache()
    k = mx.random.normal((1, 2, 5, 8), key=mx.random.key(0))
    v = mx.random.normal((1, 2, 5, 8), key=mx.random.key(1))
    keys, values = cache.update_and_fetch(k, v)
    assert keys.dtype == values.dtype == mx.float16 and cache.offset == 5
    assert mx.array_equal(keys, k.astype(mx.float16)).item() and mx.array_equal(values, v.astype(mx.float16)).item()
    keys, _ = cache.update_and_fetch(k[:, :, :1] * 2, v[:, :, :1])
    assert keys.shape[2] == 6 and mx.array_equal(keys[:, :, 5], (k[:, :, 0] * 2).astype(mx.float16)).item()
    assert trim_prompt_cache([cache], 4) == 4 and cache.offset == 2
    bf = HalfKVCache()
    assert bf.update_and_fetch(k.astype(mx.bfloat16), v.astype(mx.bfloat16))[0].dtype == mx.bfloat16  # as it comes


def test_store_kv_in_half_is_per_model_and_keeps_other_cache_kinds(tiny_llama):
    model, other = load(str(tiny_llama)).model, load(str(tiny_llama)).model
    assert kv_cache_type(model) == "f32" and type(new_cache(model)[0]) is KVCache
    store_kv_in_half(model)
    assert kv_cache_type(model) == "f16" and all(type(c) is HalfKVCache for c in make_prompt_cache(model))
    assert type(new_cache(other)[0]) is KVCache  # another instance of the same class is untouched

    other.make_cache = lambda: [RotatingKVCache(max_size=8), KVCache()]  # a sliding-window layer, a global one
    store_kv_in_half(other)
    assert [type(c) for c in make_prompt_cache(other)] == [RotatingKVCache, HalfKVCache]


def test_a_forward_over_a_half_cache_reads_the_rounded_keys(tiny_llama):
    """Without mlxspec's kernels (mlx-lm's modules, MLX's attention): the model runs on the half cache and
    its logits stay near the float32 cache's (a cache rounded to float16, nothing else changed)."""
    model = load(str(tiny_llama)).model
    x = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    full = model(x, cache=make_prompt_cache(model))
    store_kv_in_half(model)
    cache = make_prompt_cache(model)
    half = model(x, cache=cache)
    assert cache[0].keys.dtype == mx.float16 and half.dtype == mx.float32
    assert mx.allclose(half, full, atol=2e-2, rtol=2e-2).item()
    assert not mx.array_equal(half, full).item()  # the keys really were rounded
