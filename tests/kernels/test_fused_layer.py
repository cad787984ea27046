"""The fused decoder layer (one primitive per block) against the module path with the same kernels.

The promise: bit-identical logits and KV caches to the per-op kernels (so greedy output cannot
change), rows independent of the row count (so verification stays exact), far fewer graph nodes,
and the module path for everything the primitive does not handle.
"""

from __future__ import annotations

import re

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache, make_prompt_cache

from mlxspec.bench.memory import allocated
from mlxspec.cache import HalfKVCache, store_kv_in_half
from mlxspec.exactness import RowInvariance
from mlxspec.kernels import registry
from mlxspec.kernels.fused_layer import FUSED_FROM, fused, restore_fused_layers, use_fused_layers
from mlxspec.kernels.install import install_kernels, remove_kernels
from mlxspec.loading import load


@pytest.fixture(autouse=True)
def fresh_registry():
    registry.reset()
    yield
    registry.reset()


def loaded(path, quantize="q4g32", activations="f32"):
    model = load(str(path), quantize).model
    report = install_kernels(model, fuse=False, activations=activations)
    assert report["backend"] == "cpu"
    return model


def decode(model, prompt, steps, rows=1):
    """Prefill, then `steps` forwards of `rows` fixed tokens each: every logit row and the caches."""
    cache = make_prompt_cache(model)
    outs = [model(mx.array([prompt]), cache=cache)]
    for i in range(steps):
        outs.append(model(mx.array([[(7 * i + r) % 97 + 3 for r in range(rows)]]), cache=cache))
    mx.eval(outs, [c.state for c in cache])
    return outs, cache


@pytest.mark.parametrize("arch,quantize", [("llama", "q4g32"), ("qwen2", "q4g32"), ("llama", "q8g64")])
def test_fused_equals_the_module_path_bit_for_bit(request, cpu_ext, arch, quantize):
    model = loaded(request.getfixturevalue(f"tiny_{arch}"), quantize)
    prompt = [5, 17, 42, 7, 99, 3, 12]
    for rows in (1, 3):
        want, want_cache = decode(model, prompt, 6, rows)
        report = use_fused_layers(model)
        assert report["fused"] == len(model.model.layers) and not report["kept"], report
        got, got_cache = decode(model, prompt, 6, rows)
        restore_fused_layers(model)
        for w, g in zip(want, got):
            assert w.dtype == g.dtype and mx.array_equal(w, g).item()
        for a, b in zip(want_cache, got_cache):
            assert a.offset == b.offset
            assert mx.array_equal(a.keys[..., : a.offset, :], b.keys[..., : b.offset, :]).item()
            assert mx.array_equal(a.values[..., : a.offset, :], b.values[..., : b.offset, :]).item()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fused_equals_the_module_path_over_a_half_cache(request, cpu_ext, arch):
    """float32 blocks writing a float16 cache (HalfKVCache, GGUF models' default): the same bits as
    the module path, where the cache rounds the keys and attention reads them back as float32."""
    model = loaded(request.getfixturevalue(f"tiny_{arch}"))
    store_kv_in_half(model)
    prompt = [5, 17, 42, 7, 99, 3, 12]
    for rows in (1, 3):
        want, want_cache = decode(model, prompt, 6, rows)
        assert want[-1].dtype == mx.float32 and want_cache[0].keys.dtype == mx.float16
        use_fused_layers(model)
        got, got_cache = decode(model, prompt, 6, rows)
        plans = [b._mlxspec_plan.ok for b in model.model.layers]
        restore_fused_layers(model)
        assert all(ok[mx.float32, HalfKVCache, False] == (True, mx.float16) for ok in plans), plans  # the primitive ran
        for w, g in zip(want, got):
            assert w.dtype == g.dtype and mx.array_equal(w, g).item()
        for a, b in zip(want_cache, got_cache):
            assert a.offset == b.offset and b.keys.dtype == b.values.dtype == mx.float16
            assert mx.array_equal(a.keys[..., : a.offset, :], b.keys[..., : b.offset, :]).item()
            assert mx.array_equal(a.values[..., : a.offset, :], b.values[..., : b.offset, :]).item()
    sdpa_checks = registry.kernel("sdpa").checks
    assert any("mlx.core.float16" in sig and why is None for sig, why in sdpa_checks.items()), sdpa_checks
    use_fused_layers(model)
    assert RowInvariance(model).holds(8), "verify rows over a half cache must equal one-row steps"


@pytest.mark.parametrize("which", ["mlx-lm", "gguf"])
def test_llama3_rope_blocks_are_fused_bit_for_bit(tiny_llama, cpu_ext, which):
    """Llama 3.x rope scaling (mlx-lm's Llama3RoPE from a config, or a GGUF's rope_freqs tensor) runs
    the rope kernel, so its blocks fuse; logits and cache stay the module path's bits."""
    from mlx_lm.models.rope_utils import Llama3RoPE

    from mlxspec.gguf_rope import FreqFactorRoPE

    model = load(str(tiny_llama), "q4g32").model
    dims, traditional = model.model.layers[0].self_attn.rope.dims, model.model.layers[0].self_attn.rope.traditional
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    rope = (Llama3RoPE(dims, 2048, traditional, 500000.0, scaling) if which == "mlx-lm"
            else FreqFactorRoPE(dims, 500000.0, traditional, mx.linspace(1.0, 8.0, dims // 2)))
    for layer in model.model.layers:
        layer.self_attn.rope = rope
    reference, _ = decode(model, [5, 17, 42, 7], 2)  # MLX's own ops
    install_kernels(model, fuse=False)
    want, want_cache = decode(model, [5, 17, 42, 7], 5, rows=2)
    report = use_fused_layers(model)
    assert report["fused"] == len(model.model.layers) and not report["kept"], report
    got, got_cache = decode(model, [5, 17, 42, 7], 5, rows=2)
    assert all(w.dtype == g.dtype and mx.array_equal(w, g).item() for w, g in zip(want, got))
    assert all(mx.array_equal(a.keys[..., : a.offset, :], b.keys[..., : b.offset, :]).item()
               for a, b in zip(want_cache, got_cache))
    assert mx.allclose(want[0], reference[0], atol=1e-3, rtol=1e-3).item()  # and near MLX's ops throughout
    remove_kernels(model)
    assert all(layer.self_attn.rope is rope for layer in model.model.layers)


@pytest.mark.parametrize("kv_cache", ["f16", "f32"])
def test_qwen3_blocks_with_head_norms_are_fused_bit_for_bit(tmp_path, cpu_ext, kv_cache):
    """qwen3's RMSNorm of each q and k head runs inside the fused block: the module path's bits, over
    either cache a GGUF model may have, and rows that equal one-row steps."""
    from gguf_fixtures import Dims, write_tiny_llama_gguf

    path = write_tiny_llama_gguf(tmp_path / "qwen3.gguf", "Q4_0", arch="qwen3", dims=Dims(head_dim=32))
    model = load(str(path), kv_cache=kv_cache).model
    install_kernels(model, fuse=False)
    prompt = [5, 17, 42, 7, 99, 3]
    want, want_cache = decode(model, prompt, 5, rows=3)
    report = use_fused_layers(model)
    assert report["fused"] == len(model.model.layers) and not report["kept"], report
    got, got_cache = decode(model, prompt, 5, rows=3)
    kv = mx.float16 if kv_cache == "f16" else mx.float32
    oks = [b._mlxspec_plan.ok for b in model.model.layers]
    assert all(list(ok.values()) == [(True, kv)] for ok in oks), oks  # the primitive ran: its self-check passed
    assert all(w.dtype == g.dtype and mx.array_equal(w, g).item() for w, g in zip(want, got))
    assert all(mx.array_equal(a.keys[..., : a.offset, :], b.keys[..., : b.offset, :]).item()
               for a, b in zip(want_cache, got_cache))
    assert RowInvariance(model).holds(6)


@pytest.mark.parametrize("kv_cache", ["f16", "f32"])
def test_gemma3_blocks_are_fused_bit_for_bit_over_sliding_windows(tmp_path, cpu_ext, kv_cache):
    """gemma3's blocks (head norms, sandwich norms, GeGLU; 5 of 6 layers over a 4-position sliding
    window) run fused with the module path's bits, through the window cache's compaction (past 261
    positions) and in either cache; rows equal one-row steps."""
    from gguf_fixtures import Dims, write_tiny_llama_gguf
    from mlxspec.cache import WindowKVCache
    from mlxspec.kernels.fused_layer import _applies

    path = write_tiny_llama_gguf(tmp_path / "gemma3.gguf", "Q4_0", arch="gemma3", tokenizer="llama",
                                 dims=Dims(layers=6, head_dim=32), metadata={"attention.sliding_window": 4})
    model = load(str(path), kv_cache=kv_cache).model
    install_kernels(model, fuse=False)
    prompt = [5, 17, 42, 7, 99, 3, 12]
    want, want_cache = decode(model, prompt, 90, rows=3)
    report = use_fused_layers(model)
    assert report["fused"] == len(model.model.layers) and not report["kept"], report
    got, got_cache = decode(model, prompt, 90, rows=3)
    windows = [c for c in got_cache if isinstance(c, WindowKVCache)]
    assert len(windows) == 5 and all(c.start > 0 for c in windows)  # compacted on the way
    kv = mx.float16 if kv_cache == "f16" else mx.float32
    oks = [b._mlxspec_plan.ok for b in model.model.layers]
    assert all([v for v in ok.values()] == [(True, kv)] for ok in oks), oks  # the primitive ran, its check passed
    assert all(w.dtype == g.dtype and mx.array_equal(w, g).item() for w, g in zip(want, got))
    for a, b in zip(want_cache, got_cache):
        assert a.offset == b.offset and getattr(a, "start", 0) == getattr(b, "start", 0)
        assert all(mx.array_equal(x, y).item() for x, y in zip(a.state[:2], b.state[:2]))
    assert RowInvariance(model).holds(6)
    block = model.model.layers[0]  # float16: gemma3 clips its residual adds there, the fused block does not
    assert not _applies(block, mx.zeros((1, 1, 64), mx.float16), None, KVCache())


def test_bfloat16_gemma3_blocks_with_scaled_rope_are_fused_bit_for_bit(cpu_ext):
    """mlx-community's gemma3 models compute in bfloat16 (4-bit layers, linear rope scaling on the
    global layers): the fused blocks give the module path's bits there too."""
    import mlx.nn as nn
    from mlx_lm.models import gemma3_text

    from mlxspec.cache import exact_windows

    args = gemma3_text.ModelArgs(model_type="gemma3_text", hidden_size=256, num_hidden_layers=6, intermediate_size=512,
                                 num_attention_heads=4, head_dim=64, num_key_value_heads=2, vocab_size=300,
                                 sliding_window=4, rope_scaling={"factor": 8.0, "rope_type": "linear"})
    mx.random.seed(0)
    model = gemma3_text.Model(args)
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=64, bits=4)
    exact_windows(model)
    install_kernels(model, fuse=False)
    prompt = [5, 17, 42, 7, 99, 3]
    want, _ = decode(model, prompt, 20, rows=3)
    report = use_fused_layers(model)
    assert report["fused"] == 6 and not report["kept"], report
    got, _ = decode(model, prompt, 20, rows=3)
    assert all(list(b._mlxspec_plan.ok.values()) == [(True, mx.bfloat16)] * len(b._mlxspec_plan.ok)
               for b in model.model.layers)
    assert want[0].dtype == mx.bfloat16 and all(mx.array_equal(w, g).item() for w, g in zip(want, got))


def test_phi3_blocks_are_fused_bit_for_bit_from_row_slices(tmp_path, cpu_ext):
    """phi3 computes q/k/v and gate/up as one matmul each: the fused block takes them as row slices
    of those layers (views, evaluated once) and gives the module path's bits; rows equal one-row steps."""
    from gguf_fixtures import write_tiny_llama_gguf
    from mlxspec.kernels.fused_layer import RowSlice, _projections

    path = write_tiny_llama_gguf(tmp_path / "phi3.gguf", "Q4_0", arch="phi3")
    model = load(str(path)).model
    install_kernels(model, fuse=False)
    prompt = [5, 17, 42, 7, 99, 3]
    want, want_cache = decode(model, prompt, 8, rows=3)
    report = use_fused_layers(model)
    assert report["fused"] == len(model.model.layers) and not report["kept"], report
    block = model.model.layers[0]
    projs = _projections(block)
    assert [type(p) is RowSlice for p in projs] == [True, True, True, False, True, True, False]
    qkv = block.self_attn.qkv_proj["weight"]
    assert mx.array_equal(mx.concatenate([p["weight"] for p in projs[:3]]), qkv).item()  # q, k, v: every row once
    got, got_cache = decode(model, prompt, 8, rows=3)
    assert all(list(b._mlxspec_plan.ok.values())[0][0] for b in model.model.layers)  # the primitive ran
    assert all(w.dtype == g.dtype and mx.array_equal(w, g).item() for w, g in zip(want, got))
    assert all(mx.array_equal(a.keys[..., : a.offset, :], b.keys[..., : b.offset, :]).item()
               for a, b in zip(want_cache, got_cache))
    assert RowInvariance(model).holds(6)


def test_fused_rows_equal_one_row_steps(tiny_llama, cpu_ext):
    model = loaded(tiny_llama)
    use_fused_layers(model)
    assert RowInvariance(model).holds(8), "verify rows must equal one-row steps"
    assert all(f is None for f in registry.kernel("fused_layer", "cpu").checks.values())


@pytest.mark.parametrize("quantize", ["q4g32", "q8g64"])
def test_int8_activation_blocks_are_fused_bit_for_bit(request, cpu_ext, quantize):
    """activations='q8': the fused block quantizes each projection's input as the q8 qmm does, so
    logits and caches equal the module path's, and verify rows equal one-row steps."""
    model = loaded(request.getfixturevalue("tiny_llama"), quantize, activations="q8")
    assert {m._qmm.activations for _, m in model.named_modules() if hasattr(m, "_qmm")} == {"q8"}
    prompt = [5, 17, 42, 7, 99, 3, 12]
    for rows in (1, 3):
        want, _ = decode(model, prompt, 6, rows)
        report = use_fused_layers(model)
        assert report["fused"] == len(model.model.layers), report
        got, _ = decode(model, prompt, 6, rows)
        assert RowInvariance(model).holds(8)
        restore_fused_layers(model)
        assert all(w.dtype == g.dtype and mx.array_equal(w, g).item() for w, g in zip(want, got))
    q8_logits, _ = decode(model, prompt, 2)
    f32_logits, _ = decode(loaded(request.getfixturevalue("tiny_llama"), quantize), prompt, 2)
    assert not mx.array_equal(q8_logits[0], f32_logits[0]).item(), "q8 activations changed nothing"
    assert mx.allclose(q8_logits[0], f32_logits[0], atol=0.1, rtol=0.05).item()  # int8 rounding, not a bug


def test_a_step_is_a_few_nodes_per_layer(tiny_llama, cpu_ext, tmp_path):
    model = loaded(tiny_llama)

    def nodes():
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array([[1, 2, 3, 4]]), cache=cache))
        mx.export_to_dot(str(tmp_path / "step.dot"), model(mx.array([[5]]), cache=cache))
        return re.findall(r'label ="(\w+)"', (tmp_path / "step.dot").read_text())

    per_op = nodes()
    use_fused_layers(model)
    fused_nodes = nodes()
    layers = len(model.model.layers)
    assert fused_nodes.count("MlxspecFusedDecoderLayer") == layers
    assert "MlxspecFewRowAttention" not in fused_nodes and "MlxspecFewRowAttention" in per_op
    assert (len(per_op) - len(fused_nodes)) / layers >= 20  # ~27 nodes a layer become 3 (the layer, 2 cache writes)


def test_cache_grows_and_trims_as_mlx_lm_does(tiny_llama, cpu_ext):
    """Past a 256-row allocation step, after a trim (speculation's rewind), and a fresh cache."""
    model = loaded(tiny_llama)
    tokens = [(13 * i) % 200 + 3 for i in range(300)]

    def run():
        cache = make_prompt_cache(model)
        model(mx.array([tokens[:250]]), cache=cache)
        outs = []
        for i in range(250, 270):
            outs.append(model(mx.array([[tokens[i]]]), cache=cache))
            if i == 260:
                for c in cache:
                    c.trim(3)
        mx.eval(outs)
        return outs, cache

    want, want_cache = run()
    use_fused_layers(model)
    got, got_cache = run()
    assert all(mx.array_equal(w, g).item() for w, g in zip(want, got))
    assert got_cache[0].keys.shape == want_cache[0].keys.shape and got_cache[0].offset == want_cache[0].offset


def test_an_array_offset_gives_the_bits_of_an_int_offset(tiny_llama, cpu_ext):
    """Compiled steps hand the primitive its position as an array, read when the step runs: the same
    output and cache writes as the number; another position, other bits (the array is read)."""
    model = loaded(tiny_llama)
    use_fused_layers(model)
    block = model.model.layers[0]
    dims = block.input_layernorm.weight.shape[0]

    def prefilled() -> KVCache:  # each call writes into its own cache's buffers (in place)
        cache = KVCache()
        mx.eval(block(mx.random.normal((1, 5, dims), key=mx.random.key(2)), "causal", cache))
        return cache

    x = mx.random.normal((1, 3, dims), key=mx.random.key(3))
    layer = block._mlxspec_plan.layer
    (a, b, c) = (prefilled() for _ in range(3))
    want = layer(x, a.keys, a.values, 5)
    got = layer(x, b.keys, b.values, mx.array([5], dtype=mx.int32))
    mx.eval(want, got)
    assert all(mx.array_equal(w[..., :8, :], g[..., :8, :]).item() for w, g in zip(want, got))
    other = layer(x, c.keys, c.values, mx.array(4))
    assert not mx.array_equal(other[0], want[0]).item()
    with pytest.raises(ValueError, match="window"):
        layer(x, c.keys, c.values, mx.array([5]), window=4)


def test_a_step_writes_its_rows_into_the_cache_in_place(tiny_llama, cpu_ext):
    """Evaluated as decoding evaluates it (its logits; the cache's buffers with the next step), a step
    copies no cache: MLX's update takes the old buffer over once the layer that read it has run."""
    model = loaded(tiny_llama)
    use_fused_layers(model)
    cache = make_prompt_cache(model)
    model(mx.array([[(5 * i) % 300 + 1 for i in range(4000)]]), cache=cache)
    mx.eval([c.state for c in cache])
    mx.eval(model(mx.array([[3]]), cache=cache))
    held = sum(c.keys.nbytes + c.values.nbytes for c in cache)
    x = mx.array([[7]])
    mx.eval(x)
    with allocated() as grew:
        mx.eval(model(x, cache=cache))
        mx.eval([c.keys for c in cache])
    assert grew["bytes"] < held / 4, f"a step allocated {grew['bytes']} bytes: it copied the cache ({held} bytes)"


def test_what_the_primitive_does_not_handle_keeps_the_modules(tiny_llama, cpu_ext):
    model = loaded(tiny_llama)
    use_fused_layers(model)
    block = model.model.layers[0]
    x = mx.random.normal((2, 3, block.input_layernorm.weight.shape[0]), key=mx.random.key(1))
    base = getattr(type(block), FUSED_FROM)
    for cache, mask in ((KVCache(), "causal"), (None, "causal")):  # a batch of 2; no cache
        want = base.__call__(block, x, mask, None if cache is None else KVCache())
        assert mx.array_equal(block(x, mask, cache), want).item()
    arr_mask = mx.ones((3, 3), dtype=mx.bool_)  # an explicit mask array
    want = base.__call__(block, x[:1], arr_mask, KVCache())
    assert mx.array_equal(block(x[:1], arr_mask, KVCache()), want).item()


def test_a_failed_self_check_keeps_the_modules(tiny_llama, cpu_ext, monkeypatch, caplog):
    import mlxspec.kernels.fused_layer as fl

    model = loaded(tiny_llama)
    want, _ = decode(model, [5, 6, 7], 3)
    use_fused_layers(model)
    monkeypatch.setattr(fl, "_self_check", lambda block, dtype, cache_class, kv, view: "disagrees (simulated)")
    got, _ = decode(model, [5, 6, 7], 3)
    assert all(mx.array_equal(w, g).item() for w, g in zip(want, got))
    assert "disagrees (simulated)" in caplog.text
    assert not any(ok for plan in (b._mlxspec_plan for b in model.model.layers) for ok, _ in plan.ok.values())


def test_blocks_whose_parts_lack_kernels_are_not_fused(tiny_llama, cpu_ext):
    model = load(str(tiny_llama), "q4g32").model  # no kernels installed
    report = use_fused_layers(model)
    assert report["fused"] == 0 and len(report["kept"]) == len(model.model.layers)
    assert "qmm kernel" in next(iter(report["kept"].values()))


def test_remove_kernels_restores_the_blocks(tiny_llama, cpu_ext):
    model = load(str(tiny_llama), "q4g32").model
    report = install_kernels(model)
    assert report["fused"]["fused"] == len(model.model.layers) and fused(model)
    remove_kernels(model)
    assert not fused(model) and not hasattr(model.model.layers[0], "_mlxspec_plan")


def test_doctor_check_builds_and_checks_a_block(cpu_ext):
    from mlxspec.kernels.fused_layer import check_typical

    check_typical()
    status = registry.kernel("fused_layer", "cpu").status()
    assert status["active"] and status["passed"] and not status["failed"]


def test_engine_setting_ops_keeps_the_per_op_kernels(tiny_llama, cpu_ext, monkeypatch):
    from mlxspec.engine import Engine

    monkeypatch.setenv("MLXSPEC_KERNELS", "ops")
    ops = Engine.load(str(tiny_llama), quantize="q4g32")
    monkeypatch.setenv("MLXSPEC_KERNELS", "1")
    fused_engine = Engine.load(str(tiny_llama), quantize="q4g32")
    assert "fused" not in ops.kernels["target"] and not fused(ops.target.model)
    assert fused_engine.kernels["target"]["fused"]["fused"] == len(fused_engine.target.model.model.layers)
