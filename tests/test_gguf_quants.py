"""mlxspec.gguf_quants: GGUF blocks -> MLX affine quantization, checked against gguf-py's dequantizer.

Exact types must dequantize in MLX to gguf-py's reference values bit for bit; requantized types must
report the error they really have, stay at or below the source format's own rounding error, and use
the fewest bits that do. Blocks are random (any bytes are valid codes and sub-block scales), with
sane fp16 super-block scales, as tests/gguf_fixtures.random_blocks writes them.
"""

from __future__ import annotations

import numpy as np
import mlx.core as mx
import pytest

import gguf
from gguf import GGMLQuantizationType as QT
from gguf_fixtures import random_blocks
from mlxspec import gguf_quants
from mlxspec.gguf_quants import EXACT, REQUANTIZED, affine, convert_tensor, pack

ROWS, COLS = 24, 512
LEGACY = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


def blocks_of(type_name: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if type_name in LEGACY:  # gguf-py has quantizers for these
        return gguf.quants.quantize(rng.standard_normal((ROWS, COLS)).astype(np.float32) * 0.05, QT[type_name])
    return random_blocks(type_name, (ROWS, COLS), rng, std=0.05)


def reference(raw: np.ndarray, type_name: str) -> np.ndarray:
    return gguf.quants.dequantize(raw, QT[type_name]).astype(np.float32).reshape(ROWS, COLS)


def mlx_dequantized(arrays: dict, bits: int) -> np.ndarray:
    # float32 scales: mx.dequantize returns the scales' dtype, and float16 would round the products
    s, b = arrays["scales"].astype(mx.float32), arrays["biases"].astype(mx.float32)
    return np.array(mx.dequantize(arrays["weight"], s, b, group_size=32, bits=bits))


@pytest.mark.parametrize("type_name", list(EXACT))
def test_exact_types_dequantize_bit_for_bit(type_name):
    raw = blocks_of(type_name)
    arrays, report = convert_tensor(raw, type_name, (ROWS, COLS))
    bits = EXACT[type_name]
    assert report.exact and report.mlx == f"q{bits}g32" and report.rms_error == 0.0
    assert np.array_equal(mlx_dequantized(arrays, bits), reference(raw, type_name))

    # fp16 holds the legacy types' d and -8d/-16d/-128d/m exactly; K-quants' d*sc (up to 17
    # significant bits) it does not, so those stay float32.
    expected = mx.float16 if type_name in LEGACY else mx.float32
    assert arrays["scales"].dtype == expected and arrays["biases"].dtype == expected
    if type_name not in LEGACY:
        s = np.array(arrays["scales"])
        assert not np.array_equal(s.astype(np.float16).astype(np.float32), s)

    # The quantized matmul MLX runs multiplies by those same values.
    x = np.random.default_rng(1).standard_normal((3, COLS)).astype(np.float32)
    y = mx.quantized_matmul(mx.array(x), arrays["weight"], arrays["scales"], arrays["biases"], group_size=32, bits=bits)
    want = x.astype(np.float64) @ reference(raw, type_name).T.astype(np.float64)
    np.testing.assert_allclose(np.array(y), want, atol=1e-5, rtol=1e-5)


def source_step(raw: np.ndarray, type_name: str) -> np.ndarray:
    """Each weight's quantization step, found through gguf-py alone: the change in a sub-block's
    dequantized value when its codes go from one value to the next."""
    blocks = raw.reshape(-1, gguf.GGML_QUANT_SIZES[QT[type_name]][1]).copy()
    if type_name == "Q6_K":  # ql[128] qh[64]: all zero -> code -32
        blocks[:, :192] = 0
        return np.abs(gguf.quants.dequantize(blocks, QT.Q6_K)) / 32
    if type_name == "Q3_K":  # hmask[32] qs[64]: all zero -> code -4
        blocks[:, :96] = 0
        return np.abs(gguf.quants.dequantize(blocks, QT.Q3_K)) / 4
    blocks[:, 16:80] = 0  # Q2_K: qs[64] after scales[16]: codes 0, then 0x55 -> codes 1
    low = gguf.quants.dequantize(blocks, QT.Q2_K)
    blocks[:, 16:80] = 0x55
    return np.abs(gguf.quants.dequantize(blocks, QT.Q2_K) - low)


@pytest.mark.parametrize("type_name", list(REQUANTIZED))
def test_requantized_types_report_their_real_error(type_name):
    raw = blocks_of(type_name)
    ref = reference(raw, type_name)
    arrays, report = convert_tensor(raw, type_name, (ROWS, COLS))
    bits = int(report.mlx[1])
    assert not report.exact and report.mlx == f"q{bits}g32"

    err = mlx_dequantized(arrays, bits) - ref  # what MLX will multiply by, against gguf-py
    assert report.rms_error == pytest.approx(np.sqrt(np.mean(err.astype(np.float64) ** 2)), rel=1e-4)
    assert report.max_error == pytest.approx(np.abs(err).max(), rel=1e-4)
    source_rms = np.sqrt(np.mean(source_step(raw, type_name).astype(np.float64) ** 2) / 12)
    assert report.source_rms == pytest.approx(source_rms, rel=1e-4)
    assert 0 < report.rms_error <= report.source_rms

    # The fewest bits that stay within the source's error: every smaller width tried goes over it.
    for fewer in [b for b in (2, 3, 4, 5, 6) if b < bits]:
        *_, approx = affine(ref, fewer)
        assert np.sqrt(np.mean((approx - ref).astype(np.float64) ** 2)) > report.source_rms, fewer


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_pack_is_mlx_layout(bits):
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 2**bits, size=(5, 128), dtype=np.uint8)
    scales = rng.random((5, 4)).astype(np.float32)
    biases = rng.standard_normal((5, 4)).astype(np.float32)
    got = mx.dequantize(mx.array(pack(codes, bits)), mx.array(scales), mx.array(biases), group_size=32, bits=bits)
    want = codes.reshape(5, 4, 32).astype(np.float32) * scales[..., None] + biases[..., None]
    np.testing.assert_allclose(np.array(got), want.reshape(5, 128), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K"])
def test_chunked_conversion_is_the_same(monkeypatch, type_name):
    raw = blocks_of(type_name)
    whole, report = convert_tensor(raw, type_name, (ROWS, COLS))
    monkeypatch.setattr(gguf_quants, "CHUNK_WEIGHTS", COLS * 5)  # 5 rows at a time, a ragged last chunk
    chunked, chunked_report = convert_tensor(raw, type_name, (ROWS, COLS))
    assert chunked_report.mlx == report.mlx and chunked_report.max_error == report.max_error
    assert chunked_report.rms_error == pytest.approx(report.rms_error, rel=1e-6)  # float32 sums in another order
    assert chunked_report.source_rms == pytest.approx(report.source_rms, rel=1e-9)
    for key in whole:
        assert np.array_equal(np.array(whole[key]), np.array(chunked[key]))


def test_floats_kept_as_they_are():
    values = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)
    for type_name, raw, dtype in [
        ("F32", values.view(np.uint8), mx.float32),
        ("F16", values.astype(np.float16).view(np.uint8), mx.float16),
        ("BF16", (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8), mx.bfloat16),
    ]:
        arrays, report = convert_tensor(raw.reshape(-1), type_name, (4, 32))
        assert report.exact and arrays["weight"].dtype == dtype and set(arrays) == {"weight"}
        want = gguf.quants.dequantize(raw.reshape(4, -1), QT[type_name])
        assert np.array_equal(np.array(arrays["weight"].astype(mx.float32)), want)
