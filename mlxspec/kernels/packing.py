"""How the int8-activation CPU kernel holds a layer: codes packed PACK columns chunk by chunk, biases implied.

    w4 = pack_codes(w, bits)          # (N, K*bits/32) uint32 -> the same shape, bytes reordered
    w == unpack_codes(w4, bits)       # and back, exactly
    pack_layer(layer); unpack_layer(layer)   # a swapped layer's own weight, in place
    rows = code_rows(layer, ids)      # rows in MLX's layout, packed or not (lookups, drafters' gathers)
    c = implied_bias(layer)           # biases = c x scales exactly (GGUF Q4_0: -8): the kernel skips reading them

MLX stores a layer's codes row by row. The CPU tile reads 4 columns (rows of w) at once, 128 codes
of each per step: 4 interleaved streams that are 5-9 cache lines long when K is a model's hidden
size (576-2048 at 4 bits), too short for the hardware prefetcher. Packed, each group of 4 rows keeps
its bytes but lays them out chunk 0 of each row, then chunk 1 of each, ...: one sequential stream
(qmm_q8_kernel.h's ColumnCodes reads it). Measured on the AMD EPYC VM, 26 matrices from memory, one
row: 1.13-1.6x the weight stream for rows of <= 2048 bytes, 0.88-1.03x at 3456 (K = 6912 at 4 bits),
so longer rows stay as they are (benchmarks/bench_layout.py, results/step.md).

Only the codes move: scales and biases keep MLX's layout, and the bytes held stay the same (the
packed array replaces the layer's weight; no second copy). A tied head's table is packed too; its
lookups unpack the 4-row groups of the tokens asked (code_rows). Every output keeps its bits: the
kernel's arithmetic per output does not depend on where the codes lie (registry.self_check compares).

GGUF Q4_0 and Q8_0 blocks have a scale and no minimum: mlxspec stores their biases as -8 / -128
times the scale. Where every bias is c x scale exactly, the tiles compute it from the scale they
read anyway (the same float32 value) and skip the biases' half-bit a weight: 10% fewer bytes a step
for a Q4_0 model. The biases stay in the layer (MLX's ops and lookups read them).
"""

from __future__ import annotations

from functools import lru_cache

import mlx.core as mx
import mlx.nn as nn
import numpy as np

PACK = 4  # columns per group: the int8 tile's width at one and two rows (VnniTiles::cols)
MAX_PACKED_ROW_BYTES = 2048  # longer rows keep MLX's layout (4 streams a tile prefetch well enough there)


def _sizes(w: mx.array, bits: int, pack: int) -> tuple[int, int, int, int]:
    """(groups, row bytes, chunk bytes, bytes of whole chunks a row) for w (N, K*bits/32)."""
    n, words = w.shape
    if n % pack:
        raise ValueError(f"packing needs N a multiple of {pack}, not {n}")
    row, chunk = words * 4, 16 * bits  # a chunk: 128 codes
    return n // pack, row, chunk, row // chunk * chunk


def pack_codes(w: mx.array, bits: int, pack: int = PACK) -> mx.array:
    """(N, K*bits/32) uint32 codes -> the packed layout of the same shape: per group of `pack` rows,
    their whole chunks side by side chunk by chunk, then their last, shorter chunks (if K % 128)."""
    groups, row, chunk, full = _sizes(w, bits, pack)
    b = w.view(mx.uint8).reshape(groups, pack, row)
    body = b[:, :, :full].reshape(groups, pack, full // chunk, chunk).transpose(0, 2, 1, 3).reshape(groups, -1)
    if full < row:  # (groups, pack * short chunk) after the whole ones
        body = mx.concatenate([body, b[:, :, full:].reshape(groups, -1)], axis=1)
    return body.reshape(w.shape[0], row).view(mx.uint32)


def unpack_codes(w: mx.array, bits: int, pack: int = PACK) -> mx.array:
    """pack_codes' inverse: MLX's row layout again."""
    groups, row, chunk, full = _sizes(w, bits, pack)
    b = w.view(mx.uint8).reshape(groups, pack * row)
    body = b[:, : pack * full].reshape(groups, full // chunk, pack, chunk).transpose(0, 2, 1, 3).reshape(groups, pack, full)
    if full < row:
        body = mx.concatenate([body, b[:, pack * full :].reshape(groups, pack, row - full)], axis=2)
    return body.reshape(w.shape[0], row).view(mx.uint32)


@lru_cache(maxsize=64)
def _word_offsets(words: int, bits: int, pack: int) -> mx.array:
    """(pack, words) int32: where word i of a group's row j lies within the packed group."""
    chunk = 4 * bits  # words of a whole chunk (128 codes)
    full = words // chunk * chunk
    i = np.arange(words)
    j = np.arange(pack)[:, None]
    body = (i // chunk) * pack * chunk + j * chunk + i % chunk
    tail = pack * full + j * (words - full) + (i - full)
    return mx.array(np.where(i < full, body, tail).astype(np.int32))


def code_rows(module: nn.Module, idx: mx.array) -> mx.array:
    """The codes of rows `idx` (any shape) in MLX's layout, packed or not: an embedding lookup, or a
    learned drafter's gather of head rows. Packed: one gather of each row's words (a few graph nodes
    a decoding step, not an unpacking of its group)."""
    w, pack = module["weight"], getattr(module, "_pack", 1)
    if pack == 1:
        return w[idx]
    words = w.shape[1]
    start = (idx // pack).astype(mx.int32) * (pack * words)  # each row's group
    return w.reshape(-1)[start[..., None] + _word_offsets(words, module.bits, pack)[idx % pack]]


def implied_bias(layer: nn.Module) -> float:
    """c where every bias of the layer is c times its scale, exactly in float32 (GGUF Q4_0: -8, Q8_0:
    -128, Q5_0 widened: -16), else 0. The int8 tiles then compute the bias as c x scale, the same
    float32 value, instead of reading it: Q4_0 weights are read at 4.5 bits, not 5."""
    s, b = layer["scales"].astype(mx.float32), layer.get("biases")
    if b is None or getattr(layer, "mode", "affine") != "affine":
        return 0.0
    b = b.astype(mx.float32)
    nonzero = mx.abs(s) > 0
    if not mx.any(nonzero).item():
        return 0.0
    first = mx.argmax(nonzero.reshape(-1)).item()
    c = (b.reshape(-1)[first] / s.reshape(-1)[first]).item()
    if c == 0 or c != round(c) or abs(c) > 1024:  # a small integer: c x scale is exact in float32
        return 0.0
    return c if mx.array_equal(s * c, b).item() else 0.0


def packable(layer: nn.Module) -> bool:
    """Pack this 2-D layer's codes? N must be a multiple of PACK, and rows short: at 3456 bytes
    (K = 6912 at 4 bits) packed codes measured 0.88-1.03x MLX's rows, at <= 2048 bytes 1.13-1.6x."""
    w = layer["weight"]
    return w.ndim == 2 and w.shape[0] % PACK == 0 and w.shape[1] * 4 <= MAX_PACKED_ROW_BYTES


def pack_layer(layer: nn.Module) -> None:
    """Replace the layer's weight by its packed codes (its kernel call then passes pack=PACK)."""
    layer["weight"] = pack_codes(layer["weight"], layer.bits)
    mx.eval(layer["weight"])
    layer._pack = PACK


def layout_args(layer: nn.Module) -> dict:
    """What a kernel call over this layer adds for its layout: {} for MLX's, else pack / bias_of_scale."""
    args = {"pack": layer._pack} if getattr(layer, "_pack", 1) > 1 else {}
    if getattr(layer, "_bias_of_scale", 0.0):
        args["bias_of_scale"] = layer._bias_of_scale
    return args


def unpack_layer(layer: nn.Module) -> None:
    """MLX's layout again (before MLX's own matmul reads it): codes in rows, biases read."""
    if getattr(layer, "_pack", 1) > 1:
        layer["weight"] = unpack_codes(layer["weight"], layer.bits, layer._pack)
        mx.eval(layer["weight"])
        layer._pack = 1
    if getattr(layer, "_bias_of_scale", 0.0):
        layer._bias_of_scale = 0.0
