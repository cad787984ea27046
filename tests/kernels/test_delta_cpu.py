"""The CPU gated delta rule kernel (Qwen3.5, Qwen3-Next) against mlx-lm's ops, across token counts, and
routed into a model.

Agreement with mlx-lm is to summation order (delta.TOL); a call over T tokens equals T one-token calls bit
for bit, which is what greedy verification needs of a recurrent layer.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.gated_delta import compute_g, gated_delta_ops, gated_delta_update

from mlxspec.kernels import delta, registry
from mlxspec.kernels.delta import KernelCausalConv, kernel_gated_delta_update, restore_delta, use_delta_kernel
from mlxspec.kernels.hooks import routed
from mlxspec.loading import load
from model_factory import make_model_dir  # tests/conftest.py puts tests/ on the path


def inputs(T, Hk, Hv, Dk, Dv, seed=0):
    keys = mx.random.split(mx.random.key(seed), 8)
    q, k = (mx.random.normal((1, T, Hk, Dk), key=keys[i]) * Dk**-0.5 for i in (0, 1))
    v = mx.random.normal((1, T, Hv, Dv), key=keys[2])
    a, b = mx.random.normal((1, T, Hv), key=keys[3]), mx.random.normal((1, T, Hv), key=keys[4])
    A_log, dt = mx.random.uniform(-1.0, 1.0, (Hv,), key=keys[5]), mx.random.normal((Hv,), key=keys[6])
    return q, k, v, a, b, A_log, dt, mx.random.normal((1, Hv, Dv, Dk), key=keys[7])


@pytest.mark.parametrize("T, Hk, Hv, Dk, Dv", [(1, 2, 4, 32, 32), (6, 2, 4, 32, 32), (5, 4, 4, 24, 40), (3, 16, 16, 128, 128)])
def test_kernel_is_mlx_lms_gated_delta_rule(cpu_ext, T, Hk, Hv, Dk, Dv):
    """Grouped value heads (each key head serves Hv / Hk), head sizes that are not a multiple of the lanes."""
    q, k, v, a, b, A_log, dt, state = inputs(T, Hk, Hv, Dk, Dv)
    y, s = kernel_gated_delta_update(q, k, v, a, b, A_log, dt, state)
    y_ref, s_ref = gated_delta_ops(q, k, v, compute_g(A_log, a, dt), mx.sigmoid(b), state)
    for got, ref in ((y, y_ref), (s, s_ref)):
        assert got.shape == ref.shape and got.dtype == mx.float32
        assert (mx.abs(got - ref) <= delta.TOL * mx.abs(ref).max()).all().item()
    assert delta._record().checks[("gated_delta", Hk, Hv, Dk, Dv)] is None  # its self-check passed


def test_a_calls_tokens_are_one_token_calls(cpu_ext):
    q, k, v, a, b, A_log, dt, state = inputs(7, 2, 4, 32, 32, seed=3)
    y, s = kernel_gated_delta_update(q, k, v, a, b, A_log, dt, state)
    ys, s1 = [], state
    for t in range(7):
        cut = lambda x: x[:, t : t + 1]  # noqa: E731
        yt, s1 = kernel_gated_delta_update(cut(q), cut(k), cut(v), cut(a), cut(b), A_log, dt, s1)
        ys.append(yt)
    assert mx.array_equal(mx.concatenate(ys, axis=1), y).item() and mx.array_equal(s1, s).item()


def test_what_the_kernel_does_not_take_runs_mlx_lms_path(cpu_ext):
    """A mask (batched sequences), half precision, a missing state: mlx-lm's own function answers."""
    q, k, v, a, b, A_log, dt, state = inputs(3, 2, 4, 32, 32)
    mask = mx.array([[True, True, False]])
    for args, kwargs in [((q, k, v, a, b, A_log, dt, state, mask), {}),
                         ((q.astype(mx.float16), k.astype(mx.float16), v, a, b, A_log, dt, state), {})]:
        got, want = kernel_gated_delta_update(*args, **kwargs), gated_delta_update(*args, use_kernel=False, **kwargs)
        assert all(mx.array_equal(g_, w_).item() for g_, w_ in zip(got, want))
    y, s = kernel_gated_delta_update(q, k, v, a, b, A_log, dt)  # no state: zeros, as mlx-lm starts
    y_ref, _ = gated_delta_update(q, k, v, a, b, A_log, dt, use_kernel=False)
    assert (mx.abs(y - y_ref) <= delta.TOL * mx.abs(y_ref).max()).all().item()


@pytest.mark.parametrize("rows", [1, 4])
def test_conv_is_mlx_s_depthwise_conv_and_rows_are_rows_alone(cpu_ext, rows):
    w = mx.random.normal((96, 4, 1), key=mx.random.key(2))
    x = mx.random.normal((1, rows + 3, 96), key=mx.random.key(3))
    conv = KernelCausalConv(w)
    y, ref = conv(x), mx.conv1d(x, w, groups=96)
    assert y.shape == ref.shape and (mx.abs(y - ref) <= delta.TOL * mx.abs(ref).max()).all().item()
    for t in range(rows):
        assert mx.array_equal(conv(x[:, t : t + 4]), y[:, t : t + 1]).item()
    assert registry.kernel("conv").checks[("causal_conv", 96, 4, str(mx.float32))] is None
    half = x.astype(mx.float16)  # not the kernel's: MLX's conv
    assert mx.array_equal(conv(half), mx.conv1d(half, w, groups=96)).item()


def test_routed_per_model_and_restored(cpu_ext, tmp_path):
    model = load(str(make_model_dir(tmp_path, "qwen3_next", layers=4, seed=3))).model
    other = load(str(make_model_dir(tmp_path / "other", "qwen3_next", layers=4, seed=3))).model
    # its two delta-net layers: their recurrence routed, their convs swapped
    assert use_delta_kernel(model) == {"kernel": "delta", "routed": 2, "convs": 2, "error": None}
    assert sum(isinstance(m, KernelCausalConv) for _, m in model.named_modules()) == 2
    layers = [m for _, m in model.named_modules() if routed(m, "gated_delta_update")]
    assert len(layers) == 2 and not any(routed(m, "gated_delta_update") for _, m in other.named_modules())
    x = mx.array([[5, 6, 7, 8]])
    before = model(x)
    restore_delta(model)
    assert not any(routed(m, "gated_delta_update") or isinstance(m, KernelCausalConv) for _, m in model.named_modules())
    assert mx.allclose(model(x), before, atol=1e-4).item()


@pytest.fixture
def pretend_gpu(monkeypatch):
    """The registry sees a GPU backend (the "conv" family's GPU path is MLX ops: it runs here as there)."""
    registry.reset()
    monkeypatch.setattr(registry, "device_backend_name", lambda device=None: "metal")
    yield
    registry.reset()


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_on_gpus_the_conv_is_its_taps_in_order(pretend_gpu, dtype):
    """MLX's GPU convolutions may choose an algorithm by the input's length; the taps in order as elementwise
    ops in float32 do not: rows alone equal rows together, within a rounding of MLX's conv."""
    w = mx.random.normal((96, 4, 1), key=mx.random.key(2)).astype(dtype)
    x = mx.random.normal((1, 5 + 3, 96), key=mx.random.key(3)).astype(dtype)
    conv = KernelCausalConv(w)
    y, ref = conv(x), mx.conv1d(x, w, groups=96)
    assert registry.kernel("conv").fn is delta.taps_conv and y.dtype == dtype
    assert registry.kernel("conv").checks[("causal_conv", 96, 4, str(dtype))] is None
    assert mx.array_equal(y, delta.taps_conv(x, w)).item()
    tolerance = delta.TOL if dtype == mx.float32 else 2.0**-7
    assert (mx.abs(y - ref).astype(mx.float32) <= tolerance * mx.abs(ref).max().astype(mx.float32)).all().item()
    for t in range(5):
        assert mx.array_equal(conv(x[:, t : t + 4]), y[:, t : t + 1]).item()


def test_on_gpus_only_the_convs_are_swapped(pretend_gpu, tmp_path):
    model = load(str(make_model_dir(tmp_path, "qwen3_next", layers=4, seed=3))).model
    x = mx.array([[5, 6, 7, 8]])
    before = model(x)
    report = use_delta_kernel(model)
    assert report["routed"] == 0 and report["convs"] == 2 and "CPU-only" in report["error"]
    assert not any(routed(m, "gated_delta_update") for _, m in model.named_modules())  # mlx-lm's GPU kernel
    assert mx.allclose(model(x), before, atol=1e-4).item()
    restore_delta(model)
    assert not any(isinstance(m, KernelCausalConv) for _, m in model.named_modules())


def test_a_conv_with_a_bias_adds_it_as_nn_conv1d_does(cpu_ext):
    """Mamba-2 mixers' convs carry a bias: the swapped conv adds it after the taps, as nn.Conv1d does."""
    import mlx.nn as nn

    conv = nn.Conv1d(96, 96, 4, groups=96, bias=True)
    conv.bias = mx.random.normal((96,), key=mx.random.key(4))
    x = mx.random.normal((1, 7, 96), key=mx.random.key(5))
    ref, got = conv(x), KernelCausalConv(conv.weight, conv.bias)(x)
    assert (mx.abs(got - ref) <= delta.TOL * mx.abs(ref).max()).all().item()
    assert not mx.allclose(KernelCausalConv(conv.weight)(x), ref).item()  # the bias is there
