"""kernels/reference.py: the tolerance statement every kernel's self-check makes, over the columns it
compares (a wide layer's two ends: the CPU reference of a vocabulary head took minutes at first load)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxspec.kernels import reference
from mlxspec.kernels.reference import CHECK_COLUMNS, qmm_reference, random_quantized, within_tolerance
from mlxspec.kernels.registry import self_check

N, K = 2 * CHECK_COLUMNS + 37, 128  # wider than two ends, with a partial last tile


def exact_qmm(x, w, s, b, group_size, bits):
    return qmm_reference(x, w, s, b, group_size, bits)


def off_in_column(col: int):
    """A qmm that is right except in one output column, where it is off by 1 (far beyond the tolerance)."""
    def qmm(x, w, s, b, group_size, bits):
        y = exact_qmm(x, w, s, b, group_size, bits)
        return y + (mx.arange(y.shape[-1]) == col).astype(y.dtype)
    return qmm


def test_a_right_kernel_passes_and_one_wrong_at_either_end_fails():
    assert self_check(exact_qmm, N, K, 64, 4, mx.float16) is None
    for col in (0, CHECK_COLUMNS - 1, N - CHECK_COLUMNS, N - 1):
        failure = self_check(off_in_column(col), N, K, 64, 4, mx.float16)
        assert failure is not None and "tolerance" in failure, col


def test_the_reference_runs_on_the_two_ends_of_a_wide_layer_only(monkeypatch):
    seen = []
    real = reference.qmm_reference
    monkeypatch.setattr(reference, "qmm_reference", lambda x, w, *a, **k: seen.append(w.shape[0]) or real(x, w, *a, **k))
    w, s, b = random_quantized(N, K, 64, 4, key=mx.random.key(0))
    x = mx.random.normal((3, K), key=mx.random.key(1)).astype(mx.float16)
    y = real(x, w, s, b, 64, 4)
    assert within_tolerance(y, x, w, s, b, 64, 4)[0]
    narrow = [a[:100] for a in (w, s, b)]
    assert within_tolerance(y[:, :100], x, *narrow, 64, 4)[0]
    assert seen == [2 * CHECK_COLUMNS, 100]  # a narrow layer: every column


@pytest.mark.parametrize("mode", ["affine", "mxfp4"])
def test_the_cut_keeps_each_column_with_its_own_scales(mode):
    """Cut weights, scales and result stay aligned: the reference of the cut weights is the cut reference."""
    group = 64 if mode == "affine" else 32
    w, s, b = random_quantized(N, K, group, 4, mx.bfloat16, key=mx.random.key(2), mode=mode)
    x = mx.random.normal((2, K), key=mx.random.key(3)).astype(mx.bfloat16)
    full = qmm_reference(x, w, s, b, group, 4, mode=mode)
    (y,), cut = reference.checked_columns(full, axis=-1), reference.checked_columns(w, s, b)
    assert y.shape == (2, 2 * CHECK_COLUMNS) and (mode == "affine") == (cut[2] is not None)
    assert mx.array_equal(qmm_reference(x, *cut, group, 4, mode=mode), y).item()


def test_the_accumulation_tolerance_grows_as_the_square_root_of_k():
    """An error of 1.5x the flat tolerance: too much for 4096 products, within it for 16384 (sqrt(4) = 2x)."""
    assert reference.acc_tol(1024) == reference.acc_tol(4096) == reference.ACC_TOL
    assert reference.acc_tol(16384) == 2 * reference.ACC_TOL
    for k, ok in ((4096, False), (16384, True)):
        w, s, b = random_quantized(8, k, 64, 4, mx.float32, key=mx.random.key(4))
        x = mx.random.normal((2, k), key=mx.random.key(5))
        off = 1.5 * reference.ACC_TOL * reference.magnitude(x, w, s, b, 64, 4)
        assert within_tolerance(qmm_reference(x, w, s, b, 64, 4) + off, x, w, s, b, 64, 4)[0] == ok, k
