"""The CPU kernel against MLX's op (reference.py's tolerance) and against itself across row counts.

Row independence is bit-for-bit: row i of an M-row call equals the 1-row call on row i, for every
M in 1..16 (and 17, 24 across the 8-row chunking), bits 4/8, groups 32/64/128, every code path
built here (AVX-512, AVX2, portable).
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxspec.kernels.cpu import cpu_qmm_function
from mlxspec.kernels.reference import output_dtype, qmm_reference, random_quantized, within_tolerance

ROW_COUNTS = list(range(1, 17)) + [17, 24]


def isas(ext):
    return [i for i in (1, 2, 3, 0) if ext.isa_compiled(i)]  # avx512, avx2, neon, generic: those built here


def quantized(n, k, group_size, bits, dtype=mx.float16, seed=0):
    """Weights from real quantization of random floats (a realistic scale/bias spread)."""
    w = mx.random.normal((n, k), key=mx.random.key(seed)).astype(dtype)
    return mx.quantize(w, group_size=group_size, bits=bits)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_every_row_count_matches_reference_and_one_row_calls(cpu_ext, bits, group_size):
    n, k = 67, 2 * group_size  # N not a multiple of any column tile; K = two groups
    w, s, b = quantized(n, k, group_size, bits)
    x = mx.random.normal((max(ROW_COUNTS), k), key=mx.random.key(1))
    for isa in isas(cpu_ext):
        qmm = cpu_qmm_function(isa)
        one_row = mx.concatenate([qmm(x[i : i + 1], w, s, b, group_size, bits) for i in range(x.shape[0])])
        ok, ratio = within_tolerance(one_row, x, w, s, b, group_size, bits)
        assert ok, f"isa {qmm.isa}: error {ratio:.3g}x the tolerance"
        for m in ROW_COUNTS:
            y = qmm(x[:m], w, s, b, group_size, bits)
            assert mx.array_equal(y, one_row[:m]).item(), f"isa {qmm.isa}, M={m}: rows differ from 1-row calls"


@pytest.mark.parametrize("bits", [4, 8])
def test_threaded_shape_is_row_independent(cpu_ext, bits):
    """Big enough to be split over the worker threads (N*K >= 2^18)."""
    n, k, g = 1000, 576, 32
    w, s, b = random_quantized(n, k, g, bits, mx.float16, key=mx.random.key(3))
    x = mx.random.normal((16, k), key=mx.random.key(4))
    qmm = cpu_qmm_function()
    y = qmm(x, w, s, b, g, bits)
    assert within_tolerance(y, x, w, s, b, g, bits)[0]
    for m in (1, 5, 9, 16):
        assert mx.array_equal(qmm(x[m - 1 : m], w, s, b, g, bits)[0], y[m - 1]).item()
        assert mx.array_equal(qmm(x[:m], w, s, b, g, bits), y[:m]).item()


@pytest.mark.parametrize("x_dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("scale_dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_dtypes(cpu_ext, x_dtype, scale_dtype):
    w, s, b = quantized(40, 64, 32, 4, scale_dtype)
    x = mx.random.normal((3, 64), key=mx.random.key(5)).astype(x_dtype)
    y = cpu_qmm_function()(x, w, s, b, 32, 4)
    assert y.dtype == output_dtype(x_dtype, scale_dtype) == qmm_reference(x, w, s, b, 32, 4).dtype
    ok, ratio = within_tolerance(y, x, w, s, b, 32, 4)
    assert ok, f"error {ratio:.3g}x the tolerance"


def test_views_and_leading_dims(cpu_ext):
    """x may be a strided view or (B, L, K): the result equals the contiguous 2-D call."""
    w, s, b = quantized(24, 64, 32, 4)
    qmm = cpu_qmm_function()
    base = mx.random.normal((64, 5), key=mx.random.key(6))
    x = base.T  # (5, 64), column-major view
    expected = qmm(mx.array(x.tolist()), w, s, b, 32, 4)
    assert mx.array_equal(qmm(x, w, s, b, 32, 4), expected).item()
    y3 = qmm(x.reshape(1, 5, 64), w, s, b, 32, 4)
    assert y3.shape == (1, 5, 24) and mx.array_equal(y3[0], expected).item()


def test_composes_with_other_ops_in_one_graph(cpu_ext):
    """The kernel's output feeds MLX ops lazily (the command-encoder path, no early reads)."""
    w, s, b = quantized(64, 64, 32, 4)
    qmm = cpu_qmm_function()
    x = mx.random.normal((2, 64), key=mx.random.key(7))
    h = x
    for _ in range(5):
        h = mx.tanh(qmm(h * 2.0 + 1.0, w, s, b, 32, 4))
    r = x
    for _ in range(5):
        r = mx.tanh(qmm_reference(r * 2.0 + 1.0, w, s, b, 32, 4))
    assert mx.allclose(h, r, atol=1e-4).item()


@pytest.mark.parametrize(
    "args, message",
    [
        ((64, 3, 32), "bits"),
        ((64, 4, 48), "group_size"),
        ((48, 4, 32), "does not match"),
    ],
)
def test_bad_arguments_raise(cpu_ext, args, message):
    k, bits, group_size = args
    w, s, b = quantized(8, 64, 32, 4)
    with pytest.raises(ValueError, match=message):
        cpu_ext.qmm(mx.zeros((1, k)), w, s, b, group_size, bits)
