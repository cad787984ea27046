"""Row-invariant few-row attention for the GPU (flash-decoding), one source for Metal and CUDA.

    q (1, H, M, D) in T, k (1, HKV, >= L, D), v (1, HKV, >= L, DV) in T or (T float32) float16, H % HKV == 0,
    D, DV <= 256; any strides
    (read through q/k/v_strides: a KV cache view is read in place)
    causal: row m sees keys [0, L - M + m + 1); else all L. window W > 0 (causal only): row m sees the
    last W of those, [start, rows) with start = max(0, rows - W): a sliding-window layer.
    sinks (SINKS = 1): one extra logit per head (gpt-oss), in the softmax's denominator, with no value.
    softcap c > 0 (Gemma 2): each score s becomes c * tanh(s / c) before the softmax.
    tree (TREE = 1 builds): the last M keys are a draft tree's nodes; row m sees the keys before them and
    its path's nodes, each index mapped so the row computes what a one-row call over those keys in order
    computes (`tree`: gpu_attention.tree_rows).
    Output (1, H, M, DV) in T.

Three kernels:
  partial: grid (32, WARPS * blocks, NCH), threadgroup (32, WARPS, 1), NCH = ceil(min(S, W or S) / CHUNK), S = k's
    keys. A block serves up to HEADS slots (query head, row) of one kv head for chunk c: the heads of one row, or
    any heads and rows where every row starts at key 0 (params[3], `partial_blocks`). The chunk's keys
    [start + c*CHUNK, start + (c+1)*CHUNK) come in 32-key steps, each slot clipped to its own keys; the block's
    warps take the steps in rounds (warp w: steps w, w + WARPS, ...), all in flight at once. In a step lane j
    reads key base + j (16-byte loads on CUDA where the cache allows, else one value at a time: the same values)
    and forms each slot's dot over d = 0, 1, ..., D-1 in order, the query's dims read from threadgroup memory
    (one address for every lane: a broadcast). Then per slot the step's own softmax terms: its max (lane_max),
    p_j = exp(s_j - max), their sum (lane_sum) and acc[d] = sum_j p_j v[j][d] in j order (value rows loaded 8 at
    a time; on CUDA where a row's dims are contiguous and aligned, a lane's DPL dims in one load, 32 rows of them at
    fp16 and D = 128, the first batch issued before the keys' loads so both latencies overlap). The steps then fold into the chunk's state in key order, one warp at a time between barriers:
    m1 = max(m0, max), state = state * exp(m0 - m1) + step * exp(max - m1); a step without a slot's keys
    leaves its state as it was. So WARPS changes only the schedule, never the bits (tested for 1, 2, 4, 8).
    Before: one warp walked a chunk's 8 steps one after another (a chained call over 300 keys took 190 us
    on an H100, MLX's 27: 2026-11-28).
    Writes pmax, psum (H*M, NCH) and pacc (H*M, NCH, DV) in float32; an empty chunk has psum = 0.
  combine: grid (32, H*M, 1). Chunks with psum > 0 in chunk order: global max, then weighted sums;
    with sinks, the row's sink logit joins the max and adds exp(sink - max) to the denominator last.
  direct: the partial for launches over at most DIRECT_CHUNKS chunks without sinks, grid (32, WARPS * blocks, 1):
    a block walks the chunks one after another (those before its slots' last key), keeps each one's state in
    threadgroup memory and writes o (1, H, M, DV) by the combine's arithmetic over them, term for term (one launch,
    no float32 round trip; the same bits as partial + combine: tested).
Chunk boundaries are multiples of CHUNK from the row's first key and each step depends only on the
keys the row sees, so row m of an M-row call computes exactly what a 1-row call over those keys
computes (whatever keys before them the cache still holds): same chunks, same order, same combine.
Template: T (dtype), CHUNK (multiple of 32; 256 in production, smaller in tests), HEADS, DPL, WARPS and PACK
(partial: slots a block, dims a lane, warps a block, packed value loads; none changes the bits), TREE (partial: 0 or 1),
SINKS (0 or 1). The mask is a runtime
value (params = [scale, causal, window, by_rows, softcap]) so every mask runs the very same code. L, the keys
that count, is a runtime value too (`length`, one int32): a compiled step passes its whole cache buffer
(NCH from its capacity) and the length from its graph; chunks past L are empty, so the bits are those of
a call over k[:, :, :L].
"""

from __future__ import annotations

import mlx.core as mx

from .gpu_codegen import cuda_function, cuda_program, metal_function
from .tree_mask import TREE_ROW

PARTIAL_NAME = "mlxspec_sdpa_partial"
COMBINE_NAME = "mlxspec_sdpa_combine"
PARTIAL_INPUTS = ["q", "k", "v", "params", "length", "tree"]  # length, tree: int32
PARTIAL_OUTPUTS = ["pmax", "psum", "pacc"]
DIRECT_NAME, DIRECT_OUTPUTS = "mlxspec_sdpa_direct", ["o"]  # the partial whose chunk is a row's all: writes o itself
COMBINE_INPUTS, COMBINE_OUTPUTS = ["pmax", "psum", "pacc", "sinks"], ["o"]  # sinks (H*M,) float32, or 1 unused
CHUNK = 256  # keys per partial block
MAX_VALUE_DIM = 256  # 8 dims per lane, for the query/key dims and the value dims alike
HEADS = 4  # query heads sharing a kv head that one partial block serves (each key and value read once for them)
THREADGROUP = (32, 1, 1)  # the combine's
# A launch whose keys span at most this many chunks (and no sinks) is one kernel: the direct build walks the chunks in
# one block and combines them itself (the same bits as partial + combine), one launch fewer (~12 us each through MLX's
# CUDA custom kernels, 2026-11 H200) for chunks walked one after another (a guess, unmeasured: bench_gpu's ours-split)
DIRECT_CHUNKS = 4
WARPS = CHUNK // 32  # warps a partial block at most: one 32-key step each (1, 2, 4: the same bits; launch_warps picks)

# //@WIDE and //@KEYS are filled per backend (CUDA_WIDE and CUDA_KEYS, METAL_KEYS: below)
PARTIAL_CORE = """
  const int H = q_shape[1], M = q_shape[2], D = q_shape[3];
  const int HKV = k_shape[1], DV = v_shape[3];
  const int L = length[0] < k_shape[2] ? length[0] : k_shape[2];  // keys [0, L) of k count (never past k)
  // A draft tree's pass (TS = tree[0] >= 0, the host's by_rows off): keys from TS on are the tree's nodes, and
  // row m sees keys [0, TS), then its path's nodes TS + tree[path + j], j < tree[path - 1] (path = 2 + m TREE_ROW):
  // every index below is the one a one-row call over that path, laid out in order, would use (TREE_KEY maps it).
  const int TS = TREE ? tree[0] : -1;  // TREE: a template constant, so the other builds carry none of this
  constexpr int TREE_ROW = @TREE_ROW;  // gpu_attention_source.TREE_ROW
  constexpr int STEPS = CHUNK / 32;  // 32-key steps a chunk; WARPS warps take them in rounds
#define TREE_KEY(t) (TS >= 0 && (t) >= TS ? TS + tree[tree_path + (t) - TS] : (t))
  const float sc = params[0];
  const float cap = params[4];  // logit softcap (Gemma 2): a score becomes cap * tanh(score / cap); 0: none
  const bool causal = params[1] != 0.0f;
  const int window = causal ? int(params[2]) : 0;
  const int S = k_shape[2];  // keys launched over: the grid's chunks (NCH) come from S, as the host computed them
  const int NCH = ((window > 0 && window < S ? window : S) + CHUNK - 1) / CHUNK;
  // A block serves up to HEADS slots (query head, row) of one kv head: the heads of one row, or (by_rows:
  // every row starts at key 0) any heads and rows. Each key and value is read once for all its slots.
  const int G = H / HKV;
  const bool by_rows = params[3] != 0.0f;
  const int per_kv = by_rows ? G * M : G, SETS = (per_kv + HEADS - 1) / HEADS;  // slots, blocks per (kv head[, row])
  const int hk = by_rows ? wy / SETS : wy / (M * SETS), s0 = (wy % SETS) * HEADS;
  const int nh = per_kv - s0 < HEADS ? per_kv - s0 : HEADS;  // this block's slots: s0 .. s0 + nh - 1
#define SLOT_HEAD(r) (hk * G + (by_rows ? (s0 + (r)) / M : s0 + (r)))
#define SLOT_ROW(r) (by_rows ? (s0 + (r)) % M : wy / SETS - hk * M)
  int rows[HEADS];  // each slot's keys [start, rows)
  int rows_max = 0;
#pragma unroll
  for (int r = 0; r < HEADS; ++r) {
    rows[r] = TS >= 0 ? TS + tree[1 + SLOT_ROW(r) * TREE_ROW] : causal ? L - M + SLOT_ROW(r) + 1 : L;  // as a 1-row call's
    if (r < nh && rows[r] > rows_max) rows_max = rows[r];
  }
  const int tree_path = TS >= 0 ? 2 + SLOT_ROW(0) * TREE_ROW : 0;  // a tree's block serves one row: its path
  const int start = window > 0 && rows_max > window ? rows_max - window : 0;  // one row's, or 0 for all (by_rows)
  // Shared by the block's warps: the slots' query dims (every lane reads them as broadcasts), and the chunk's
  // softmax state, into which the 32-key steps fold one after another in key order (step s reads state s).
  TG_SHARED float q_sh[HEADS][DPL * 32];
  TG_SHARED float fold_acc[HEADS][DPL * 32];
  TG_SHARED float fold_max[STEPS + 1][HEADS], fold_sum[STEPS + 1][HEADS];
//@DIRECT
  for (int e = w * 32 + lane; e < HEADS * DPL * 32; e += WARPS * 32) {
    const int r = e / (DPL * 32), d = e % (DPL * 32);
    q_sh[r][d] = r < nh && d < D ? float(q[SLOT_HEAD(r) * q_strides[1] + SLOT_ROW(r) * q_strides[2] + d * q_strides[3]]) : 0.0f;
    fold_acc[r][d] = 0.0f;
  }
  if (w == 0 && lane < HEADS) fold_max[0][lane] = -3.0e38f, fold_sum[0][lane] = 0.0f;
  TG_BARRIER;  // the queries in place before any warp scores a key
  // DPL: dims per lane (ceil(max(D, DV) / 32), at most 8): dims lane + 32 i past D or DV are skipped
  int64_t vd[DPL];  // the lane's value dims' offsets in a value row (the strides are runtime values)
#pragma unroll
  for (int i = 0; i < DPL; ++i) vd[i] = (lane + 32 * i) * v_strides[3];
  const bool v_dense = v_strides[3] == 1;  // a value row's dims contiguous (every KV cache): no per-value index math
//@VPACK
  const int64_t k_head = hk * k_strides[1], v_head = hk * v_strides[1];
//@WIDE
//@CHUNKS
    const int first = start + c * CHUNK;
    for (int round = 0; round < (STEPS + WARPS - 1) / WARPS; ++round) {  // uniform over the block
      const int step = round * WARPS + w, base = first + 32 * step;  // this warp's keys: base .. base + 31
      float step_max[HEADS], step_sum[HEADS], acc[HEADS][DPL];  // the step's own softmax terms, per slot
#pragma unroll
      for (int r = 0; r < HEADS; ++r) {
        step_max[r] = -3.0e38f, step_sum[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[r][i] = 0.0f;
      }
      if (step < STEPS && base < rows_max) {  // uniform over the warp: lane j scores key base + j
        const int t = base + lane;
        const int count = rows_max - base < 32 ? rows_max - base : 32;
        bool on[HEADS];  // the slot's own call would run this step (its keys reach it)
        int n_keys[HEADS];  // of which keys base .. base + n_keys - 1
        float dot[HEADS];
#pragma unroll
        for (int r = 0; r < HEADS; ++r) {
          on[r] = r < nh && base < rows[r];
          n_keys[r] = rows[r] - base < 32 ? rows[r] - base : 32;
          dot[r] = 0.0f;
        }
        const int64_t kr = k_head + int64_t(TREE_KEY(t < rows_max ? t : base)) * k_strides[2];  // lanes past the keys read key base
//@PREFETCH
//@KEYS
        float p[HEADS];  // lane j: key base + j's weight exp(score - the step's max), per slot
#pragma unroll
        for (int r = 0; r < HEADS; ++r) {  // every slot's shuffles, on or off: no branch around them (an off slot's
          // max stays -3e38 and its sum 0, as if skipped), so the compiler needs no divergence handling for them
          const float s = on[r] && lane < n_keys[r] ? (cap > 0.0f ? cap * TANH(dot[r] * sc / cap) : dot[r] * sc) : -3.0e38f;
          step_max[r] = lane_max(s);
          p[r] = on[r] && t < rows[r] ? EXP(s - step_max[r]) : 0.0f;
          step_sum[r] = lane_sum(p[r]);
        }
//@VALUES
      }
      // Fold the round's steps into the chunk's state in key order (whatever WARPS is: the same bits). A step with
      // none of a slot's keys (step_sum 0) passes its state on unchanged.
      for (int turn = 0; turn < WARPS; ++turn) {
        TG_BARRIER;
        if (turn == w && step < STEPS) {
#pragma unroll
          for (int r = 0; r < HEADS; ++r) {
            const bool add = r < nh && step_sum[r] > 0.0f;  // uniform over the warp
            const float m0 = fold_max[step][r], m1 = add ? MAXF(m0, step_max[r]) : m0;
            const float c0 = EXP(m0 - m1), c1 = EXP(step_max[r] - m1);  // c0 = 0 on a slot's first keys
            if (lane == 0) fold_max[step + 1][r] = m1, fold_sum[step + 1][r] = add ? FMA(fold_sum[step][r], c0, step_sum[r] * c1) : fold_sum[step][r];
#pragma unroll
            for (int i = 0; i < DPL; ++i)
              if (add && VD(i) < DV) fold_acc[r][VD(i)] = FMA(fold_acc[r][VD(i)], c0, acc[r][i] * c1);
          }
        }
      }
    }
    TG_BARRIER;
//@KEEP
  }
//@WRITE
#undef TREE_KEY
#undef VD
#undef SLOT_HEAD
#undef SLOT_ROW
#undef TG_SHARED
#undef TG_BARRIER
"""

COMBINE_CORE = """
  const int NCH = pacc_shape[1], DV = pacc_shape[2];
  const size_t row = size_t(hm) * NCH;
  float gmax = -3.0e38f;
  for (int c = 0; c < NCH; ++c)
    if (psum[row + c] > 0.0f) gmax = MAXF(gmax, pmax[row + c]);  // empty chunks (psum 0) never count
  if (SINKS) gmax = MAXF(gmax, sinks[hm]);
  float total = 0.0f, acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
  for (int c = 0; c < NCH; ++c) {
    if (psum[row + c] > 0.0f) {
      const float wgt = EXP(pmax[row + c] - gmax);
      total = FMA(psum[row + c], wgt, total);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (lane + 32 * i < DV) acc[i] = FMA(pacc[(row + c) * DV + lane + 32 * i], wgt, acc[i]);
    }
  }
  if (SINKS) total += EXP(sinks[hm] - gmax);  // a logit with no value: only the denominator grows
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (lane + 32 * i < DV) o[size_t(hm) * DV + lane + 32 * i] = static_cast<T>(acc[i] / total);
"""

# The partial's last phase: its chunk's state to pmax / psum / pacc for the combine, or (the direct build, launched
# over at most DIRECT_CHUNKS chunks and no sinks) the output itself, by the combine's arithmetic over the chunks it
# kept, term for term, so a direct launch's rows have the bits partial + combine give (tested).
WRITE_PARTIAL = """  for (int r = w; r < nh; r += WARPS) {  // warp w writes slots w, w + WARPS, ...
    const size_t slot = size_t(SLOT_HEAD(r) * M + SLOT_ROW(r)) * NCH + cz;  // its chunk: the grid's z
    if (lane == 0) { pmax[slot] = fold_max[STEPS][r]; psum[slot] = fold_sum[STEPS][r]; }
#pragma unroll
    for (int i = 0; i < DPL; ++i)
      if (VD(i) < DV) pacc[slot * DV + VD(i)] = fold_acc[r][VD(i)];
  }
"""
WRITE_DIRECT = """  for (int r = w; r < nh; r += WARPS) {  // the combine's arithmetic over the kept chunks, term for term
    const size_t hm = size_t(SLOT_HEAD(r) * M + SLOT_ROW(r));
    float gmax = -3.0e38f, total = 0.0f, a[DPL];
    for (int ch = 0; ch < chunks; ++ch)
      if (kept_sum[ch][r] > 0.0f) gmax = MAXF(gmax, kept_max[ch][r]);
#pragma unroll
    for (int i = 0; i < DPL; ++i) a[i] = 0.0f;
    for (int ch = 0; ch < chunks; ++ch) {
      if (kept_sum[ch][r] > 0.0f) {
        const float wgt = EXP(kept_max[ch][r] - gmax);
        total = FMA(kept_sum[ch][r], wgt, total);
#pragma unroll
        for (int i = 0; i < DPL; ++i) a[i] = FMA(kept_acc[ch][r][VD(i)], wgt, a[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < DPL; ++i)
      if (VD(i) < DV) o[hm * DV + VD(i)] = static_cast<T>(a[i] / total);
  }
"""

METAL_PARTIAL_PROLOGUE = """
  const int lane = int(thread_position_in_grid.x);  // the grid's x is one warp: 32 threads
  const int wy = int(thread_position_in_grid.y) / WARPS, w = int(thread_position_in_grid.y) % WARPS;
  const int cz = int(thread_position_in_grid.z);  // the partial's chunk (the direct build walks them all)
#define TG_SHARED threadgroup
#define TG_BARRIER threadgroup_barrier(mem_flags::mem_threadgroup)
"""
METAL_COMBINE_PROLOGUE = """
  const int lane = int(thread_position_in_grid.x);
  const int hm = int(thread_position_in_grid.y);
"""
KEY_ONE_BY_ONE = """// dims d0 .. d0 + 31 of a key (stride s; past d: dim 0's, never used) as floats, one value at a time
#define LOAD_KEY_ONE_BY_ONE(out, row, d0, d, s) \
  for (int j_ = 0; j_ < 32; ++j_) (out)[j_] = float((row)[int64_t((d0) + j_ < (d) ? (d0) + j_ : 0) * (s)])
"""  # both backends' fallback (Metal's only way)

METAL_HEADER = """
#define FMA(a, b, c) metal::fma(a, b, c)
#define MAXF(a, b) metal::max(a, b)
#define EXP(a) metal::exp(a)
#define TANH(a) metal::precise::tanh(a)
inline float lane_sum(float v) { return simd_sum(v); }
inline float lane_max(float v) { return simd_max(v); }
inline float lane_shuffle(float v, int src) { return simd_shuffle(v, ushort(src)); }
""" + KEY_ONE_BY_ONE

CUDA_PARTIAL_PROLOGUE = """
  const int lane = int(threadIdx.x), w = int(threadIdx.y);  // a block: WARPS warps
  const int wy = int(blockIdx.y), cz = int(blockIdx.z);  // cz: the partial's chunk (the direct build walks them all)
#define TG_SHARED __shared__
#define TG_BARRIER __syncthreads()
"""
CUDA_COMBINE_PROLOGUE = """
  const int lane = int(threadIdx.x);
  const int hm = int(blockIdx.y);
"""
CUDA_HEADER = """
#define FMA(a, b, c) fmaf(a, b, c)
#define MAXF(a, b) fmaxf(a, b)
#define EXP(a) expf(a)
#define TANH(a) tanhf(a)
// xor butterflies: fixed order, every lane ends with the same bits
__device__ inline float lane_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float lane_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ inline float lane_shuffle(float v, int src) { return __shfl_sync(0xffffffffu, v, src); }
// Can keys be read 16 bytes at a time? Dims contiguous, every key row and dim 32 i aligned, D whole loads.
template <typename E> __device__ inline bool keys_wide(const E* p, int64_t s1, int64_t s2, int64_t s3, int d) {
  constexpr int PER = 16 / int(sizeof(E));
  return s3 == 1 && s2 % PER == 0 && s1 % PER == 0 && d % PER == 0 && reinterpret_cast<size_t>(p) % 16 == 0;
}
// A lane's N contiguous value dims of one row as raw 32-bit words, in one 4-, 8- or 16-byte load (two for 32 bytes;
// OK: N values make one of those), and BATCH rows of them in flight at once (CAP registers of words at most)
template <typename E, int N, int CAP = 64> struct VRow {
  static constexpr int BYTES = N * int(sizeof(E)), WORDS = (BYTES + 3) / 4;
  static constexpr bool OK = BYTES == 4 || BYTES == 8 || BYTES == 16 || BYTES == 32;
  static constexpr int BATCH = CAP / WORDS < 32 ? CAP / WORDS : 32;
  uint32_t w[WORDS];
  __device__ static bool aligned(const E* p) { return reinterpret_cast<size_t>(p) % (BYTES < 16 ? BYTES : 16) == 0; }
  __device__ inline void load(const E* p) {
    if constexpr (BYTES == 4) {
      w[0] = *reinterpret_cast<const uint32_t*>(p);
    } else if constexpr (BYTES == 8) {
      const uint2 u = *reinterpret_cast<const uint2*>(p);
      w[0] = u.x, w[1] = u.y;
    } else if constexpr (BYTES == 16 || BYTES == 32) {
#pragma unroll
      for (int h = 0; h < BYTES / 16; ++h) {
        const uint4 u = reinterpret_cast<const uint4*>(p)[h];
        w[4 * h] = u.x, w[4 * h + 1] = u.y, w[4 * h + 2] = u.z, w[4 * h + 3] = u.w;
      }
    } else {
      memcpy(w, p, BYTES);  // never launched (v_pack needs OK): compiles for every head size
    }
  }
  __device__ inline void unpack(float* out) const {  // the N values as floats: what reading them one by one gives
    E e[N];
    memcpy(e, w, BYTES);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = float(e[i]);
  }
};
template <int N, int CAP, typename E> __device__ VRow<E, N, CAP> vrow_of(const E*);  // for decltype: v's element type
// dims d0 .. d0 + 31 of a key as floats (past d: dim 0's, never used) in 16-byte loads: the values one by one gives
template <typename E> __device__ inline void load_key_wide(float* out, const E* row, int d0, int d, int64_t) {
  constexpr int PER = 16 / int(sizeof(E));
#pragma unroll
  for (int v = 0; v < 32 / PER; ++v) {
    E e[PER];
    const uint4 w = *reinterpret_cast<const uint4*>(row + (d0 + v * PER < d ? d0 + v * PER : 0));
    memcpy(e, &w, 16);
#pragma unroll
    for (int j = 0; j < PER; ++j) out[v * PER + j] = float(e[j]);
  }
}
""" + KEY_ONE_BY_ONE

# The value phase, for dims contiguous in a row (VOFF: lane + 32 i, an offset the compiler folds into each load)
# and for any stride (vd[i]): the same values read, so the same bits; two copies so neither branches per value.
VALUE_PHASE = """#pragma unroll
      for (int j0 = 0; j0 < 32; j0 += 8) {  // 8 value rows loaded at once, then added in order
        float vv[8][DPL];
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const int64_t vr = v_head + int64_t(TREE_KEY(base + (j0 + jj < count ? j0 + jj : 0))) * v_strides[2];
#pragma unroll
          for (int i = 0; i < DPL; ++i) vv[jj][i] = lane + 32 * i < DV ? float(v[vr + VOFF]) : 0.0f;
        }
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          const int j = j0 + jj;
#pragma unroll
          for (int r = 0; r < HEADS; ++r) {
            const float pj = lane_shuffle(p[r], j);
            const bool use = on[r] && j < n_keys[r];  // uniform over the warp: a row past a slot's keys adds nothing
#pragma unroll
            for (int i = 0; i < DPL; ++i)
              if (use && lane + 32 * i < DV) acc[r][i] = FMA(pj, vv[jj][i], acc[r][i]);
          }
        }
      }
"""
# CUDA, where a lane's DPL dims of a row are one 4- to 32-byte load (v_pack): the lane takes dims lane DPL + i, not
# lane + 32 i (each dim's sum is the same chain of FMAs over j in order, whichever lane runs it: the same bits), and
# VR::BATCH rows' loads are in flight at once (32 rows at fp16 and 128 dims: one latency, not four batches of eight).
# The first batch is loaded before the keys (PREFETCH): its latency and the keys' overlap.
PREFETCH = """      VR first[VR::BATCH];  // the step's first VR::BATCH value rows (CUDA, v_pack)
      if (v_pack) {
#pragma unroll
        for (int jj = 0; jj < VR::BATCH; ++jj)
          first[jj].load(v + v_head + int64_t(TREE_KEY(base + (jj < count ? jj : 0))) * v_strides[2] + lane * DPL);
      }
"""
PACKED_VALUE_PHASE = """#pragma unroll
      for (int j0 = 0; j0 < 32; j0 += VR::BATCH) {
        VR vw[VR::BATCH];
#pragma unroll
        for (int jj = 0; jj < VR::BATCH; ++jj) {
          if (j0 == 0) vw[jj] = first[jj];
          else vw[jj].load(v + v_head + int64_t(TREE_KEY(base + (j0 + jj < count ? j0 + jj : 0))) * v_strides[2] + lane * DPL);
        }
#pragma unroll
        for (int jj = 0; jj < VR::BATCH; ++jj) {
          const int j = j0 + jj;
          float vv[DPL];
          vw[jj].unpack(vv);
#pragma unroll
          for (int r = 0; r < HEADS; ++r) {
            const float pj = lane_shuffle(p[r], j);
            const bool use = on[r] && j < n_keys[r];
#pragma unroll
            for (int i = 0; i < DPL; ++i)
              if (use) acc[r][i] = FMA(pj, vv[i], acc[r][i]);
          }
        }
      }
"""
VALUES = ("      if (v_dense) {\n" + VALUE_PHASE.replace("VOFF", "lane + 32 * i") + "      } else {\n"
          + VALUE_PHASE.replace("VOFF", "vd[i]") + "      }\n")
# CUDA: packed where it can, else through vd[i] (a dense row that is not packable, D = 80 or 96, reads the same
# values that way: one copy fewer to compile than Metal's two)
CUDA_VALUES = ("      if (v_pack) {\n" + PACKED_VALUE_PHASE + "      } else {\n" + VALUE_PHASE.replace("VOFF", "vd[i]")
               + "      }\n")
CUDA_VPACK = """  using VR = decltype(vrow_of<DPL, PACK == 2 ? 32 : 64>(v));  // a lane's DPL value dims of a row as raw words (CUDA_HEADER)
  const bool v_pack = PACK && VR::OK && v_dense && DV == 32 * DPL && v_strides[2] % DPL == 0 && v_strides[1] % DPL == 0
                      && VR::aligned(v);  // uniform over the launch
#define VD(i) (v_pack ? lane * DPL + (i) : lane + 32 * (i))  // the value dim a lane's slot i holds
"""
METAL_VPACK = """  constexpr bool v_pack = false;  // Metal reads values one by one
#define VD(i) (lane + 32 * (i))  // the value dim a lane's slot i holds
"""
KEY_PHASE = """    // Nothing is guarded: no branch stands between a later load and the start of the block. Dims past D read
    // dim 0 (finite) against a query of 0 there, so each adds +-0 to a dot that is never -0: its bits stay; a slot
    // that is off (or absent: its query is 0) scores keys it never uses. Rows past the keys read row base.
#pragma unroll
    for (int i = 0; i < DPL; ++i) {  // dims 32 i .. 32 i + 31 of the lane's key
      float kv[32];
      LOADER(kv, k + kr, 32 * i, D, k_strides[3]);
#pragma unroll
      for (int u = 0; u < 32; ++u) {  // every dot runs over d = 0, 1, ..., D - 1 in order, in one lane
#pragma unroll
        for (int r = 0; r < HEADS; ++r) dot[r] = FMA(q_sh[r][32 * i + u], kv[u], dot[r]);  // q: a broadcast read
      }
    }
"""
# CUDA reads a key's dims in 16-byte loads where they are contiguous and aligned, else one by one (the same values):
# two copies of the key phase, so no branch inside either keeps a later load from starting early. Metal: one by one.
CUDA_WIDE = "  const bool wide = keys_wide(k, k_strides[1], k_strides[2], k_strides[3], D);  // uniform over the launch\n"
CUDA_KEYS = ("    if (wide) {\n" + KEY_PHASE.replace("LOADER", "load_key_wide") + "    } else {\n"
             + KEY_PHASE.replace("LOADER", "LOAD_KEY_ONE_BY_ONE") + "    }\n")
METAL_KEYS = KEY_PHASE.replace("LOADER", "LOAD_KEY_ONE_BY_ONE")
PARTIAL_CORE = PARTIAL_CORE.replace("@TREE_ROW", str(TREE_ROW))
PARTIALS = {"metal": METAL_PARTIAL_PROLOGUE + PARTIAL_CORE.replace("//@WIDE\n", "").replace("//@KEYS\n", METAL_KEYS)
            .replace("//@VPACK\n", METAL_VPACK).replace("//@PREFETCH\n", "").replace("//@VALUES\n", VALUES),
            "cuda": CUDA_PARTIAL_PROLOGUE + PARTIAL_CORE.replace("//@WIDE\n", CUDA_WIDE).replace("//@KEYS\n", CUDA_KEYS)
            .replace("//@VPACK\n", CUDA_VPACK).replace("//@PREFETCH\n", PREFETCH).replace("//@VALUES\n", CUDA_VALUES)}
# The direct build keeps each chunk's state (at most DIRECT_CHUNKS of them) in threadgroup memory for its last phase
DIRECT_STATE = """  // one block walks every chunk, then combines them (WRITE_DIRECT)
  constexpr int KEPT = @KEPT;  // gpu_attention_source.DIRECT_CHUNKS
  TG_SHARED float kept_acc[KEPT][HEADS][DPL * 32];
  TG_SHARED float kept_max[KEPT][HEADS], kept_sum[KEPT][HEADS];
""".replace("@KEPT", str(DIRECT_CHUNKS))
# The partial's chunk is its grid's z; the direct build walks the chunks (those past every slot's keys are empty: skipped)
CHUNK_OF_GRID = "  {\n    const int c = cz;\n"
CHUNK_WALK = """  int chunks = 0;  // chunks walked
  const int last = NCH < KEPT ? NCH : KEPT;  // the host launches direct builds over <= KEPT chunks
  for (int c = 0; c < last && start + c * CHUNK < rows_max; ++c, ++chunks) {
"""
KEEP = """    // keep the chunk's state for the end, and start the next chunk's from nothing
    for (int e = w * 32 + lane; e < HEADS * DPL * 32; e += WARPS * 32) {
      const int r = e / (DPL * 32), d = e % (DPL * 32);
      kept_acc[c][r][d] = fold_acc[r][d], fold_acc[r][d] = 0.0f;
    }
    if (w == 0 && lane < HEADS) {
      kept_max[c][lane] = fold_max[STEPS][lane], kept_sum[c][lane] = fold_sum[STEPS][lane];
      fold_max[0][lane] = -3.0e38f, fold_sum[0][lane] = 0.0f;
    }
    TG_BARRIER;  // the next chunk's folds, and the last phase's reads, after every thread's copy
"""
BODIES = {  # (backend, kernel) -> body
    **{(b, "partial"): body.replace("//@DIRECT\n", "").replace("//@CHUNKS\n", CHUNK_OF_GRID).replace("//@KEEP\n", "")
       .replace("//@WRITE\n", WRITE_PARTIAL) for b, body in PARTIALS.items()},
    **{(b, "direct"): body.replace("//@DIRECT\n", DIRECT_STATE).replace("//@CHUNKS\n", CHUNK_WALK).replace("//@KEEP\n", KEEP)
       .replace("//@WRITE\n", WRITE_DIRECT) for b, body in PARTIALS.items()},
    ("metal", "combine"): METAL_COMBINE_PROLOGUE + COMBINE_CORE,
    ("cuda", "combine"): CUDA_COMBINE_PROLOGUE + COMBINE_CORE,
}
HEADERS = {"metal": METAL_HEADER, "cuda": CUDA_HEADER}


def partial_template(dtype, chunk: int = CHUNK, heads: int = HEADS, dims_per_lane: int = 8, tree: bool = False,
                     warps: int = WARPS, pack: int = 1) -> list[tuple]:
    """pack: CUDA reads a lane's value dims of a row in one load where it can, up to 64 registers of rows in flight (1)
    or 32 (2: fewer registers a thread, more loads in turn), or one by one (0); the same bits."""
    return [("T", dtype), ("CHUNK", chunk), ("HEADS", heads), ("DPL", dims_per_lane), ("TREE", int(tree)), ("WARPS", warps),
            ("PACK", int(pack))]


def partial_threadgroup(warps: int = WARPS) -> tuple[int, int, int]:
    """The partial kernel's block: `warps` warps (grid y counts warps * blocks; x is one warp's 32 lanes)."""
    return (32, warps, 1)


def tree_heads(heads: int, dpl: int) -> int:
    """A tree pass's build serves one query head a block at 8 dims a lane (head dims over 224): with 4, the
    path's key lookups spilled 108 bytes of registers on sm_90 (benchmarks/cuda_static.py). The bits are the same."""
    return heads if dpl < 8 else 1


def dims_per_lane(d: int, dv: int) -> int:
    """The partial kernel's DPL for these head dims: fewer registers than the 8 that any head <= 256 fits."""
    return (max(d, dv) + 31) // 32


def partial_blocks(h: int, hkv: int, m: int, heads: int = HEADS, by_rows: bool = False) -> int:
    """The partial kernel's blocks per chunk: one per (kv head, row, set of up to `heads` query heads),
    or (by_rows) per (kv head, set of up to `heads` (query head, row) slots)."""
    if by_rows:
        return hkv * ((h // hkv * m + heads - 1) // heads)
    return hkv * m * ((h // hkv + heads - 1) // heads)


def combine_template(dtype, sinks: bool = False) -> list[tuple]:
    return [("T", dtype), ("SINKS", int(sinks))]


def _kernels(dtype, kv_dtype=None) -> dict:
    f32, kv_dtype = mx.float32, kv_dtype or dtype
    partial_dtypes = {"q": dtype, "k": kv_dtype, "v": kv_dtype, "params": f32, "length": mx.int32, "tree": mx.int32}
    return {
        "partial": ((PARTIAL_NAME, PARTIAL_INPUTS, PARTIAL_OUTPUTS, [f32] * 3), partial_dtypes),
        "direct": ((DIRECT_NAME, PARTIAL_INPUTS, DIRECT_OUTPUTS, [dtype]), partial_dtypes),
        "combine": ((COMBINE_NAME, COMBINE_INPUTS, COMBINE_OUTPUTS, [dtype]), dict.fromkeys(COMBINE_INPUTS, f32)),
    }


def program(backend: str, dtype, chunk: int = CHUNK, sinks: bool = False, kv_dtype=None,
            heads: int = HEADS, dpl: int = 8, warps: int = WARPS, pack: int = 1) -> tuple[dict, str]:
    """({'partial', 'partial_tree', 'direct', 'direct_tree', 'combine'}: function names, one program with the five) as
    MLX writes them; *_tree: the builds of draft trees' passes (TREE = 1); direct*: a partial writing the output
    (not with sinks: such launches always combine)."""
    kernels, names, texts = _kernels(dtype, kv_dtype), {}, []
    sizes = {"q": 99, "k": 99, "v": 99, "params": 5, "length": 1, "tree": 99, "pmax": 99, "psum": 99, "pacc": 99,  # small: constant space
             "sinks": 99 if sinks else 1, "o": 99}
    plain = partial_template(dtype, chunk, heads, dpl, warps=warps, pack=pack)
    tree = partial_template(dtype, chunk, tree_heads(heads, dpl), dpl, tree=True, warps=warps, pack=pack)
    direct = [] if sinks else [("direct", "direct", plain), ("direct_tree", "direct", tree)]  # never launched with sinks
    for label, kind, targs in [("partial", "partial", plain), ("partial_tree", "partial", tree), *direct,
                               ("combine", "combine", combine_template(dtype, sinks))]:
        kernel, dtypes = kernels[kind]
        body = BODIES[(backend, kind)]
        if backend == "metal":
            names[label], text = metal_function(kernel, dtypes, sizes, targs, body)
        else:
            names[label], text = cuda_function(kernel, dtypes, targs, body)
        texts.append(text)
    src = HEADERS["metal"] + "".join(texts) if backend == "metal" else cuda_program(HEADERS["cuda"], texts)
    return names, src
