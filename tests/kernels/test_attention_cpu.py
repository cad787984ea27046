"""The CPU few-row attention kernel against MLX's attention, and against itself across row counts.

Row independence is bit-for-bit: row i of an M-row causal call equals the one-row call that sees
the keys up to its own position, for M in 1..16; GQA, a value dim unlike the key dim, cache-like
strided views, three dtypes, every code path built here (AVX-512, AVX2, portable).
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxspec.kernels import attention
from mlxspec.kernels.cpu import cpu_sdpa_function


def isas(ext):
    return [i for i in (1, 2, 3, 0) if ext.isa_compiled(i)]  # avx512, avx2, neon, generic: those built here


def inputs(heads, kv_heads, rows, keys, dim, value_dim, dtype, seed=0):
    kq, kk, kv = mx.random.split(mx.random.key(seed), 3)
    q = mx.random.normal((1, heads, rows, dim), key=kq).astype(dtype)
    k = mx.random.normal((1, kv_heads, keys + 7, dim), key=kk).astype(dtype)[:, :, :keys]
    v = mx.random.normal((1, kv_heads, keys + 7, value_dim), key=kv).astype(dtype)[:, :, :keys]
    return q, k, v


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_every_row_count_matches_reference_and_one_row_calls(cpu_ext, dtype):
    heads, kv_heads, dim, value_dim, keys = 6, 2, 64, 32, 50
    q, k, v = inputs(heads, kv_heads, 16, keys, dim, value_dim, dtype)
    scale = dim**-0.5
    for isa in isas(cpu_ext):
        sdpa = cpu_sdpa_function(isa)
        for m in range(1, 17):
            y = sdpa(q[:, :, :m], k, v, scale, True)
            ok, ratio = attention.attention_within_tolerance(y, q[:, :, :m], k, v, scale, True)
            assert ok, f"isa {sdpa.isa}, M={m}: error {ratio:.3g}x the tolerance"
            for i in (0, m - 1):
                seen = keys - m + i + 1
                one = sdpa(q[:, :, i : i + 1], k[:, :, :seen], v[:, :, :seen], scale, False)
                assert mx.array_equal(one[:, :, 0], y[:, :, i]).item(), f"isa {sdpa.isa}, M={m}, row {i}"


@pytest.mark.parametrize("window", [1, 7, 64])
def test_sliding_window_rows_equal_one_row_calls_over_their_window(cpu_ext, window):
    """window: causal row i sees only its last `window` keys (gemma2/3's and gpt-oss's local layers);
    each row equals a one-row call over exactly those keys, which start at index 0 there."""
    heads, kv_heads, dim, keys = 6, 2, 64, 50
    q, k, v = inputs(heads, kv_heads, 9, keys, dim, dim, mx.float32, seed=5)
    for isa in isas(cpu_ext):
        sdpa = cpu_sdpa_function(isa)
        for m in (1, 4, 9):
            y = sdpa(q[:, :, :m], k, v, dim**-0.5, True, window=window)
            ok, ratio = attention.attention_within_tolerance(y, q[:, :, :m], k, v, dim**-0.5, True, window)
            assert ok, f"isa {sdpa.isa}, M={m}: error {ratio:.3g}x the tolerance"
            for i in range(m):
                seen = keys - m + i + 1
                lo = max(0, seen - window)
                one = sdpa(q[:, :, i : i + 1], k[:, :, lo:seen], v[:, :, lo:seen], dim**-0.5, False)
                assert mx.array_equal(one[:, :, 0], y[:, :, i]).item(), f"isa {sdpa.isa}, M={m}, row {i}"
    with pytest.raises(ValueError, match="window needs causal"):
        cpu_sdpa_function()(q, k, v, 0.125, False, window=4)


@pytest.mark.parametrize("window", [0, 7])
def test_a_length_counts_keys_of_a_longer_buffer_windowed_or_not(cpu_ext, window):
    """A compiled step passes its whole cache buffer and the keys that count (an array of its graph):
    the same bits as a call over exactly those keys, for full and sliding-window layers alike."""
    heads, kv_heads, dim, keys = 4, 2, 32, 40
    q, k, v = inputs(heads, kv_heads, 5, 64, dim, dim, mx.float32, seed=9)
    for isa in isas(cpu_ext):
        sdpa = cpu_sdpa_function(isa)
        for m in (1, 5):
            cut = sdpa(q[:, :, :m], k[:, :, :keys], v[:, :, :keys], dim**-0.5, True, window=window)
            whole = sdpa(q[:, :, :m], k, v, dim**-0.5, True, window=window, length=mx.array([keys], mx.int32))
            assert mx.array_equal(cut, whole).item(), f"isa {sdpa.isa}, M={m}"


@pytest.mark.parametrize("kv_dtype", [mx.float16, mx.bfloat16])
def test_fp32_queries_over_a_half_cache_equal_fp32_attention_over_the_same_values(cpu_ext, kv_dtype):
    """fp32 queries with fp16/bf16 keys and values (read as fp32, exactly): the bits of an all-fp32 call."""
    q, k, v = inputs(9, 3, 4, 300, 64, 64, mx.float32, seed=3)
    kh, vh = k.astype(kv_dtype), v.astype(kv_dtype)
    for isa in isas(cpu_ext):
        sdpa = cpu_sdpa_function(isa)
        for causal in (False, True):
            mixed = sdpa(q, kh, vh, 0.125, causal)
            assert mixed.dtype == mx.float32
            same = sdpa(q, kh.astype(mx.float32), vh.astype(mx.float32), 0.125, causal)
            assert mx.array_equal(mixed, same).item(), f"isa {sdpa.isa}, causal={causal}"
    with pytest.raises(ValueError, match="one dtype for k and v"):
        cpu_sdpa_function()(q, kh, v, 0.125, False)


def test_long_prefill_and_batches(cpu_ext):
    """More rows than one work item (64) and a batch of 2: still the reference."""
    q, k, v = inputs(4, 4, 100, 130, 32, 32, mx.float32, seed=1)
    q, k, v = (mx.concatenate([a, a * 0.5]) for a in (q, k, v))
    y = cpu_sdpa_function()(q, k, v, 0.2, True)
    assert attention.attention_within_tolerance(y, q, k, v, 0.2, True)[0]


def test_self_check_passes_and_catches_a_wrong_kernel(cpu_ext):
    assert attention.self_check(cpu_sdpa_function(), 9, 3, 64, 64, mx.float32) is None
    wrong = lambda q, k, v, scale, causal: mx.zeros_like(q)  # noqa: E731
    assert "tolerance" in attention.self_check(wrong, 9, 3, 64, 64, mx.float32)
    cpu = cpu_sdpa_function()

    def ignores_sinks(q, k, v, scale, causal, window=0, sinks=None):  # claims sinks, drops them
        return cpu(q, k, v, scale, causal, window=window)

    ignores_sinks.windows = ignores_sinks.sinks = True
    assert attention.self_check(ignores_sinks, 9, 3, 64, 64, mx.float32).startswith("sinks, window 0: error")


@pytest.fixture
def routed_model(cpu_ext, tiny_llama):
    from mlxspec.loading import load

    model = load(str(tiny_llama)).model
    report = attention.use_attention_kernel(model)
    yield model, report
    attention.restore_attention(model)


def test_routing_is_per_model_and_leaves_the_rest_to_mlx_lm(routed_model):
    import mlx_lm.models.base as base
    import mlx_lm.models.llama as llama

    from mlxspec.kernels.hooks import routed

    model, report = routed_model
    layers = model.model.layers
    assert report["routed"] == len(layers) and all(routed(b.self_attn, attention.NAME) for b in layers)
    assert llama.scaled_dot_product_attention is base.scaled_dot_product_attention  # mlx-lm untouched
    q, k, v = inputs(4, 2, 3, 20, 32, 32, mx.float32, seed=2)
    ours = attention.few_row_attention(q, k, v, None, scale=0.2, mask="causal")
    assert attention.attention_within_tolerance(ours, q, k, v, 0.2, True)[0]
    array_mask = mx.tril(mx.ones((3, 20), dtype=mx.bool_), k=17)  # not the kernel's: mlx-lm answers
    assert mx.array_equal(attention.few_row_attention(q, k, v, None, scale=0.2, mask=array_mask),
                          base.scaled_dot_product_attention(q, k, v, None, scale=0.2, mask=array_mask)).item()
    x = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    with_kernel = model(x)
    assert attention.attention_status()["passed"], "the model's calls reached the kernel"
    attention.restore_attention(model)
    assert not any(routed(b.self_attn, attention.NAME) for b in layers)
    assert mx.allclose(model(x), with_kernel, atol=1e-4, rtol=1e-4).item()


@pytest.mark.parametrize("window", [0, 6])
def test_sinks_on_the_cpu_kernel(cpu_ext, window):
    """gpt-oss's sinks (a logit per head with no value): within tolerance of MLX's attention with
    them, far from the answer without them, and each row of a causal (windowed) call equal to a
    one-row call over its keys, on every ISA."""
    q, k, v = inputs(8, 2, 5, 40, 64, 64, mx.float32, seed=4)
    sinks = mx.random.normal((8,), key=mx.random.key(5)) * 2
    for isa in isas(cpu_ext):
        sdpa = cpu_sdpa_function(isa)
        y = sdpa(q, k, v, 0.125, True, window=window, sinks=sinks)
        assert attention.attention_within_tolerance(y, q, k, v, 0.125, True, window, sinks)[0], sdpa.isa
        assert not attention.attention_within_tolerance(y, q, k, v, 0.125, True, window)[0]
        for i in range(5):
            seen = 40 - 5 + i + 1
            lo = seen - window if window else 0
            one = sdpa(q[:, :, i : i + 1], k[:, :, lo:seen], v[:, :, lo:seen], 0.125, False, sinks=sinks)
            assert mx.array_equal(one[:, :, 0], y[:, :, i]).item(), (sdpa.isa, i)


def test_sinks_reach_only_kernels_that_take_them(cpu_ext, monkeypatch):
    """gpt-oss passes sinks: a kernel that takes them (the CPU one, the GPU ones) gets them, with a
    WindowKVCache's window, and answers within tolerance; one that does not leaves them to mlx-lm."""
    import mlx_lm.models.base as base

    from mlxspec.kernels import registry

    q, k, v = inputs(4, 2, 3, 20, 32, 32, mx.float32, seed=3)
    sinks = mx.array([0.5, -1.0, 2.0, 0.0])
    got = attention.few_row_attention(q, k, v, None, scale=0.2, mask="causal", sinks=sinks)  # the CPU kernel's
    assert attention.attention_within_tolerance(got, q, k, v, 0.2, True, 0, sinks)[0]
    assert attention.attention_status()["passed"]
    no_sinks = registry.KernelRecord("sdpa", "cpu", fn=lambda *a, **kw: 1 / 0, checks={(4, 2, 32, 32, "mlx.core.float32"): None})
    monkeypatch.setattr(attention, "_record", lambda: no_sinks)  # a kernel without sinks is never called with them
    want = base.scaled_dot_product_attention(q, k, v, None, scale=0.2, mask="causal", sinks=sinks)
    assert mx.array_equal(attention.few_row_attention(q, k, v, None, scale=0.2, mask="causal", sinks=sinks), want).item()
    calls = []

    def taking_sinks(q, k, v, scale, causal, window=0, sinks=None):
        calls.append((causal, window, sinks))
        return attention.attention_reference(q, k, v, scale, causal, window, sinks)

    taking_sinks.windows = taking_sinks.sinks = True
    rec = registry.KernelRecord("sdpa", "cpu", fn=taking_sinks, checks={(4, 2, 32, 32, str(mx.float32)): None})
    monkeypatch.setattr(attention, "_record", lambda: rec)
    y = attention.few_row_attention(q, k, v, None, scale=0.2, mask="causal", sinks=sinks)
    assert calls[-1][:2] == (True, 0) and calls[-1][2] is sinks
    assert attention.attention_within_tolerance(y, q, k, v, 0.2, True, 0, sinks)[0]
    assert not attention.attention_within_tolerance(y, q, k, v, 0.2, True)[0]  # the sinks changed the answer

    class Windowed:  # what few_row_attention reads of mlxspec's WindowKVCache
        attention_window = 5

    attention.few_row_attention(q, k, v, Windowed(), scale=0.2, mask=mx.ones((3, 20), mx.bool_), sinks=sinks)
    assert calls[-1][:2] == (True, 5) and calls[-1][2] is sinks
    wrong_shape = mx.zeros((3,))  # not one per head: mlx-lm's function (and its error) as before
    with pytest.raises(ValueError):
        attention.few_row_attention(q, k, v, None, scale=0.2, mask="causal", sinks=wrong_shape)
    assert len(calls) == 2


def test_shapes_the_kernels_would_read_past_go_to_the_model_s_own_attention(cpu_ext):
    """k's dims must be q's, and v's batch, heads and keys k's: else the kernels would read past a buffer (the GPU
    wrapper refuses such calls), so the routing leaves them to mlx-lm's op."""
    rec = attention._record()
    q, k, v = inputs(4, 2, 1, 10, 64, 48, mx.float32)
    assert attention._usable(rec, q, k, v, None, None, None)
    assert not attention._usable(rec, q, k[..., :32], v, None, None, None)  # k narrower than q
    assert not attention._usable(rec, q, k, v[:, :, :9], None, None, None)  # fewer values than keys
    assert not attention._usable(rec, q, k, v[:, :1], None, None, None)  # fewer value heads than key heads


def test_llama_4_s_chunked_layers_attend_within_their_chunk_through_the_kernel(tmp_path):
    """Llama 4's chunked layers (mlx-lm's ChunkedKVCache, chunks of 8 here) go to the kernel as causal attention
    over each chunk's keys, a call per chunk a pass reaches: the logits of one-row steps and of passes that cross
    a chunk's end agree with mlx-lm's masked attention, and every row of a pass is its one-row step's."""
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm_architectures import architecture_dir

    from mlxspec.exactness import RowInvariance
    from mlxspec.loading import load

    model = load(str(architecture_dir(tmp_path, "llama4"))).model
    tokens = [5 + (7 * i) % 250 for i in range(30)]
    passes = [tokens[:13], tokens[13:14], tokens[14:17], tokens[17:18], tokens[18:25], tokens[25:30]]

    def run():
        cache = make_prompt_cache(model)
        return mx.concatenate([model(mx.array([p]), cache=cache)[0] for p in passes])

    theirs = run()
    calls = []
    routed = attention.use_attention_kernel(model)
    assert routed["routed"] > 0 and routed["error"] is None
    kernel = attention._record().fn
    try:
        attention._record().fn = lambda q, *a, **kw: calls.append(q.shape[2]) or kernel(q, *a, **kw)
        ours = run()
    finally:
        attention._record().fn = kernel
    assert mx.allclose(ours, theirs, atol=1e-4).item()
    # the 7-row pass (positions 18..24): each of the 3 chunked layers calls for 18..23 and 24, the global one once
    assert calls.count(6) == 3 and calls.count(7) == 1 and calls.count(13) == 1  # (13: the prompt's global layer)
    assert RowInvariance(model).holds(6)
    attention.restore_attention(model)
