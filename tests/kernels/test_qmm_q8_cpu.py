"""The int8-activation CPU matmul (qmm_q8_kernel.h) against its definition and against itself.

Its definition is reference.q8_reference (each 32 values of x rounded to int8, integer dot products
with the codes, then the scales and the bias term): the kernel matches it to fp32 accumulation
error, the fp32 kernel does not (the check can fail). Rows of an M-row call are bit-identical to
1-row calls, and every ISA path equals the portable one, so verification stays exact.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxspec.kernels import registry
from mlxspec.kernels.cpu import cpu_qmm_function
from mlxspec.kernels.reference import mxfp4_as_affine, random_quantized, within_tolerance

# (K, group size): 128-weight chunks cut short (96: 3 blocks, 160: 5, 576: 18) and group sizes
# that are not a divisor of a chunk (96: the portable path on every ISA)
SHAPES = [(256, 32), (256, 64), (256, 128), (96, 32), (160, 32), (576, 64), (192, 96)]


def isas(ext):
    return [i for i in (1, 2, 3, 0) if ext.isa_compiled(i)]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,group_size", SHAPES)
def test_matches_its_definition_and_one_row_calls(cpu_ext, bits, k, group_size):
    n = 37  # not a multiple of any column tile
    w, s, b = random_quantized(n, k, group_size, bits, mx.float16, key=mx.random.key(k + group_size))
    x = mx.random.normal((11, k), key=mx.random.key(1)) * 3
    results = []
    for isa in isas(cpu_ext):
        qmm = cpu_qmm_function(isa, activations="q8")
        one_row = mx.concatenate([qmm(x[i : i + 1], w, s, b, group_size, bits) for i in range(11)])
        ok, ratio = within_tolerance(one_row, x, w, s, b, group_size, bits, "q8")
        assert ok, f"isa {qmm.isa}: error {ratio:.3g}x the tolerance"
        for m in (2, 3, 4, 5, 8, 11):
            assert mx.array_equal(qmm(x[:m], w, s, b, group_size, bits), one_row[:m]).item(), (qmm.isa, m)
        results.append(one_row)
    assert all(mx.array_equal(r, results[0]).item() for r in results), "ISA paths differ"


def test_the_definition_tells_int8_activations_from_fp32(cpu_ext):
    """The fp32 kernel is far outside the q8 tolerance (and the q8 kernel outside the fp32 one):
    the self-check's statement is specific to the arithmetic."""
    w, s, b = random_quantized(64, 576, 32, 4, mx.float16, key=mx.random.key(5))
    x = mx.random.normal((4, 576), key=mx.random.key(6))
    f32, q8 = cpu_qmm_function(), cpu_qmm_function(activations="q8")
    assert not within_tolerance(f32(x, w, s, b, 32, 4), x, w, s, b, 32, 4, "q8")[0]
    assert not within_tolerance(q8(x, w, s, b, 32, 4), x, w, s, b, 32, 4)[0]
    # and it stays close to the fp32 result: int8 rounding of x, not a wrong matmul
    y, ref = q8(x, w, s, b, 32, 4), f32(x, w, s, b, 32, 4)
    assert (mx.abs(y - ref).max() / mx.abs(ref).max()).item() < 0.02


@pytest.mark.parametrize("x_dtype,scale_dtype", [(mx.float16, mx.float16), (mx.bfloat16, mx.bfloat16),
                                                 (mx.float32, mx.float32), (mx.float32, mx.float16)])
def test_dtypes_and_a_threaded_shape(cpu_ext, x_dtype, scale_dtype):
    n, k = 1000, 576  # split over the worker threads
    w, s, b = random_quantized(n, k, 32, 4, scale_dtype, key=mx.random.key(7))
    x = mx.random.normal((9, k), key=mx.random.key(8)).astype(x_dtype)
    qmm = cpu_qmm_function(activations="q8")
    y = qmm(x, w, s, b, 32, 4)
    assert y.dtype == (x + s[:1, :1]).dtype
    ok, ratio = within_tolerance(y, x, w, s, b, 32, 4, "q8")
    assert ok, ratio
    for i in (0, 4, 8):
        assert mx.array_equal(qmm(x[i : i + 1], w, s, b, 32, 4)[0], y[i]).item()


def test_zero_and_large_rows(cpu_ext):
    """An all-zero block (scale 0) gives the bias-free zero product; huge values do not overflow."""
    w, s, b = random_quantized(40, 128, 32, 4, mx.float32, key=mx.random.key(9))
    x = mx.concatenate([mx.zeros((1, 128)), mx.random.normal((1, 128), key=mx.random.key(10)) * 1e4])
    y = cpu_qmm_function(activations="q8")(x, w, s, b, 32, 4)
    assert mx.array_equal(y[0], mx.zeros((40,))).item()
    assert within_tolerance(y, x, w, s, b, 32, 4, "q8")[0]


def test_registry_family_checks_and_reports_it(cpu_ext):
    registry.reset()
    try:
        qmm, why = registry.kernel_for_layer(96, 576, 32, 4, mx.float16, mx.cpu, activations="q8")
        assert qmm is not None and qmm.activations == "q8", why
        entry = next(e for e in registry.status() if e["kernel"] == "cpu-qmm-q8")
        assert entry["active"] and "threads" in entry["detail"]
    finally:
        registry.reset()


@pytest.mark.parametrize("k", [96, 576, 2880])  # a chunk cut short, SmolLM2-like, gpt-oss's hidden size
def test_mxfp4_codes_match_their_definition_on_every_isa(cpu_ext, k):
    """gpt-oss's mxfp4 layers: e2m1 codes read through kE2m1 with the affine form of the exponents;
    within the q8 tolerance of the definition, rows = one-row calls, every ISA path alike."""
    n = 37
    w, s, _ = random_quantized(n, k, 32, 4, key=mx.random.key(k), mode="mxfp4")
    x = mx.random.normal((9, k), key=mx.random.key(2)) * 3
    results = []
    for isa in isas(cpu_ext):
        qmm = cpu_qmm_function(isa, activations="q8")
        one_row = mx.concatenate([qmm(x[i : i + 1], w, s, None, 32, 4, mode="mxfp4") for i in range(9)])
        ok, ratio = within_tolerance(one_row, x, w, s, None, 32, 4, "q8", "mxfp4")
        assert ok, f"isa {qmm.isa}: error {ratio:.3g}x the tolerance"
        plain_codes = qmm(x, w, *mxfp4_as_affine(s), 32, 4)  # the affine pair without kE2m1: wrong
        assert not within_tolerance(plain_codes, x, w, s, None, 32, 4, "q8", "mxfp4")[0]
        assert mx.array_equal(qmm(x, w, s, None, 32, 4, mode="mxfp4"), one_row).item(), qmm.isa
        results.append(one_row)
    assert all(mx.array_equal(r, results[0]).item() for r in results), "ISA paths differ"
    ref = mx.quantized_matmul(x, w, s, None, transpose=True, group_size=32, bits=4, mode="mxfp4")
    assert (mx.abs(results[0] - ref).max() / mx.abs(ref).max()).item() < 0.02  # int8 rounding of x only


def test_mxfp4_needs_int8_activations_and_gathers_like_qmm(cpu_ext):
    from mlxspec.kernels.cpu import cpu_gather_qmm_function

    w, s, _ = random_quantized(24, 128, 32, 4, key=mx.random.key(3), mode="mxfp4")
    x = mx.random.normal((3, 128), key=mx.random.key(4))
    with pytest.raises(ValueError, match="int8 activations"):
        cpu_qmm_function()(x, w, s, None, 32, 4, mode="mxfp4")
    qmm = cpu_qmm_function(activations="q8")
    assert qmm(x.astype(mx.bfloat16), w, s, None, 32, 4, mode="mxfp4").dtype == mx.bfloat16  # x's, as MLX's op
    experts = mx.stack([w, w ^ mx.array(0x11111111, mx.uint32)])
    scales = mx.stack([s, s])
    ids = mx.array([1, 0, 1], mx.uint32)
    y = cpu_gather_qmm_function(activations="q8")(x, experts, scales, None, ids, 32, 4, mode="mxfp4")
    for p, e in enumerate(ids.tolist()):
        assert mx.array_equal(y[p], qmm(x[p : p + 1], experts[e], scales[e], None, 32, 4, mode="mxfp4")[0]).item()
