"""Row-invariant few-row attention on Apple GPUs' simdgroup matrices (Metal only): 8 slots a simdgroup.

    q (1, H, M, D) float32 / float16 / bfloat16, k (1, HKV, >= L, D), v (1, HKV, >= L, DV) in q's dtype (or float16
    under float32 queries), H % HKV == 0, D and DV multiples of 8 up to 256; any strides. Masks, windows, `length`,
    softcaps, sinks and draft trees as in gpu_attention_source.py (the same params, tree rows and combine kernel).
    Output (1, H, M, DV) in q's dtype.

The CUDA tensor-core design (gpu_attention_mma_source.py, which explains why and the row invariance) on Apple's
8 x 8 float32 matrices: one simdgroup scores 8 keys for 8 slots (query head, row) with D/8
`simdgroup_multiply_accumulate`s and adds their values with DV/8 more. Every value enters the matrices as float32
(exact), and P stays float32, so no rounding the FMA family does not do either (the sums' order is the hardware's
own). Its bits differ from the FMA kernel's: a layer takes one family for every launch (attention.py).

Layout (MLX's steel/gemm/mma.h, BaseMMAFrag::get_coord): lane l holds elements (fm, fn), (fm, fn + 1) of each
8 x 8 matrix, fm = (l / 4 & 4) + (l / 2 % 4), fn = (l / 4 & 2) * 2 + (l % 2) * 2: the 4 lanes of a row fm differ
in bits 0 and 3 of l (xor shuffles 1 and 8 reduce a row). The k and n indices are labels, mapped to dims so each
lane reads contiguous ones:
    S = Q K^T, step s of DK = D / 8:  A (slot fm; k fn, fn + 1) = dims fn DK + s, (fn + 1) DK + s of q;
                                       B (k fm; keys fn, fn + 1) = dim fm DK + s of those keys
    O += P V, value tile j of DN = DV / 8:  A = P as S's C fragment holds it (slot fm; keys fn, fn + 1);
                                       B (key fm; columns fn, fn + 1) = dims fn DN + j, (fn + 1) DN + j
    C of O (slot fm; columns fn, fn + 1 of tile j) = dims fn DN + j, (fn + 1) DN + j
    partial: grid (32, tiles, NCH), threadgroup (32, 1, 1); direct: grid (32, tiles, 1) for one chunk, no sinks.
    Template: T (q's), KT (k's and v's), CHUNK (multiple of 8), DK, DN, TREE.
"""

from __future__ import annotations

import mlx.core as mx

from .gpu_attention_mma_source import SETUP, UNDEFS, matrix_kernels, program_builds, tiles as _tiles
from .gpu_attention_source import BODIES as FMA_BODIES, METAL_HEADER
from .gpu_codegen import metal_function
from .gpu_simdgroup_source import MMA8

PARTIAL_NAME, DIRECT_NAME = "mlxspec_sdpa_simdgroup_partial", "mlxspec_sdpa_simdgroup_direct"
CHUNK = 128  # keys a simdgroup walks (16 steps of 8) by default; the self-timing also tries timing.OTHER_CHUNKS
SLOTS = 8  # (query head, row) slots a simdgroup: the matrices' 8 rows
MAX_DIM = 256  # Q's fragments (D / 8 x 2 floats a lane) and O's (DV / 8 x 2): 128 floats at 256

CORE = """
  const int lane = int(thread_position_in_grid.x), wy = int(thread_position_in_grid.y), cz = int(thread_position_in_grid.z);
  constexpr int SLOTS = 8;  // the matrices' rows
""" + SETUP + """  const int fm = (lane / 4 & 4) + (lane / 2) % 4, fn = (lane / 4 & 2) * 2 + (lane % 2) * 2;  // MLX's layout
  const int lim = fm < nh ? SLOT_KEYS(fm) : 0;  // this lane's slot fm: its keys' end (past nh: 0, every key masked)
  float qa[DK][2];  // Q as A fragments, once: slot fm, dims fn DK + s and (fn + 1) DK + s (slots past nh: 0)
  UNROLL for (int s = 0; s < DK; ++s)
    UNROLL for (int e = 0; e < 2; ++e)
      qa[s][e] = fm < nh ? float(q[SLOT_HEAD(fm) * q_strides[1] + SLOT_ROW(fm) * q_strides[2] + ((fn + e) * DK + s) * q_strides[3]])
                         : 0.0f;
  const int64_t k_head = hk * k_strides[1], v_head = hk * v_strides[1];
  float m = -3.0e38f, l = 0.0f;  // slot fm: running max and sum
  float o[DN][2];  // O's C fragments: slot fm, dims fn DN + j and (fn + 1) DN + j
  UNROLL for (int j = 0; j < DN; ++j) o[j][0] = o[j][1] = 0.0f;
  const int first = start + cz * CHUNK, end = first + CHUNK < rows_max ? first + CHUNK : rows_max;
  for (int base = first; base < end; base += 8) {  // uniform over the simdgroup: 8 keys a step
    float s2[2] = {0.0f, 0.0f};  // scores: slot fm, keys base + fn, base + fn + 1
    int64_t kr[2];  // those keys' rows (past the tile: key base, masked)
    UNROLL for (int e = 0; e < 2; ++e) {
      const int key = base + fn + e;
      kr[e] = k_head + int64_t(TREE_KEY(key < rows_max ? key : base)) * k_strides[2];
    }
    UNROLL for (int s = 0; s < DK; ++s) {
      const int64_t d = (fm * DK + s) * k_strides[3];
      mma8(s2, qa[s][0], qa[s][1], float(k[kr[0] + d]), float(k[kr[1] + d]));
    }
    float p[2];
    UNROLL for (int e = 0; e < 2; ++e) {
      const float x = cap > 0.0f ? cap * TANH(s2[e] * sc / cap) : s2[e] * sc;
      s2[e] = base + fn + e < lim ? x : -3.0e38f;
    }
    float step_max = MAXF(s2[0], s2[1]);
    step_max = MAXF(step_max, simd_shuffle_xor(step_max, ushort(1)));
    step_max = MAXF(step_max, simd_shuffle_xor(step_max, ushort(8)));
    const float m1 = MAXF(m, step_max);
    const float c0 = EXP(m - m1);  // 0 on the slot's first keys, 1 on a step without any (m1 = m)
    UNROLL for (int e = 0; e < 2; ++e) p[e] = base + fn + e < lim ? EXP(s2[e] - m1) : 0.0f;
    float step_sum = p[0] + p[1];
    step_sum += simd_shuffle_xor(step_sum, ushort(1));
    step_sum += simd_shuffle_xor(step_sum, ushort(8));
    l = FMA(l, c0, step_sum);
    m = m1;
    const int vkey = base + fm;  // B's row of P V: this lane's key (past the tile: key base, weight 0)
    const int64_t vr = v_head + int64_t(TREE_KEY(vkey < rows_max ? vkey : base)) * v_strides[2];
    UNROLL for (int j = 0; j < DN; ++j) {
      o[j][0] *= c0, o[j][1] *= c0;
      mma8(o[j], p[0], p[1], float(v[vr + (fn * DN + j) * v_strides[3]]), float(v[vr + ((fn + 1) * DN + j) * v_strides[3]]));
    }
  }
//@WRITE
""" + UNDEFS

WRITE_PARTIAL = """  if (fm < nh) {
    const size_t slot = size_t(SLOT_HEAD(fm) * M + SLOT_ROW(fm)) * NCH + cz;
    if (fn == 0) pmax[slot] = m, psum[slot] = l;  // one of the row's 4 lanes
    UNROLL for (int j = 0; j < DN; ++j)
      UNROLL for (int e = 0; e < 2; ++e) pacc[slot * DV + (fn + e) * DN + j] = o[j][e];
  }
"""
WRITE_DIRECT = """  if (fm < nh) {  // the combine over one chunk: weight exp(0) = 1, FMA(x, 1, 0) = x + 0
    const size_t hm = size_t(SLOT_HEAD(fm) * M + SLOT_ROW(fm));
    const float total = l + 0.0f;
    UNROLL for (int j = 0; j < DN; ++j)
      UNROLL for (int e = 0; e < 2; ++e) o_out[hm * DV + (fn + e) * DN + j] = static_cast<T>((o[j][e] + 0.0f) / total);
  }
"""
BODIES = {"partial": CORE.replace("//@WRITE\n", WRITE_PARTIAL), "direct": CORE.replace("//@WRITE\n", WRITE_DIRECT),
          "combine": FMA_BODIES[("metal", "combine")]}
HEADER = METAL_HEADER + MMA8 + """#define UNROLL _Pragma("clang loop unroll(full)")  // loops over template constants: registers, not memory
"""


def supports(dtype, kv_dtype, d: int, dv: int) -> bool:
    """Signatures this family takes (others stay with the FMA family for every launch of the layer)."""
    dtypes_ok = kv_dtype == dtype or (dtype == mx.float32 and kv_dtype == mx.float16)
    return (dtypes_ok and dtype in (mx.float32, mx.float16, mx.bfloat16) and d % 8 == 0 and dv % 8 == 0
            and 0 < d <= MAX_DIM and 0 < dv <= MAX_DIM)


def tiles(h: int, hkv: int, m: int, by_rows: bool) -> int:
    """Simdgroups a chunk: one per 8 slots of a kv head (by_rows: its heads x rows; else the heads of one row)."""
    return _tiles(h, hkv, m, by_rows, SLOTS)


def template(dtype, kv_dtype, d: int, dv: int, chunk: int = CHUNK, tree: bool = False) -> list[tuple]:
    return [("T", dtype), ("KT", kv_dtype), ("CHUNK", chunk), ("DK", d // 8), ("DN", dv // 8), ("TREE", int(tree))]


def kernels(dtype, kv_dtype) -> dict:
    """kind -> ((name, inputs, outputs, output dtypes), input dtypes)."""
    return matrix_kernels(PARTIAL_NAME, DIRECT_NAME, dtype, kv_dtype)


SIZES = {"q": 99, "k": 99, "v": 99, "params": 5, "length": 1, "tree": 99, "pmax": 99, "psum": 99, "pacc": 99}


def program(dtype, kv_dtype, d: int, dv: int, chunk: int = CHUNK, sinks: bool = False) -> tuple[dict, str]:
    """({'partial', 'partial_tree', 'direct', 'direct_tree', 'combine'}: function names, the Metal program) as
    mx.fast.metal_kernel writes them (the tests compile it under the emulator)."""
    names, texts, ks = {}, [], kernels(dtype, kv_dtype)
    sizes = SIZES | {"sinks": 99 if sinks else 1, "o": 99, "o_out": 99}
    for label, kind, targs in program_builds(template, dtype, kv_dtype, d, dv, chunk, sinks):
        kernel, dtypes = ks[kind]
        names[label], text = metal_function(kernel, dtypes, sizes, targs, BODIES[kind])
        texts.append(text)
    return names, HEADER + "".join(texts)
