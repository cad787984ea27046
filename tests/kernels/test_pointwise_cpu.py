"""The CPU RMSNorm, RoPE and SwiGLU kernels against MLX's ops, across row counts, and swapped into a model.

Agreement with MLX is to rounding (pointwise.TOL per dtype: MLX rounds some intermediates to the
dtype); row independence is bit for bit (row i of an M-row call = the call on that row alone).
"""

from __future__ import annotations

import math
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.activations import swiglu as mlx_lm_swiglu

from mlxspec.kernels import pointwise
from mlxspec.kernels.pointwise import (KernelOffsetRMSNorm, KernelRMSNorm, KernelRoPE, inverse_frequencies,
                                       restore_pointwise, use_pointwise_kernels)

DTYPES = [mx.float32, mx.float16, mx.bfloat16]


def strided(shape, dtype, seed, scale=3.0):
    """A non-contiguous view, like the transposed projections a model hands these ops."""
    big = mx.random.normal((*shape[:-1], shape[-1] + 5), key=mx.random.key(seed)) * scale
    return big[..., 2 : shape[-1] + 2].astype(dtype)


def assert_close(y, ref):
    assert y.dtype == ref.dtype and y.shape == ref.shape
    err = mx.abs(y.astype(mx.float32) - ref.astype(mx.float32)).max().item()
    bound = pointwise.TOL[ref.dtype] * mx.abs(ref.astype(mx.float32)).max().item()
    assert err <= bound, f"max error {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_mlx_and_rows_are_independent(cpu_ext, dtype):
    x = strided((2, 8, 200), dtype, 0)
    w = (1 + 0.3 * mx.random.normal((200,), key=mx.random.key(1))).astype(dtype)
    y = cpu_ext.rms_norm(x, w, 1e-5, stream=mx.cpu)
    assert_close(y, mx.fast.rms_norm(x, w, 1e-5))
    for m in range(1, 9):
        ym = cpu_ext.rms_norm(x[:, :m], w, 1e-5, stream=mx.cpu)
        assert mx.array_equal(ym, y[:, :m]).item(), f"M={m}"


def test_rms_norm_promotes_like_mlx(cpu_ext):
    x, w = strided((1, 3, 64), mx.float16, 2), mx.ones((64,), mx.float32)
    y = cpu_ext.rms_norm(x, w, 1e-6, stream=mx.cpu)
    assert y.dtype == mx.float32
    assert_close(y, mx.fast.rms_norm(x, w, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("traditional", [True, False])
def test_rope_matches_mlx_at_every_offset(cpu_ext, dtype, traditional):
    x = strided((1, 8, 4, 96), dtype, 3).transpose(0, 2, 1, 3)  # (B, heads, T, D) view; 64 of 96 dims rotate
    for base, scale in ((10000.0, 1.0), (500000.0, 0.25)):
        inv = inverse_frequencies(64, base)
        for offset in (0, 1, 255, 4099):
            y = cpu_ext.rope(x, inv, 64, traditional, scale, offset, stream=mx.cpu)
            ref = mx.fast.rope(x, 64, traditional=traditional, base=base, scale=scale, offset=offset)
            assert_close(y, ref)
            assert mx.array_equal(y[..., 64:], x[..., 64:]).item()


def test_rope_row_i_equals_a_one_row_call_at_offset_plus_i(cpu_ext):
    x = strided((1, 9, 8, 64), mx.float32, 4).transpose(0, 2, 1, 3)  # (1, 8, 9, 64) view
    inv = inverse_frequencies(64, 10000.0)
    full = cpu_ext.rope(x, inv, 64, True, 1.0, 300, stream=mx.cpu)
    for i in range(9):
        one = cpu_ext.rope(x[:, :, i : i + 1], inv, 64, True, 1.0, 300 + i, stream=mx.cpu)
        assert mx.array_equal(one[:, :, 0], full[:, :, i]).item(), f"row {i}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_matches_mlx_lm_including_both_tails(cpu_ext, dtype):
    g = strided((2, 8, 300), dtype, 5, scale=30.0)  # silu saturates both ways: exp must not overflow
    u = strided((2, 8, 300), dtype, 6)
    y = cpu_ext.swiglu(g, u, stream=mx.cpu)
    assert_close(y, mlx_lm_swiglu(g, u))
    assert mx.all(mx.isfinite(y)).item()
    for m in (1, 5):
        assert mx.array_equal(cpu_ext.swiglu(g[:, :m], u[:, :m], stream=mx.cpu), y[:, :m]).item()


@pytest.mark.parametrize("dtype", DTYPES)
def test_geglu_matches_gelu_approx_including_both_tails(cpu_ext, dtype):
    g = strided((2, 8, 300), dtype, 5, scale=30.0)  # GELU saturates both ways: the sigmoid must not overflow
    u = strided((2, 8, 300), dtype, 6)
    y = cpu_ext.geglu(g, u, stream=mx.cpu)
    assert_close(y, nn.gelu_approx(g) * u)
    small = strided((2, 8, 300), dtype, 7, scale=0.5)  # near 0, where tanh's form cancels
    assert_close(cpu_ext.geglu(small, u, stream=mx.cpu), nn.gelu_approx(small) * u)
    assert mx.all(mx.isfinite(y)).item()
    for m in (1, 5):
        assert mx.array_equal(cpu_ext.geglu(g[:, :m], u[:, :m], stream=mx.cpu), y[:, :m]).item()


def test_bad_arguments_are_refused(cpu_ext):
    x = mx.ones((1, 2, 8))
    with pytest.raises(ValueError, match="weight"):
        cpu_ext.rms_norm(x, mx.ones((7,)), 1e-5, stream=mx.cpu)
    with pytest.raises(ValueError, match="dims"):
        cpu_ext.rope(x, mx.ones((5,)), 10, False, 1.0, 0, stream=mx.cpu)
    with pytest.raises(ValueError, match="inv_freq"):
        cpu_ext.rope(x, mx.ones((3,)), 8, False, 1.0, 0, stream=mx.cpu)
    with pytest.raises(ValueError, match="one shape"):
        cpu_ext.swiglu(x, mx.ones((1, 2, 4)), stream=mx.cpu)
    with pytest.raises(ValueError, match="float"):
        cpu_ext.swiglu(x.astype(mx.int32), x.astype(mx.int32), stream=mx.cpu)


def test_inverse_frequencies_are_mlx_fallbacks(cpu_ext):
    """The same fp32 computation as mx.fast.rope's fallback: exp(-i * log(base) / half)."""
    half = 16
    ref = mx.exp(mx.arange(0, -half, -1, dtype=mx.float32) * (math.log(10000.0) / half))
    assert mx.allclose(inverse_frequencies(32, 10000.0), ref, rtol=1e-6).item()


# ---------------------------------------------------------------- in a model


def llama3_rope(which: str):
    """Llama 3.x rope scaling as mlx-lm builds it from a config, or as a GGUF's rope_freqs tensor gives it."""
    from mlx_lm.models.rope_utils import Llama3RoPE

    from mlxspec.gguf_rope import FreqFactorRoPE

    if which == "mlx-lm":
        scaling = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}
        return Llama3RoPE(64, 131072, False, 500000.0, scaling)
    return FreqFactorRoPE(64, 500000.0, True, mx.linspace(1.0, 8.0, 32))


@pytest.mark.parametrize("which", ["mlx-lm", "gguf"])
def test_llama3_rope_runs_the_kernel_and_is_given_back(cpu_ext, which):
    class Holder(nn.Module):
        def __init__(self, rope):
            super().__init__()
            self.rope = rope

    original = llama3_rope(which)
    holder = Holder(original)
    assert use_pointwise_kernels(holder)["swapped"]["rope"] == 1 and isinstance(holder.rope, KernelRoPE)
    x = strided((1, 9, 4, 64), mx.float32, 5).transpose(0, 2, 1, 3)
    for offset in (0, 300, 9000):
        assert_close(holder.rope(x, offset=offset), original(x, offset=offset))
    sig = ("rope", 64, 64, original.traditional, holder.rope._key, 1.0, str(mx.float32))
    assert pointwise._record().checks.get(sig, "never checked") is None  # these periods' self-check ran and passed
    full = holder.rope(x, offset=300)
    for i in (0, 4, 8):  # rows independent of the row count, bit for bit
        assert mx.array_equal(holder.rope(x[:, :, i : i + 1], offset=300 + i)[:, :, 0], full[:, :, i]).item()
    # a compiled step's position (one number in an array) runs the kernel: the bits of the same integer offset
    assert mx.array_equal(holder.rope(x, offset=mx.array(300)), full).item()
    per_sequence = mx.array([7, 9])  # a batch's offsets keep MLX's op
    y = holder.rope(mx.concatenate([x, x]), offset=per_sequence)
    assert mx.array_equal(y, original(mx.concatenate([x, x]), offset=per_sequence)).item()
    restore_pointwise(holder)
    assert holder.rope is original


def test_model_swap_keeps_logits_and_restores(cpu_ext, tiny_llama):
    from mlxspec.loading import load

    model = load(str(tiny_llama)).model
    x = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    before = model(x)
    report = use_pointwise_kernels(model)
    try:
        layers = len(model.model.layers)
        assert report["swapped"] == {"rms_norm": 2 * layers + 1, "rope": layers}
        assert report["swiglu"] == layers  # each block's MLP, this model only
        after = model(x)
        assert mx.allclose(after, before, atol=1e-4, rtol=1e-4).item()
        assert mx.array_equal(after.argmax(-1), before.argmax(-1)).item()
        assert pointwise.pointwise_status()["passed"], "the calls went to the kernels after their self-checks"
    finally:
        restore_pointwise(model)
    assert not any(isinstance(m, (KernelRMSNorm, KernelRoPE)) for _, m in model.named_modules())
    import mlx_lm.models.llama as llama

    assert llama.swiglu is mlx_lm_swiglu  # mlx-lm's module was never touched
    assert mx.array_equal(model(x), before).item()


def test_gemma_norms_and_mlps_run_the_kernels_and_are_given_back(cpu_ext, tmp_path):
    """gemma3's norms (weight stored as w - 1, normed with 1.0 + w): the kernel over 1.0 + w; its MLPs:
    the geglu kernel; the module's parameters untouched, the original modules back after restore."""
    import sys

    from mlx.utils import tree_flatten

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from gguf_fixtures import Dims, write_tiny_llama_gguf
    from mlxspec.loading import load

    path = write_tiny_llama_gguf(tmp_path / "g3.gguf", "Q8_0", arch="gemma3", tokenizer="llama",
                                 dims=Dims(layers=6, head_dim=32), metadata={"attention.sliding_window": 4})
    model = load(str(path)).model
    norms = {p: m for p, m in model.named_modules() if type(m).__name__ == "RMSNorm"}
    params = dict(tree_flatten(model.parameters()))
    x = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    before = model(x)
    report = use_pointwise_kernels(model)
    try:
        assert report["swapped"]["rms_norm"] == len(norms) == 6 * 6 + 1  # 4 a block, q/k heads, the final one
        assert report["geglu"] == 6 and report["swiglu"] == 0
        mlp = model.model.layers[0].mlp
        h = strided((1, 3, mlp.gate_proj.scales.shape[1] * mlp.gate_proj.group_size), mx.float32, 5)
        assert mx.array_equal(mlp(h), mlp.down_proj(pointwise.kernel_geglu(mlp.gate_proj(h), mlp.up_proj(h)))).item()
        layer = model.model.layers[0]
        norm = layer.input_layernorm
        assert isinstance(norm, KernelOffsetRMSNorm)
        h = strided((1, 3, norm.weight.shape[0]), mx.float32, 4)
        assert mx.array_equal(norm(h), pointwise._ext().rms_norm(h, 1.0 + norm.weight, norm.eps, stream=mx.cpu)).item()
        assert_close(norm(h), mx.fast.rms_norm(h, 1.0 + norm.weight, norm.eps))
        after = dict(tree_flatten(model.parameters()))
        assert after.keys() == params.keys() and all(after[k] is params[k] for k in params)  # nothing added
        assert mx.allclose(model(x), before, atol=1e-4, rtol=1e-4).item()
    finally:
        restore_pointwise(model)
    assert {p: m for p, m in model.named_modules() if type(m).__name__ == "RMSNorm"} == norms
    from mlx_lm.models.gemma3_text import MLP

    assert all(type(layer.mlp) is MLP for layer in model.model.layers)
    assert all(norms[p] is m for p, m in model.named_modules() if p in norms)
    assert mx.array_equal(model(x), before).item()


def test_array_offsets_and_failed_checks_use_mlx(cpu_ext, monkeypatch, request):
    rope = KernelRoPE.wrap(nn.RoPE(32, traditional=False, base=10000.0))
    x = strided((1, 2, 3, 32), mx.float32, 7)
    offsets, two = mx.array([5, 9]), mx.concatenate([x, x])  # one offset per sequence of a batch
    assert mx.array_equal(rope(two, offset=offsets), mx.fast.rope(two, 32, traditional=False, base=10000.0,
                                                                   scale=1.0, offset=offsets)).item()

    class Wrong:  # an extension whose rope is off by a lot: its self-check must fail
        def __getattr__(self, name):
            return getattr(cpu_ext, name)

        def rope(self, x, *args, **kwargs):
            return cpu_ext.rope(x, *args, **kwargs) * 1.01

    monkeypatch.setattr(pointwise, "_ext", lambda: Wrong())
    pointwise._record().checks.clear()
    request.addfinalizer(pointwise._record().checks.clear)  # the good kernel's checks run again later
    y = rope(x, offset=3)
    assert mx.array_equal(y, mx.fast.rope(x, 32, traditional=False, base=10000.0, scale=1.0, offset=3)).item()
    failed = pointwise.pointwise_status()["failed"]
    assert len(failed) == 1 and "disagrees" in next(iter(failed.values()))
