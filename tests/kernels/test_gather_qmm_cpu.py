"""The CPU kernel for mixture-of-experts layers (cpu/ext.cpp's gather_qmm) and its layer swap.

Row p times expert indices[p]: every row must be bit-identical to a one-row qmm call with its
expert's weights (so verify passes equal one-token steps through MoE layers), and agree with MLX's
gather_qmm as a float32 reference. mlx-lm's QuantizedSwitchLinear is swapped per model on the CPU.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchGLU

from mlxspec.kernels.cpu import cpu_gather_qmm_function, cpu_qmm_function
from mlxspec.kernels.layers import KernelQuantizedSwitchLinear, restore_layers, use_kernels, widen_to_8bit


def experts(e, n, k, bits, dtype, seed=0):
    kw, ks, kb = mx.random.split(mx.random.key(seed), 3)
    w = mx.random.randint(0, 2**32 - 1, (e, n, k * bits // 32), dtype=mx.uint32, key=kw)
    s = (mx.random.uniform(shape=(e, n, k // 32), key=ks) * 0.02).astype(dtype)
    b = (mx.random.normal((e, n, k // 32), key=kb) * 0.02).astype(dtype)
    return w, s, b


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("activations", ["f32", "q8"])
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16])
def test_rows_equal_one_row_calls_with_their_expert(cpu_ext, bits, activations, dtype):
    w, s, b = experts(12, 72, 256, bits, dtype)
    x = mx.random.normal((11, 256), key=mx.random.key(1)).astype(dtype)
    idx = mx.array([3, 1, 3, 11, 0, 7, 3, 1, 9, 9, 2], dtype=mx.uint32)  # repeats: experts serving several rows
    y = cpu_gather_qmm_function(activations=activations)(x, w, s, b, idx, 32, bits)
    qmm = cpu_qmm_function(activations=activations)
    assert y.shape == (11, 72) and y.dtype == dtype
    for p, e in enumerate(idx.tolist()):
        assert mx.array_equal(y[p], qmm(x[p : p + 1], w[e], s[e], b[e], 32, bits)[0]).item(), p
    if activations == "f32" and dtype == mx.float32:
        ref = mx.gather_qmm(x[:, None], w, s, b, rhs_indices=idx, transpose=True, group_size=32, bits=bits)[:, 0]
        assert (mx.abs(y - ref).max() / mx.abs(ref).max()).item() < 1e-5


def test_bad_arguments_are_errors(cpu_ext):
    w, s, b = experts(4, 64, 128, 4, mx.float32)
    g = cpu_gather_qmm_function()
    with pytest.raises(ValueError, match="one row per index"):
        g(mx.zeros((3, 128)), w, s, b, mx.zeros((2,), mx.uint32), 32, 4)
    with pytest.raises(ValueError, match="does not match"):
        g(mx.zeros((2, 64)), w, s, b, mx.zeros((2,), mx.uint32), 32, 4)
    with pytest.raises(RuntimeError, match="out of range"):
        mx.eval(g(mx.zeros((1, 128)), w, s, b, mx.array([4], mx.uint32), 32, 4))


def switch_glu(bits: int) -> SwitchGLU:
    glu = SwitchGLU(128, 96, 6)
    glu.update(nn.utils.tree_map(lambda a: mx.random.normal(a.shape, key=mx.random.key(a.size)) * 0.1, glu.parameters()))
    nn.quantize(glu, group_size=32, bits=bits)
    return glu


@pytest.mark.parametrize("bits", [4, 5])
def test_switch_layers_swap_per_model_and_keep_mlx_lm_semantics(cpu_ext, bits):
    """A SwitchGLU's projections (5-bit ones widened to bytes first) run the kernel; outputs match
    mlx-lm's gather_qmm path closely, through both its unsorted and its sorted (>= 64 pairs) call."""
    glu, other = switch_glu(bits), switch_glu(bits)
    x = mx.random.normal((2, 40, 128), key=mx.random.key(3))
    for rows, k in ((3, 2), (40, 2)):  # 6 pairs: unsorted; 80 pairs: sorted
        ids = mx.random.randint(0, 6, (2, rows, k), key=mx.random.key(rows)).astype(mx.uint32)
        before = glu(x[:, :rows], ids)
        report = use_kernels(glu)
        assert all(type(getattr(glu, p)) is KernelQuantizedSwitchLinear for p in ("gate_proj", "up_proj", "down_proj"))
        assert bool(report["widened"]) == (bits == 5 and rows == 3)  # restored layers stay widened
        after = glu(x[:, :rows], ids)
        assert after.shape == before.shape
        assert (mx.abs(after - before).max() / mx.abs(before).max()).item() < 1e-4
        assert restore_layers(glu) == 3 and type(glu.up_proj) is QuantizedSwitchLinear
    assert type(other.up_proj) is QuantizedSwitchLinear  # another model is untouched


def test_widening_keeps_an_experts_weights(cpu_ext):
    layer = switch_glu(5).up_proj
    ones = mx.ones(layer["scales"].shape)
    codes = mx.dequantize(layer["weight"], ones, mx.zeros_like(ones), group_size=32, bits=5)
    widen_to_8bit(layer)
    assert layer.bits == 8
    assert mx.array_equal(mx.dequantize(layer["weight"], ones, mx.zeros_like(ones), group_size=32, bits=8), codes).item()
