"""GGUF tensor data -> MLX arrays: floats as they are, quantized blocks as MLX affine triples.

    arrays, report = convert_tensor(raw_bytes, "Q4_K", (rows, cols))
    # arrays: {"weight": uint32 codes packed, "scales": ..., "biases": ...} (mx.array), ready for
    # nn.QuantizedLinear / QuantizedEmbedding with group_size 32 and report.bits

MLX's affine quantization stores, per group of 32 weights along a row, w = scale * code + bias with
codes of `bits` bits packed little-endian into uint32. GGUF formats whose blocks are exactly that
map code for code, without requantizing (`EXACT`): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the K-quants
Q4_K and Q5_K, whose 32-weight sub-blocks have scale d*sc and min dmin*m. The scale and bias are
kept in float16 when float16 holds every one of them exactly (the legacy types: an fp16 d times a
power of two), else in float32: d*sc has up to 17 significant bits (fp16 d, 6-bit sc), float32 holds
it exactly and float16 does not. MLX computes scale*code+bias in float32 for float32 activations,
so the weights it multiplies by are bit-identical to gguf-py's reference dequantization.

Q6_K, Q3_K and Q2_K have 16-weight sub-blocks (MLX's smallest group is 32), so two scales meet in
each MLX group: they are dequantized with gguf-py's reference and requantized (`REQUANTIZED`) to
the fewest bits whose RMS error against that reference is at or below the source format's own
nominal rounding error (RMS of its step / sqrt(12)); the measured errors are reported per tensor.
Rows are converted in chunks, so a tensor never exists in float32 all at once.

MXFP4 (gpt-oss's experts) is the OCP microscaling format MLX also holds (`mode="mxfp4"`): per 32
weights one e8m0 exponent and 32 e2m1 codes. Code for code: only the nibble order differs (ggml puts
weights 0-15 in the low nibbles, 16-31 in the high ones; MLX packs them in order), so the weights
MLX multiplies by are gguf-py's dequantization exactly.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import Q4_K, dequantize

GROUP = 32  # MLX group size used for every GGUF type
FLOATS = ("F32", "F16", "BF16")
EXACT = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5}
# Bit widths tried in order (group 32, float16 scales); float32 scales at 8 bits as a last resort.
REQUANTIZED = {"Q6_K": (6, 8), "Q3_K": (3, 4, 5, 6, 8), "Q2_K": (2, 3, 4, 5, 6, 8)}
MICROSCALED = {"MXFP4": 4}  # MLX's mxfp4 mode: uint8 e8m0 scales, no biases
SUPPORTED = (*FLOATS, *EXACT, *REQUANTIZED, *MICROSCALED)
CHUNK_WEIGHTS = 1 << 20  # rows are converted a chunk of about this many weights at a time
THREADS = min(8, os.cpu_count() or 1)  # chunks converted at once (scratch: ~50 bytes a weight each)


@dataclass
class TensorReport:
    """How one tensor was loaded. Errors are against gguf-py's reference dequantization."""

    type: str  # the GGUF type
    mlx: str  # "q4g32", "q8g32", "float16", ...
    exact: bool
    rms_error: float = 0.0
    max_error: float = 0.0
    source_rms: float = 0.0  # the source format's nominal rounding error, for comparison

    def as_dict(self) -> dict:
        return asdict(self)


def block_bytes(type_name: str) -> tuple[int, int]:
    """(weights per block, bytes per block) of a ggml type, from gguf-py's table."""
    return GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]


def convert_tensor(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> tuple[dict, TensorReport]:
    """Raw bytes (uint8, memory-mapped) of a tensor of numpy `shape` -> ({name: mx.array}, report)."""
    if type_name in FLOATS:
        return _floats(raw, type_name, shape)
    rows, cols = math.prod(shape[:-1]), shape[-1]
    blocks = raw.reshape(rows, -1)  # one row of blocks per weight row
    if type_name in EXACT:
        return _exact(blocks, type_name, shape, rows, cols)
    if type_name in MICROSCALED:
        return _mxfp4(blocks, shape, rows, cols)
    return _requantized(blocks, type_name, shape, rows, cols)


def _floats(raw, type_name, shape):
    if type_name == "F32":
        array = mx.array(raw.view(np.float32).reshape(shape))
    elif type_name == "F16":
        array = mx.array(raw.view(np.float16).reshape(shape))
    else:  # numpy has no bfloat16: carry the bits over and reinterpret them in MLX
        array = mx.array(raw.view(np.uint16).reshape(shape)).view(mx.bfloat16)
    return {"weight": array}, TensorReport(type_name, str(array.dtype).replace("mlx.core.", ""), True)


def _chunks(rows: int, cols: int):
    step = max(1, CHUNK_WEIGHTS // cols)
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


def _over_chunks(work, rows: int, cols: int) -> list:
    """work(a, b) for each chunk of rows, on a few threads (numpy releases the GIL in its loops);
    results in chunk order, so sums over them do not depend on timing."""
    chunks = _chunks(rows, cols)
    if len(chunks) == 1:
        return [work(*chunks[0])]
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        return list(pool.map(lambda ab: work(*ab), chunks))


# ---------------------------------------------------------------- exact mappings


def _exact(blocks, type_name, shape, rows, cols):
    bits = EXACT[type_name]
    weight = np.empty((rows, cols * bits // 32), np.uint32)
    scales = np.empty((rows, cols // GROUP), np.float32)
    biases = np.empty_like(scales)
    decode = _DECODERS[type_name]

    def work(a, b):
        per_block = blocks[a:b].reshape(-1, block_bytes(type_name)[1])
        codes, s, z = decode(np.ascontiguousarray(per_block))
        weight[a:b] = pack(codes.reshape(b - a, cols), bits)
        scales[a:b], biases[a:b] = s.reshape(b - a, -1), z.reshape(b - a, -1)

    _over_chunks(work, rows, cols)
    # float16 when it holds them all exactly (the legacy types), else float32 (K-quant d*sc)
    dtype = np.float16 if _fits_f16(scales) and _fits_f16(biases) else np.float32
    arrays = {
        "weight": mx.array(weight).reshape(*shape[:-1], -1),
        "scales": mx.array(scales.astype(dtype)).reshape(*shape[:-1], -1),
        "biases": mx.array(biases.astype(dtype)).reshape(*shape[:-1], -1),
    }
    return arrays, TensorReport(type_name, f"q{bits}g{GROUP}", True)


def _mxfp4(blocks, shape, rows, cols):
    """17-byte blocks (e8m0 exponent, 16 bytes of nibbles) -> MLX mxfp4 codes and uint8 scales."""
    per_block = blocks.reshape(-1, block_bytes("MXFP4")[1])
    weight = pack(_nibbles(per_block[:, 1:]).reshape(rows, cols), 4)
    arrays = {
        "weight": mx.array(weight).reshape(*shape[:-1], -1),
        "scales": mx.array(np.ascontiguousarray(per_block[:, 0]).reshape(rows, cols // GROUP)).reshape(*shape[:-1], -1),
    }
    return arrays, TensorReport("MXFP4", f"mxfp4g{GROUP}", True)


def _fits_f16(x: np.ndarray) -> bool:
    with np.errstate(over="ignore"):
        return bool(np.array_equal(x.astype(np.float16).astype(np.float32), x))


def _f16(b: np.ndarray) -> np.ndarray:
    return b.view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32): low nibbles are weights 0-15, high nibbles 16-31 (ggml's order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """(n, 4) bytes of a uint32 bit mask -> (n, 32) bits, bit j belonging to weight j."""
    return np.unpackbits(qh, axis=1, bitorder="little")


# Each decoder: (n_blocks, bytes) -> codes (n_blocks, weights), scale and bias (n_blocks, weights/32)
# such that scale * code + bias is gguf-py's dequantization, operation for operation.
def _q4_0(b):
    d = _f16(b[:, 0:2])
    return _nibbles(b[:, 2:18]), d, -8 * d


def _q4_1(b):
    return _nibbles(b[:, 4:20]), _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q5_0(b):
    d = _f16(b[:, 0:2])
    return _nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6]) << 4), d, -16 * d


def _q5_1(b):
    return _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]) << 4), _f16(b[:, 0:2]), _f16(b[:, 2:4])


def _q8_0(b):
    return b[:, 2:34] ^ 0x80, _f16(b[:, 0:2]), -128 * _f16(b[:, 0:2])  # int8 q -> q + 128


def _k_low(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K low nibbles: each 32 bytes hold sub-block 2i in low nibbles, 2i+1 in high ones."""
    q = qs.reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(-1, 256)


def _k_scales(b):
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, m = Q4_K.get_scale_min(b[:, 4:16])  # gguf-py's unpacking of the 6-bit scales and mins
    return d * sc.astype(np.float32), -(dmin * m.astype(np.float32))


def _q4_k(b):
    return (_k_low(b[:, 16:144]), *_k_scales(b))


def _q5_k(b):
    high = (b[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    return (_k_low(b[:, 48:176]) | (high.reshape(-1, 256) << 4), *_k_scales(b))


_DECODERS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k}


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """(rows, cols) codes < 2**bits -> (rows, cols*bits/32) uint32, MLX's little-endian bit stream."""
    rows, cols = codes.shape
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    if bits == 8:
        return codes.view(np.uint32)
    if bits == 4:
        return np.ascontiguousarray(codes[:, 0::2] | (codes[:, 1::2] << 4)).view(np.uint32)
    per_unit = 8 // math.gcd(bits, 8)  # codes that fill whole bytes: 2 of 4 bits, 8 of 3/5 bits, ...
    units = codes.reshape(rows, cols // per_unit, per_unit)
    words = units[..., 0].astype(np.uint64)
    for i in range(1, per_unit):
        words |= units[..., i].astype(np.uint64) << np.uint64(bits * i)
    unit_bytes = per_unit * bits // 8
    packed = words[..., None].view(np.uint8).reshape(rows, -1, 8)[..., :unit_bytes]  # little-endian
    return np.ascontiguousarray(packed).reshape(rows, -1).view(np.uint32)


# ---------------------------------------------------------------- requantized


def _requantized(blocks, type_name, shape, rows, cols):
    qtype = GGMLQuantizationType[type_name]
    n_bytes = block_bytes(type_name)[1]
    source_ss = 16 * sum(  # 16 weights per step
        float(np.sum(_source_steps(type_name, blocks[a:b].reshape(-1, n_bytes)).astype(np.float64) ** 2))
        for a, b in _chunks(rows, cols)
    )
    source_rms = math.sqrt(source_ss / (rows * cols) / 12)  # rounding error uniform over a step
    tries = [(bits, np.float16) for bits in REQUANTIZED[type_name]] + [(8, np.float32)]
    for bits, dtype in tries:
        arrays, rms, worst = _requantize(blocks, qtype, rows, cols, bits, dtype)
        if rms <= source_rms:
            break
    arrays = {k: v.reshape(*shape[:-1], -1) for k, v in arrays.items()}
    name = f"q{bits}g{GROUP}" + ("" if dtype == np.float16 else "-f32")
    return arrays, TensorReport(type_name, name, rms == 0.0, rms, worst, source_rms)


def _requantize(blocks, qtype, rows, cols, bits, dtype):
    weight = np.empty((rows, cols * bits // 32), np.uint32)
    scales = np.empty((rows, cols // GROUP), dtype)
    biases = np.empty_like(scales)

    def work(a, b):
        values = dequantize(np.ascontiguousarray(blocks[a:b]), qtype).astype(np.float32)  # gguf-py
        codes, scales[a:b], biases[a:b], err = affine(values, bits, dtype)
        weight[a:b] = pack(codes, bits)
        err -= values  # the dequantized values, less the reference: the error, in place
        flat = err.ravel()
        return float(np.dot(flat, flat)), max(float(flat.max()), -float(flat.min()))

    errors = _over_chunks(work, rows, cols)
    arrays = {"weight": mx.array(weight), "scales": mx.array(scales), "biases": mx.array(biases)}
    return arrays, math.sqrt(sum(e[0] for e in errors) / (rows * cols)), max(e[1] for e in errors)


def affine(values: np.ndarray, bits: int, dtype=np.float16):
    """MLX affine quantization of (rows, cols) floats per group of 32, the scale and bias rounded to
    `dtype` before the codes are chosen (so the codes fit the rounded scale; MLX's own quantize
    rounds them afterwards). Returns codes, scales, biases and the dequantized values."""
    rows, cols = values.shape
    g = values.reshape(rows, -1, GROUP)
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    top = 2**bits - 1
    scale, bias = ((hi - lo) / top).astype(dtype), lo.astype(dtype)
    # round outward, so that [bias, bias + top * scale] still covers [lo, hi]
    scale = np.where(scale.astype(np.float32) * top < hi - lo, np.nextafter(scale, dtype(np.inf)), scale)
    bias = np.where(bias.astype(np.float32) > lo, np.nextafter(bias, dtype(-np.inf)), bias)
    s, z = scale.astype(np.float32)[..., None], bias.astype(np.float32)[..., None]
    q = g - z  # then in place: codes as floats, then the dequantized values
    q *= np.divide(1, s, out=np.zeros_like(s), where=s > 0)  # a constant group: scale 0, codes 0
    np.clip(np.rint(q, out=q), 0, top, out=q)
    codes = q.astype(np.uint8)
    q *= s
    q += z
    return codes.reshape(rows, cols), scale, bias, q.reshape(rows, cols)


def _source_steps(type_name: str, b: np.ndarray) -> np.ndarray:
    """The quantization step of each 16-weight sub-block, (n_blocks, 16): d * |its scale|."""
    if type_name == "Q6_K":  # ql[128] qh[64] scales int8[16] d
        return np.abs(_f16(b[:, 208:210]) * b[:, 192:208].view(np.int8).astype(np.float32))
    if type_name == "Q2_K":  # scales[16] (low nibble: scale, high: min) qs[64] d dmin
        return np.abs(_f16(b[:, 80:82]) * (b[:, 0:16] & 0x0F).astype(np.float32))
    # Q3_K: hmask[32] qs[64] scales[12] (16 six-bit values, offset 32) d
    s = b[:, 96:108]
    low = (s[:, :8].reshape(-1, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(-1, 16) & 0x0F
    high = (s[:, 8:12].reshape(-1, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(-1, 16) & 3
    return np.abs(_f16(b[:, 108:110]) * ((low | (high << 4)).astype(np.float32) - 32))
