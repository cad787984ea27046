"""A row-invariant qmm on NVIDIA tensor cores (CUDA only): 8 rows cost what one row costs.

    y (M, N) = x (M, K) @ dequant(w).T, any M, x float16 or bfloat16, 2-6 or 8-bit affine, G in 32/64/128

Why: the FMA kernel (gpu_source.py) spends one FMA per weight per row; its main loop grows from
~730 instructions (1 row) to ~3,400 (16 rows) per 128 weights a lane (benchmarks/cuda_static.py).
Here one `mma.sync.m16n8k16` multiplies 16 columns of codes by 8 rows of x, so a warp's work per
weight does not depend on M up to 8 rows, and rows past M read as zeros: a one-row decoding step
runs this same kernel. A warp serves RT row tiles of 8 with each code it converts, and the grid's z
covers the rest, so a prompt chunk of any length is one launch.

Row invariance: an mma output is computed from its own row of A and column of B, so x's row i gets
the same bits in a 1-row and a 64-row launch whatever the other rows hold. The emulator assumes this
and the tests hold the kernel to it there; PTX does not document it, so the registry's self-check
tests it on the device before any layer uses the kernel.

Exactness of the weights: A holds the codes q (integers below 256, exact in float16 and bfloat16),
not dequantized weights, so nothing is rounded to 16 bits. Per group, y += s * (q . x) + b * sum(x),
the factored form MLX's qmv uses; sum(x) is a second mma with an A of ones.

Latency: a decoding step reads each weight once, so the bytes in flight decide the speed (an H100
wants ~3 MB: 3.35 TB/s x ~0.8 us). A threadgroup's KSPLIT warps share its 16 TILES columns and
take every KSPLIT-th group of K each, with the next group's codes loaded before this one is
multiplied; their partial sums are added in shared memory in warp order 0, 1, 2, 3. That order
depends on K only, never on M, so the rows stay invariant.

Layout (PTX ISA, mma.m16n8k16 .row.col; lane = 4 g + t): A is the codes, B is x, D is y transposed.
    A (q):  a0 = column g, k slots 2t..2t+1;  a1 = column g+8, same k;  a2 = column g, slots 2t+8..+9;  a3 = g+8
    B (x):  b0 = slots 2t..2t+1 of x's row g;  b1 = slots 2t+8..+9 of row g
    D:      d0, d1 = column g, rows 2t, 2t+1;  d2, d3 = column g+8, rows 2t, 2t+1
Lane t covers k0 .. k0 + G/4 of each group (k0 = group * G + t * G / 4), one code word (8 codes at
4 bits, 4 at 8) after another. The k slots are labels: a word's codes are paired as one mask of the
word lays them out, (q0, q4), (q1, q5) / (q2, q6), (q3, q7) at 4 bits (two mma steps), (q0, q1) /
(q2, q3) at 8, and x's values are paired the same way from one 16- or 8-byte load. So a code pair is
a LOP3 and one exact HADD2 or HFMA2 into a's registers (see `codes`), and x's a byte permute.

    grid (32, ceil(N / (16 TILES)) * KSPLIT, ceil(M / (8 RT))), threadgroup (32, KSPLIT, 1)
    template T, S, O, G, BITS, TILES, RT, KSPLIT
"""

from __future__ import annotations

import mlx.core as mx

from .gpu_codegen import cuda_function, cuda_program

NAME = "mlxspec_qmm_mma"
INPUTS = ["x", "w", "scales", "biases"]
OUTPUTS = ["y"]
TILES = 1  # 16-column tiles per threadgroup: x's loads serve each; the bits do not depend on it
# From this many rows on, 2 column tiles: x's loads then serve twice the columns. On an H200 (2026-11-27,
# bench_gpu ops, us at 1 / 8 / 16 / 64 rows) the 4-bit 128256 x 4096 head took 163 / 177 / 242 / 713 with
# 1 tile, 177 / 184 / 209 / 548 with 2; 4096 x 14336 47 / 44 / 43 / 105 and 47 / 43 / 38 / 89.
WIDE_FROM = 9
KSPLIT = 4  # warps of a threadgroup, each taking every KSPLIT-th group of K: it orders the sums, so a
# layer shape keeps one value for every row count (timing.prefer_tensor_cores times 2 and 8 beside it)
ROW_TILES = (1, 2, 4, 8)  # 8-row tiles a warp computes with each code it converts
X_DTYPES = (mx.float16, mx.bfloat16)
BITS = (2, 3, 4, 5, 6, 8)  # 4 and 8: whole codes a word; the others: a bit stream (STREAM_SETUP)
GROUP_SIZES = (32, 64, 128)

COMMON = """
  const int lane = int(threadIdx.x), part = int(threadIdx.y);  // part: this warp's share of K
  const int M = x_shape[0], K = x_shape[1], N = w_shape[0];
  const int WORDS = K * BITS / 32, GROUPS = K / G;
  const int g = lane / 4, t = lane % 4;        // the mma's groupID and threadID_in_group
  const int n0 = int(blockIdx.y) * 16 * TILES, m0 = int(blockIdx.z) * 8 * RT;
  int cols[TILES][2];  // this lane's A columns g and g + 8 of each tile (past N: N - 1, never stored)
#pragma unroll
  for (int j = 0; j < TILES; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) cols[j][h] = n0 + 16 * j + 8 * h + g < N ? n0 + 16 * j + 8 * h + g : N - 1;
  const uint32_t one2 = pack2<T>(1.0f, 1.0f), ones[4] = {one2, one2, one2, one2};
  float acc[RT][TILES][4];  // per row tile and column tile: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < TILES; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][j][i] = 0.0f;
"""

# 4 and 8 bits: lane t takes k0 .. k0 + G/4 of each group, whole code words (the layout above)
WORD_SETUP = """
  constexpr int SPAN = G / 4, PER = 32 / BITS;  // k values of a group per lane t; codes a word
  constexpr int QW = SPAN / PER;               // their code words per column
  const uint32_t masks[2] = {0x000F000Fu, 0x00F000F0u};  // the nibbles `codes` keeps
  uint32_t qw[TILES][2][QW];  // a group's codes for this lane's columns and k, loaded a group ahead
  float sb[TILES][2][2];      // their scales and biases
  auto load_group = [&](int gi, uint32_t (&q)[TILES][2][QW], float (&c)[TILES][2][2]) {
#pragma unroll
    for (int j = 0; j < TILES; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const size_t n = size_t(cols[j][h]);
        load_words<QW>(q[j][h], w + n * WORDS + size_t(gi * G + t * SPAN) * BITS / 32);
        c[j][h][0] = float(scales[n * GROUPS + gi]), c[j][h][1] = float(biases[n * GROUPS + gi]);
      }
  };
  if (part < GROUPS) load_group(part, qw, sb);
"""

LOOP = """
  for (int gi = part; gi < GROUPS; gi += KSPLIT) {
    uint32_t qn[TILES][2][QW];
    float sn[TILES][2][2];
    if (gi + KSPLIT < GROUPS) load_group(gi + KSPLIT, qn, sn);  // in flight while this group multiplies
    const int k0 = gi * G + t * SPAN;
    float d[RT][TILES][4], xs[RT][4];  // this group's q . x per tile, and sum(x)
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        xs[r][i] = 0.0f;
#pragma unroll
        for (int j = 0; j < TILES; ++j) d[r][j][i] = 0.0f;
      }
#pragma unroll
    for (int wi = 0; wi < QW; ++wi) {  // one code word a column: PER values of k
      uint32_t xr[RT][PER / 2];  // x's rows at the same k, zeros past M
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        const int m = m0 + 8 * r + g;
        LOAD_X<PER>(xr[r], x + size_t(m < M ? m : 0) * K + k0 + PER * wi, m < M);
      }
#pragma unroll
      for (int half = 0; half < PER / 4; ++half) {  // one mma step per 4 values
        uint32_t a[TILES][4];  // columns g, g+8: a0 / a1 and a2 / a3 hold the code pairs `codes` makes
#pragma unroll
        for (int j = 0; j < TILES; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) codes<BITS>(qw[j][h][wi], half, masks, a[j][h], a[j][2 + h], T());
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          uint32_t b[2];  // x's values paired as the codes are
          x_pairs<PER>(xr[r], half, b);
          mma_16816(xs[r], ones, b, T());
#pragma unroll
          for (int j = 0; j < TILES; ++j) mma_16816(d[r][j], a[j], b, T());
        }
      }
    }
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int j = 0; j < TILES; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // y += s * (q . x) + b * sum(x), in this order for every row
          const float* c = sb[j][i / 2];
          acc[r][j][i] = FMA(c[0], d[r][j][i], FMA(c[1], xs[r][i], acc[r][j][i]));
        }
#pragma unroll
    for (int j = 0; j < TILES; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int q = 0; q < QW; ++q) qw[j][h][q] = qn[j][h][q];
        sb[j][h][0] = sn[j][h][0], sb[j][h][1] = sn[j][h][1];
      }
  }
"""

# 2, 3, 5 and 6 bits: MLX packs 32 codes as BITS words of a little-endian bit stream, so codes
# straddle words. Lane t takes codes 8t .. 8t + 7 of each 32-code block (one or two words, shifted),
# x's 8 values at the same k in one load, pairs in natural order: A's slots (2t, 2t+1) of mma step s
# hold codes (4s, 4s+1), slots (2t+8, 2t+9) codes (4s+2, 4s+3), and B the same values of x.
STREAM_SETUP = """
  constexpr int BLOCKS = G / 32;  // 32-code blocks a group
  const int bit0 = 8 * t * BITS, word0 = bit0 / 32, shift = bit0 % 32;
  const bool two = (bit0 + 8 * BITS - 1) / 32 > word0;  // this lane's codes straddle two words
  uint32_t qw[TILES][2][BLOCKS][2];  // per column and block: the word(s) holding this lane's 8 codes
  float sb[TILES][2][2];
  auto load_group = [&](int gi, uint32_t (&q)[TILES][2][BLOCKS][2], float (&c)[TILES][2][2]) {
#pragma unroll
    for (int j = 0; j < TILES; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const size_t n = size_t(cols[j][h]);
        const uint32_t* p = w + n * WORDS + size_t(gi) * BLOCKS * BITS + word0;
#pragma unroll
        for (int bl = 0; bl < BLOCKS; ++bl) q[j][h][bl][0] = p[bl * BITS], q[j][h][bl][1] = two ? p[bl * BITS + 1] : 0u;
        c[j][h][0] = float(scales[n * GROUPS + gi]), c[j][h][1] = float(biases[n * GROUPS + gi]);
      }
  };
  if (part < GROUPS) load_group(part, qw, sb);
"""

STREAM_LOOP = """
  for (int gi = part; gi < GROUPS; gi += KSPLIT) {
    uint32_t qn[TILES][2][BLOCKS][2];
    float sn[TILES][2][2];
    if (gi + KSPLIT < GROUPS) load_group(gi + KSPLIT, qn, sn);  // in flight while this group multiplies
    float d[RT][TILES][4], xs[RT][4];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        xs[r][i] = 0.0f;
#pragma unroll
        for (int j = 0; j < TILES; ++j) d[r][j][i] = 0.0f;
      }
#pragma unroll
    for (int bl = 0; bl < BLOCKS; ++bl) {
      const int k0 = gi * G + 32 * bl + 8 * t;
      uint32_t xr[RT][4];  // x's 8 values at this lane's k, zeros past M
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        const int m = m0 + 8 * r + g;
        LOAD_X<8>(xr[r], x + size_t(m < M ? m : 0) * K + k0, m < M);
      }
      uint32_t a[TILES][2][4];  // per column tile and mma step: A's four registers
#pragma unroll
      for (int j = 0; j < TILES; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t pairs[4];  // codes (0, 1), (2, 3), (4, 5), (6, 7) as 16-bit pairs
          stream_pairs<BITS>(((uint64_t(qw[j][h][bl][1]) << 32) | qw[j][h][bl][0]) >> shift, pairs, T());
#pragma unroll
          for (int st = 0; st < 2; ++st) a[j][st][h] = pairs[2 * st], a[j][st][2 + h] = pairs[2 * st + 1];
        }
#pragma unroll
      for (int st = 0; st < 2; ++st)
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          const uint32_t b[2] = {xr[r][2 * st], xr[r][2 * st + 1]};
          mma_16816(xs[r], ones, b, T());
#pragma unroll
          for (int j = 0; j < TILES; ++j) mma_16816(d[r][j], a[j][st], b, T());
        }
    }
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int j = 0; j < TILES; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // y += s * (q . x) + b * sum(x), as the word path
          const float* c = sb[j][i / 2];
          acc[r][j][i] = FMA(c[0], d[r][j][i], FMA(c[1], xs[r][i], acc[r][j][i]));
        }
#pragma unroll
    for (int j = 0; j < TILES; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int bl = 0; bl < BLOCKS; ++bl) qw[j][h][bl][0] = qn[j][h][bl][0], qw[j][h][bl][1] = qn[j][h][bl][1];
        sb[j][h][0] = sn[j][h][0], sb[j][h][1] = sn[j][h][1];
      }
  }
"""

STORE = """
  __shared__ float partial[KSPLIT][RT * TILES * 4][32];  // each warp's sums over its groups
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < TILES; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[part][(r * TILES + j) * 4 + i][lane] = acc[r][j][i];
  __syncthreads();
  for (int e = part; e < RT * TILES * 4; e += KSPLIT) {  // warp `part` finishes every KSPLIT-th value
    float sum = partial[0][e][lane];
#pragma unroll
    for (int p = 1; p < KSPLIT; ++p) sum += partial[p][e][lane];  // warp order: fixed by K alone
    const int r = e / (4 * TILES), j = (e / 4) % TILES, i = e % 4;
    const int m = m0 + 8 * r + 2 * t + i % 2, n = n0 + 16 * j + 8 * (i / 2) + g;
    if (m < M && n < N) y[size_t(m) * N + n] = static_cast<O>(sum);
  }
"""

# The loops run in two copies: 16- or 8-byte loads of x where the launch's x is 16-byte aligned (always,
# unless x is a view at an offset), one value at a time otherwise; the same values, the same bits.


def _two_copies(setup: str, loop: str) -> str:
    return (setup + "  if (reinterpret_cast<size_t>(x) % 16 == 0) {  // uniform over the launch\n"
            + loop.replace("LOAD_X", "load_x_wide") + "  } else {\n"
            + loop.replace("LOAD_X", "load_x_one_by_one") + "  }\n")


BODY = (COMMON + "  if constexpr (BITS == 4 || BITS == 8) {\n" + _two_copies(WORD_SETUP, LOOP)
        + "  } else {\n" + _two_copies(STREAM_SETUP, STREAM_LOOP) + "  }\n" + STORE)


# The pair packing and the mma itself (the emulator has its own mma_16816): shared with the tensor-core attention
MMA_OPS = """
// two values as the mma's 16-bit pair (the first in the low half)
template <typename T> __device__ inline uint32_t pack2(float lo, float hi) {
  const T h[2] = {T(lo), T(hi)};
  uint32_t u;
  memcpy(&u, h, 4);
  return u;
}
// NW consecutive 32-bit words in the widest loads their count allows (the caller's offset keeps that alignment)
template <int NW> __device__ inline void load_words(uint32_t* out, const uint32_t* p) {
  if constexpr (NW % 4 == 0) {
#pragma unroll
    for (int i = 0; i < NW / 4; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      out[4 * i] = v.x, out[4 * i + 1] = v.y, out[4 * i + 2] = v.z, out[4 * i + 3] = v.w;
    }
  } else if constexpr (NW % 2 == 0) {
#pragma unroll
    for (int i = 0; i < NW / 2; ++i) {
      const uint2 v = reinterpret_cast<const uint2*>(p)[i];
      out[2 * i] = v.x, out[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < NW; ++i) out[i] = p[i];
  }
}
#ifndef MLXSPEC_EMULATOR
// d += A (16 x 16, 4 registers a lane) * B (16 x 8, 2 registers), float32 accumulators (4 a lane)
__device__ inline void mma_16816(float* d, const uint32_t* a, const uint32_t* b, __half) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ inline void mma_16816(float* d, const uint32_t* a, const uint32_t* b, __nv_bfloat16) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif
"""
HEADER = """
#define FMA(a, b, c) fmaf(a, b, c)
""" + MMA_OPS + """// x[p .. p + PER) as 16-bit pairs, zeros for a row past M: one 16- or 8-byte load (p aligned to it) ...
template <int PER, typename T> __device__ inline void load_x_wide(uint32_t* xr, const T* p, bool row) {
  if constexpr (PER == 8) {
    const uint4 v = row ? *reinterpret_cast<const uint4*>(p) : uint4{0u, 0u, 0u, 0u};
    xr[0] = v.x, xr[1] = v.y, xr[2] = v.z, xr[3] = v.w;
  } else {
    const uint2 v = row ? *reinterpret_cast<const uint2*>(p) : uint2{0u, 0u};
    xr[0] = v.x, xr[1] = v.y;
  }
}
// ... or one value at a time (any alignment)
template <int PER, typename T> __device__ inline void load_x_one_by_one(uint32_t* xr, const T* p, bool row) {
  T h[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) h[i] = row ? p[i] : T(0.0f);
  memcpy(xr, h, 2 * PER);
}
// B's pairs for mma step `half` of a word, paired as `codes` pairs the codes: 8 values (x0, x4),
// (x1, x5), then (x2, x6), (x3, x7); 4 values (x0, x1), (x2, x3)
template <int PER> __device__ inline void x_pairs(const uint32_t* xr, int half, uint32_t* b) {
  if constexpr (PER == 8) {
    b[0] = __byte_perm(xr[half], xr[half + 2], 0x5410);
    b[1] = __byte_perm(xr[half], xr[half + 2], 0x7632);
  } else {
    b[0] = xr[0], b[1] = xr[1];
  }
}
// M, the 16-bit number whose last mantissa bits hold a 4-bit code exactly: 1024 (float16), 128 (bfloat16)
constexpr __device__ uint32_t magic16(__half) { return 0x6400u; }
constexpr __device__ uint32_t magic16(__nv_bfloat16) { return 0x4300u; }
#ifndef MLXSPEC_EMULATOR
// both halves of u: h - M (`sixteenth` false) or h / 16 - M / 16 (true), each exact for the values here
template <typename T, typename T2> __device__ inline uint32_t minus_magic(uint32_t u, bool sixteenth) {
  const uint32_t m = magic16(T()) * 0x10001u;
  T2 h, mm;
  memcpy(&h, &u, 4);
  memcpy(&mm, &m, 4);
  const float mf = magic16(T()) == 0x6400u ? 1024.0f : 128.0f;
  const T2 scale = {T(0.0625f), T(0.0625f)}, shift = {T(-mf / 16.0f), T(-mf / 16.0f)};
  h = sixteenth ? __hfma2(h, scale, shift) : __hsub2(h, mm);
  memcpy(&u, &h, 4);
  return u;
}
__device__ inline uint32_t pair_minus_magic(uint32_t u, __half, bool sixteenth = false) {
  return minus_magic<__half, __half2>(u, sixteenth);
}
__device__ inline uint32_t pair_minus_magic(uint32_t u, __nv_bfloat16, bool sixteenth = false) {
  return minus_magic<__nv_bfloat16, __nv_bfloat162>(u, sixteenth);
}
#else
template <typename T> inline uint32_t pair_minus_magic(uint32_t u, T, bool sixteenth = false) {  // the emulator: through float, exact
  T h[2];
  memcpy(h, &u, 4);
  uint16_t m = uint16_t(magic16(T()));
  T magic;
  memcpy(&magic, &m, 2);
  for (T& v : h) v = sixteenth ? T(float(v) / 16.0f - float(magic) / 16.0f) : T(float(v) - float(magic));
  memcpy(&u, h, 4);
  return u;
}
#endif
// The mma's A pairs from one code word, exact (codes below 256 are exact 16-bit floats). 4 bits, step
// `half`: lo = (q[2 half], q[2 half + 4]), hi = (q[2 half + 1], q[2 half + 5]): the nibbles one mask
// keeps, ORed into M's mantissa, read M + q and M + 16 q (float16, M = 1024: both exact), then one
// HSUB2 or HFMA2 (bfloat16, M = 128, has no mantissa bits for 16 q: its high nibbles are shifted down). 8 bits: lo = (q0, q1), hi = (q2, q3): float16 bytes into
// 1024's mantissa by one byte permute; bfloat16 (128 + q is not exact past 128) converted.
template <int BITS> __device__ inline void codes(uint32_t word, int half, const uint32_t* masks, uint32_t& lo,
                                                 uint32_t& hi, __half) {
  const uint32_t m2 = magic16(__half()) * 0x10001u;
  if constexpr (BITS == 4) {
    const uint32_t v = half ? word >> 8 : word;
    lo = pair_minus_magic((v & masks[0]) | m2, __half());
    hi = pair_minus_magic((v & masks[1]) | m2, __half(), true);
  } else {
    lo = pair_minus_magic(__byte_perm(word, m2, 0x7170), __half());  // bytes q0, 0x64, q1, 0x64
    hi = pair_minus_magic(__byte_perm(word, m2, 0x7372), __half());
  }
}
template <int BITS> __device__ inline void codes(uint32_t word, int half, const uint32_t* masks, uint32_t& lo,
                                                 uint32_t& hi, __nv_bfloat16) {
  if constexpr (BITS == 4) {
    const uint32_t m2 = magic16(__nv_bfloat16()) * 0x10001u, v = half ? word >> 8 : word;
    lo = pair_minus_magic((v & masks[0]) | m2, __nv_bfloat16());
    hi = pair_minus_magic(((v >> 4) & masks[0]) | m2, __nv_bfloat16());  // 7 mantissa bits: no room for 16 q
  } else {
    lo = pack2<__nv_bfloat16>(float(word & 0xFFu), float((word >> 8) & 0xFFu));
    hi = pack2<__nv_bfloat16>(float((word >> 16) & 0xFFu), float(word >> 24));
  }
}
// 8 codes of BITS (2, 3, 5, 6) bits from the low bits of v as 4 pairs of 16-bit floats, exact: each code
// ORed into M's mantissa (codes below 128 fit bfloat16's 7 bits, float16's 10) and M taken off
template <int BITS, typename T> __device__ inline void stream_pairs(uint64_t v, uint32_t* pairs, T) {
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  const uint32_t m2 = magic16(T()) * 0x10001u;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = uint32_t(v >> (2 * i * BITS)) & MASK, hi = uint32_t(v >> ((2 * i + 1) * BITS)) & MASK;
    pairs[i] = pair_minus_magic(lo | (hi << 16) | m2, T());
  }
}
"""


def supports(x_dtype, group_size: int, bits: int, mode: str = "affine") -> bool:
    return mode == "affine" and x_dtype in X_DTYPES and bits in BITS and group_size in GROUP_SIZES


def row_tiles(rows: int) -> int:
    """8-row tiles per warp for a launch of `rows`: the fewest that hold them, at most 8 (64 rows;
    the grid's z covers the rest). The bits do not depend on it."""
    return next((r for r in ROW_TILES if 8 * r >= rows), ROW_TILES[-1])


def tiles_for(rows: int) -> int:
    """The column tiles a launch of `rows` rows uses by default (the bits are the same with either)."""
    return TILES if rows < WIDE_FROM else 2


SHARED_LIMIT = 48 * 1024  # bytes of static shared memory a kernel may declare: ptxas refuses more


def partial_bytes(tiles: int, rows: int, ksplit: int) -> int:
    """The `partial` array's bytes: KSPLIT x (RT * TILES * 4) x 32 floats."""
    return ksplit * row_tiles(rows) * tiles * 4 * 32 * 4


def fit_tiles(tiles: int, rows: int, ksplit: int) -> int:
    """`tiles`, or 1 where its partial sums would not fit in shared memory (8 warps on K, 2 tiles and 33+ rows:
    64 KB, which NVRTC refused for sm_90 on an H200; the bits do not depend on the tiles)."""
    return tiles if partial_bytes(tiles, rows, ksplit) <= SHARED_LIMIT else 1


def template_args(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int, tiles: int = TILES,
                  rows: int = 1, ksplit: int = KSPLIT) -> list[tuple]:
    return [("T", x_dtype), ("S", scale_dtype), ("O", out_dtype), ("G", group_size), ("BITS", bits),
            ("TILES", fit_tiles(tiles, rows, ksplit)), ("RT", row_tiles(rows)), ("KSPLIT", ksplit)]


def launch(rows: int, n: int, tiles: int = TILES, ksplit: int = KSPLIT) -> dict:
    """grid and threadgroup of a launch over `rows` rows of x and `n` output columns."""
    per_block, tiles = 8 * row_tiles(rows), fit_tiles(tiles, rows, ksplit)
    return {"grid": (32, (n + 16 * tiles - 1) // (16 * tiles) * ksplit, max(1, (rows + per_block - 1) // per_block)),
            "threadgroup": (32, ksplit, 1)}


def cuda_source(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int, builds=((TILES, 1),)) -> tuple[list[str], str]:
    """(function names, full CUDA program) as mx.fast.cuda_kernel would generate it, one function per
    (column tiles, row tiles[, K split]) in `builds`."""
    dtypes = {"x": x_dtype, "w": mx.uint32, "scales": scale_dtype, "biases": scale_dtype}
    kernel = (NAME, INPUTS, OUTPUTS, [out_dtype])
    names, texts = [], []
    for tiles, rt, *ksplit in builds:
        targs = template_args(x_dtype, scale_dtype, out_dtype, group_size, bits, tiles, 8 * rt, *ksplit)
        name, text = cuda_function(kernel, dtypes, targs, BODY)
        names, texts = names + [name], texts + [text]
    return names, cuda_program(HEADER, texts)
