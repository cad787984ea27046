"""Row-invariant few-row attention on NVIDIA tensor cores (CUDA only): 16 slots a warp, each key read once for them.

    q (1, H, M, D), k (1, HKV, >= L, D), v (1, HKV, >= L, DV), all float16 or all bfloat16, H % HKV == 0,
    D % 16 == 0 and DV % 16 == 0, both <= 128; any strides. Masks, windows, `length`, softcaps, sinks and draft
    trees as in gpu_attention_source.py (the same params, tree rows and combine kernel).
    Output (1, H, M, DV) in T.

Why: the FMA kernel (gpu_attention_source.py) spends one FMA per key, dim and slot in one lane, plus its index
arithmetic: ~2,800 instructions a 32-key step at 4 slots (static SASS); 16 rows over 8,192 keys took 319 us on an
H200 where MLX's (not row-invariant) kernel takes 57. Here one warp scores 16 keys for 16 slots (query head, row)
with 2 D/16 `mma.sync.m16n8k16` and adds their values with 2 DV/8 more: 721 instructions a 16-key step for 16
slots in the main loop (static SASS, sm_90), ~7x fewer per key and slot. Its bits differ from the FMA kernel's, so a layer takes one family for every launch (attention.py).

Row invariance: an mma output element is its C plus the products of its own row of A and column of B, so a
slot's scores and its share of P x V never depend on the other slots (as the tensor-core qmm relies on; the
self-check tests it on the device). Everything else a slot computes is its own: its keys' mask, its max and
sum over the 4 lanes that hold its row (xor shuffles, a fixed order), its rescaling. A step past a slot's keys
is a no-op for it: its scores are masked, so its max is its old max, its rescale exp(0) = 1 and its P row 0,
which the mma adds to C exactly. So row m of an M-row call computes what a 1-row call over its keys computes.

    partial: grid (32, tiles, NCH), threadgroup (32, 1, 1); a warp serves one tile of up to 16 slots of one kv head
      (by_rows: any heads and rows; else the heads of one row) for chunk cz: keys [start + cz CHUNK, + CHUNK) in
      16-key steps, an online softmax (flash-attention 2): per step S = Q K^T (float32), masked and scaled (capped),
      m1 = max(m, rowmax S), P = exp(S - m1) (0 where masked), l = l exp(m - m1) + rowsum P, O = O exp(m - m1) + P V
      with P as two T parts for the mma, P rounded and its rounding error (P rounded alone, as flash attention and
      MLX's steel attention do, missed the float32 reference's tolerance by 2x at float16). Writes pmax, psum, pacc
      (H*M, NCH[, DV]) float32 for gpu_attention_source's combine.
    direct: the partial of a launch over one chunk without sinks: writes o = (O + 0) / l, the combine's arithmetic
      over one chunk (its weight exp(0) = 1; FMA(x, 1, 0) = x + 0), so the same bits as partial + combine.
Fragments (PTX ISA m16n8k16 .row.col, lane = 4 g + t): A a0 (row g, k 2t..2t+1), a1 (row g+8), a2 (row g,
k 2t+8..), a3 (row g+8, k 2t+8..); B b0 (k 2t..2t+1, column g), b1 (k 2t+8..); C/D (row g | g+8, column 2t | 2t+1).
Q is A (slots x dims), K^T is B (dims x keys), S's C fragment is P's A fragment as it stands (two 8-key tiles side
by side), V is B (keys x dims: two keys' values of one dim, packed by a byte permute). The k and n indices are
labels mapped to dims so a lane's are contiguous (see CORE): keys and values arrive in 16-byte loads.
Template: T, CHUNK (multiple of 16), DK = D / 16, DN = DV / 8, TREE (0 or 1).
"""

from __future__ import annotations

import mlx.core as mx

from .gpu_attention_source import (BODIES as FMA_BODIES, COMBINE_INPUTS, COMBINE_NAME, COMBINE_OUTPUTS, CUDA_HEADER,
                                   PARTIAL_INPUTS, PARTIAL_OUTPUTS, combine_template)
from .gpu_codegen import cuda_function, cuda_program
from .gpu_mma_source import MMA_OPS
from .tree_mask import TREE_ROW

PARTIAL_NAME, DIRECT_NAME = "mlxspec_sdpa_mma_partial", "mlxspec_sdpa_mma_direct"
CHUNK = 128  # keys a warp walks (8 steps) by default; the self-timing also tries timing.OTHER_CHUNKS (each its own bits)
SLOTS = 16  # (query head, row) slots a warp: the mma's 16 rows
MAX_DIM = 128  # Q's fragments (D / 16 x 4 registers) and O's (DV / 8 x 4) held a lane: 96 registers at 128
DTYPES = (mx.float16, mx.bfloat16)

# Shared with the Metal twin (gpu_attention_simdgroup_source.py): the tile's slots, their keys and the tree's lookup
# (each backend defines lane, wy, cz and SLOTS first)
SETUP = """  const int H = q_shape[1], M = q_shape[2], D = q_shape[3];
  const int HKV = k_shape[1], DV = v_shape[3];
  const int L = length[0] < k_shape[2] ? length[0] : k_shape[2];  // keys [0, L) of k count (never past k)
  const int TS = TREE ? tree[0] : -1;  // a draft tree's pass: keys from TS on are its nodes (gpu_attention_source)
  constexpr int TREE_ROW = @TREE_ROW;
#define TREE_KEY(t) (TS >= 0 && (t) >= TS ? TS + tree[tree_path + (t) - TS] : (t))
  const float sc = params[0], cap = params[4];
  const bool causal = params[1] != 0.0f, by_rows = params[3] != 0.0f;
  const int window = causal ? int(params[2]) : 0;
  const int S = k_shape[2];
  const int NCH = ((window > 0 && window < S ? window : S) + CHUNK - 1) / CHUNK;
  const int G = H / HKV;
  const int per_kv = by_rows ? G * M : G, SETS = (per_kv + SLOTS - 1) / SLOTS;  // slots, tiles per (kv head[, row])
  const int hk = by_rows ? wy / SETS : wy / (M * SETS), s0 = (wy % SETS) * SLOTS;
  const int nh = per_kv - s0 < SLOTS ? per_kv - s0 : SLOTS;  // this tile's slots: s0 .. s0 + nh - 1
#define SLOT_HEAD(r) (hk * G + (by_rows ? (s0 + (r)) / M : s0 + (r)))
#define SLOT_ROW(r) (by_rows ? (s0 + (r)) % M : wy / SETS - hk * M)
#define SLOT_KEYS(r) (TS >= 0 ? TS + tree[1 + SLOT_ROW(r) * TREE_ROW] : causal ? L - M + SLOT_ROW(r) + 1 : L)
  int rows_max = 0;  // the tile's last key + 1 (each slot sees keys [start, its own SLOT_KEYS))
  for (int r = 0; r < nh; ++r) rows_max = SLOT_KEYS(r) > rows_max ? SLOT_KEYS(r) : rows_max;
  const int tree_path = TS >= 0 ? 2 + SLOT_ROW(0) * TREE_ROW : 0;  // a tree's tile serves one row: its path
  const int start = window > 0 && rows_max > window ? rows_max - window : 0;  // one row's, or 0 for all (by_rows)
""".replace("@TREE_ROW", str(TREE_ROW))
UNDEFS = """#undef TREE_KEY
#undef SLOT_HEAD
#undef SLOT_ROW
#undef SLOT_KEYS
"""

CORE = """
  const int lane = int(threadIdx.x), wy = int(blockIdx.y), cz = int(blockIdx.z);
  constexpr int SLOTS = 16;  // the mma's rows
""" + SETUP + """  const int g = lane / 4, t = lane % 4;  // the mma's groupID and threadID_in_group
  int lim[2];  // this lane's slots g and g + 8: their keys' end, 0 for a slot past nh (every key masked)
#pragma unroll
  for (int h = 0; h < 2; ++h) lim[h] = g + 8 * h < nh ? SLOT_KEYS(g + 8 * h) : 0;
  // Which dims a lane holds (the mma's k and n indices are labels: any fixed map gives each slot its own sums).
  // Q K^T: lane t's k slots of step kk (2t, 2t+1 | 2t+8, 2t+9) are dims KD + 4 kk (+ 0, 1 | + 2, 3), KD = 4 DK t:
  // a lane's dims of a key are 4 DK contiguous ones, read in 16- or 8-byte loads straight into B's registers.
  // P V: column g of value tile n is dim DN g + n: a lane reads DN contiguous dims of each of its 4 keys, and C's
  // columns 2t, 2t + 1 of tile n are dims DN 2t + n, DN (2t + 1) + n.
  const int KD = 4 * DK * t, VD = DN * g;
  uint32_t qa[DK][4];  // Q as A fragments, once: slot g + 8 (i % 2), dims KD + 4 kk + 2 (i / 2) and the next
#pragma unroll
  for (int kk = 0; kk < DK; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = g + 8 * (i % 2), d = KD + 4 * kk + 2 * (i / 2);
      const int64_t at = r < nh ? SLOT_HEAD(r) * q_strides[1] + SLOT_ROW(r) * q_strides[2] + d * q_strides[3] : 0;
      qa[kk][i] = r < nh ? pack2<T>(float(q[at]), float(q[at + q_strides[3]])) : 0u;  // slots past nh: 0
    }
  // Keys' and values' dims in wide loads where a row's dims are contiguous and its rows 16-byte aligned (every KV
  // cache), else one 16-bit value at a time: the same values either way (uniform over the launch)
  const bool k_wide = k_strides[3] == 1 && k_strides[2] % 8 == 0 && k_strides[1] % 8 == 0
                      && reinterpret_cast<size_t>(k) % 16 == 0;
  const bool v_wide = v_strides[3] == 1 && v_strides[2] % 8 == 0 && v_strides[1] % 8 == 0
                      && reinterpret_cast<size_t>(v) % 16 == 0;
  const uint16_t* kh = reinterpret_cast<const uint16_t*>(k);  // raw 16-bit values
  const uint16_t* vh = reinterpret_cast<const uint16_t*>(v);
  const int64_t k_head = hk * k_strides[1], v_head = hk * v_strides[1];
  float m[2] = {-3.0e38f, -3.0e38f}, l[2] = {0.0f, 0.0f};  // slots g, g + 8: running max and sum
  float o[DN][4];  // O's C fragments: slots g | g + 8, value dims DN 2t + n, DN (2t + 1) + n
#pragma unroll
  for (int n = 0; n < DN; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[n][i] = 0.0f;
  const int first = start + cz * CHUNK, end = first + CHUNK < rows_max ? first + CHUNK : rows_max;
  for (int base = first; base < end; base += 16) {  // uniform over the warp: 16 keys a step
    float s[2][4];  // scores: two 8-key tiles, C fragments (slots g | g + 8, keys base + 8 nt + 2 t, + 1)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int key = base + 8 * nt + g;  // this lane's B column (keys past the tile's read key base: masked)
      const int64_t row = k_head + int64_t(TREE_KEY(key < rows_max ? key : base)) * k_strides[2];
      uint32_t kw[2 * DK];  // the lane's 4 DK dims of the key: step kk's B is kw[2 kk], kw[2 kk + 1]
      if (k_wide) {
        load_words<2 * DK>(kw, reinterpret_cast<const uint32_t*>(kh + row + KD));
      } else {
#pragma unroll
        for (int j = 0; j < 2 * DK; ++j)
          kw[j] = uint32_t(kh[row + (KD + 2 * j) * k_strides[3]]) | uint32_t(kh[row + (KD + 2 * j + 1) * k_strides[3]]) << 16;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) s[nt][i] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < DK; ++kk) mma_16816(s[nt], qa[kk], kw + 2 * kk, T());
    }
    // Each slot's step: scores scaled (capped) and masked, their max, weights and sum over its 4 lanes
    float p[2][4], c0[2];
    if (cap > 0.0f) {  // uniform: one branch a step, not one around each score's tanh
#pragma unroll
      for (int i = 0; i < 8; ++i) s[i / 4][i % 4] = cap * TANH(s[i / 4][i % 4] * sc / cap);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) s[i / 4][i % 4] *= sc;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float step_max = -3.0e38f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 2 * h + e, key = base + 8 * nt + 2 * t + e;
          s[nt][i] = key < lim[h] ? s[nt][i] : -3.0e38f;
          step_max = MAXF(step_max, s[nt][i]);
        }
      step_max = MAXF(step_max, __shfl_xor_sync(0xffffffffu, step_max, 1));
      step_max = MAXF(step_max, __shfl_xor_sync(0xffffffffu, step_max, 2));
      const float m1 = MAXF(m[h], step_max);
      c0[h] = EXP(m[h] - m1);  // 0 on a slot's first keys, 1 on a step without any (m1 = m)
      float step_sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 2 * h + e, key = base + 8 * nt + 2 * t + e;
          p[nt][i] = key < lim[h] ? EXP(s[nt][i] - m1) : 0.0f;
          step_sum += p[nt][i];
        }
      step_sum += __shfl_xor_sync(0xffffffffu, step_sum, 1);
      step_sum += __shfl_xor_sync(0xffffffffu, step_sum, 2);
      l[h] = FMA(l[h], c0[h], step_sum);
      m[h] = m1;
    }
    // P as A fragments: keys 2t, 2t + 1 of the first tile, then of the second (k + 8), in two parts, P rounded to T
    // and what that rounding left (exact in float32), each rounded to T: P x V then carries ~2 T's bits of P
    // (P in T alone, as flash attention does, missed the float32 reference's tolerance by 2x at float16)
    uint32_t pa[2][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int nt = i / 2, e = 2 * (i % 2);  // A's register i: slot g (i even) or g + 8, keys of tile i / 2
      const float hi0 = float(T(p[nt][e])), hi1 = float(T(p[nt][e + 1]));
      pa[0][i] = pack2<T>(hi0, hi1);
      pa[1][i] = pack2<T>(p[nt][e] - hi0, p[nt][e + 1] - hi1);
    }
    uint32_t vw[4][DN / 2];  // the lane's DN value dims of keys 2t, 2t + 1, 2t + 8, 2t + 9 (past the tile: key base)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int key = base + 2 * t + j % 2 + 8 * (j / 2);
      const int64_t row = v_head + int64_t(TREE_KEY(key < rows_max ? key : base)) * v_strides[2];
      if (v_wide) {
        load_words<DN / 2>(vw[j], reinterpret_cast<const uint32_t*>(vh + row + VD));
      } else {
#pragma unroll
        for (int i = 0; i < DN / 2; ++i)
          vw[j][i] = uint32_t(vh[row + (VD + 2 * i) * v_strides[3]]) | uint32_t(vh[row + (VD + 2 * i + 1) * v_strides[3]]) << 16;
      }
    }
#pragma unroll
    for (int n = 0; n < DN; ++n) {  // B of value tile n: dim VD + n of keys (2t, 2t + 1), then (2t + 8, 2t + 9)
      const uint32_t sel = n % 2 ? 0x7632u : 0x5410u;  // the two keys' high or low halves
      const uint32_t b[2] = {__byte_perm(vw[0][n / 2], vw[1][n / 2], sel), __byte_perm(vw[2][n / 2], vw[3][n / 2], sel)};
#pragma unroll
      for (int i = 0; i < 4; ++i) o[n][i] *= c0[i / 2];
      mma_16816(o[n], pa[0], b, T());
      mma_16816(o[n], pa[1], b, T());
    }
  }
//@WRITE
""" + UNDEFS

WRITE_PARTIAL = """#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    if (r < nh) {
      const size_t slot = size_t(SLOT_HEAD(r) * M + SLOT_ROW(r)) * NCH + cz;
      if (t == 0) pmax[slot] = m[h], psum[slot] = l[h];
#pragma unroll
      for (int n = 0; n < DN; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) pacc[slot * DV + DN * (2 * t + e) + n] = o[n][2 * h + e];
    }
  }
"""
WRITE_DIRECT = """#pragma unroll
  for (int h = 0; h < 2; ++h) {  // the combine over one chunk: weight exp(0) = 1, FMA(x, 1, 0) = x + 0
    const int r = g + 8 * h;
    if (r < nh) {
      const size_t hm = size_t(SLOT_HEAD(r) * M + SLOT_ROW(r));
      const float total = l[h] + 0.0f;
#pragma unroll
      for (int n = 0; n < DN; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) o_out[hm * DV + DN * (2 * t + e) + n] = static_cast<T>((o[n][2 * h + e] + 0.0f) / total);
    }
  }
"""
BODIES = {"partial": CORE.replace("//@WRITE\n", WRITE_PARTIAL), "direct": CORE.replace("//@WRITE\n", WRITE_DIRECT),
          "combine": FMA_BODIES[("cuda", "combine")]}
HEADER = CUDA_HEADER + MMA_OPS
DIRECT_OUTPUTS = ["o_out"]  # not "o": the body's accumulators are o


def supports(dtype, kv_dtype, d: int, dv: int) -> bool:
    """Shapes and dtypes this family takes (others stay with the FMA family for every launch of the layer)."""
    return dtype in DTYPES and kv_dtype == dtype and d % 16 == 0 and dv % 16 == 0 and 0 < d <= MAX_DIM and 0 < dv <= MAX_DIM


def tiles(h: int, hkv: int, m: int, by_rows: bool, slots: int = SLOTS) -> int:
    """Warps a chunk: one per 16 slots of a kv head (by_rows: its heads x rows; else the heads of one row)."""
    per_kv = h // hkv * (m if by_rows else 1)
    return hkv * (1 if by_rows else m) * ((per_kv + slots - 1) // slots)


def template(dtype, kv_dtype, d: int, dv: int, chunk: int = CHUNK, tree: bool = False) -> list[tuple]:
    """The kernels' template arguments (kv_dtype: the cache's, here always q's: `supports`; the Metal twin's signature)."""
    return [("T", dtype), ("CHUNK", chunk), ("DK", d // 16), ("DN", dv // 8), ("TREE", int(tree))]


def kernels(dtype, kv_dtype) -> dict:
    """kind -> ((name, inputs, outputs, output dtypes), input dtypes) as the wrapper and the tests build them."""
    return matrix_kernels(PARTIAL_NAME, DIRECT_NAME, dtype, kv_dtype)


def matrix_kernels(partial_name: str, direct_name: str, dtype, kv_dtype) -> dict:
    """kernels() of a matrix-unit family (this one, the Metal twin): its partial and direct kernels, the FMA combine."""
    f32 = mx.float32
    dtypes = {"q": dtype, "k": kv_dtype, "v": kv_dtype, "params": f32, "length": mx.int32, "tree": mx.int32}
    return {"partial": ((partial_name, PARTIAL_INPUTS, PARTIAL_OUTPUTS, [f32] * 3), dtypes),
            "direct": ((direct_name, PARTIAL_INPUTS, DIRECT_OUTPUTS, [dtype]), dtypes),
            "combine": ((COMBINE_NAME, COMBINE_INPUTS, COMBINE_OUTPUTS, [dtype]), dict.fromkeys(COMBINE_INPUTS, f32))}


def program_builds(template_of, dtype, kv_dtype, d: int, dv: int, chunk: int, sinks: bool) -> list[tuple]:
    """(label, kind, template arguments) of a matrix family's program: partial, partial_tree, direct, direct_tree,
    combine (template_of: the family's `template`)."""
    return [(label, kind, template_of(dtype, kv_dtype, d, dv, chunk, tree)) for label, kind, tree in
            (("partial", "partial", False), ("partial_tree", "partial", True), ("direct", "direct", False),
             ("direct_tree", "direct", True))] + [("combine", "combine", combine_template(dtype, sinks))]


def program(dtype, d: int, dv: int, chunk: int = CHUNK, sinks: bool = False) -> tuple[dict, str]:
    """({'partial', 'partial_tree', 'direct', 'direct_tree', 'combine'}: function names, the CUDA program) as
    mx.fast.cuda_kernel writes them (the tests compile it under the emulator)."""
    names, texts, ks = {}, [], kernels(dtype, dtype)
    for label, kind, targs in program_builds(template, dtype, dtype, d, dv, chunk, sinks):
        kernel, dtypes = ks[kind]
        names[label], text = cuda_function(kernel, dtypes, targs, BODIES[kind])
        texts.append(text)
    return names, cuda_program(HEADER, texts)
