"""A row-invariant qmm on NVIDIA tensor cores (CUDA only): 16 rows cost what one row costs.

    y (M, N) = x (M, K) @ dequant(w).T, M <= 16, x float16 or bfloat16, 4- or 8-bit affine, G in 32/64/128

Why: the FMA kernel (gpu_source.py) spends one FMA per weight per row. Its main loop grows from
~730 instructions (1 row) to ~3,400 (16 rows) per 128 weights a lane (benchmarks/cuda_static.py).
Here one `mma.sync.m16n8k16` multiplies 16 rows by 16 x 8 codes, so a warp's work per weight does
not depend on M. Rows past M read as zeros, and a one-row decoding step runs this same kernel.

Row invariance: an mma output is computed from its own row of A and column of B, so row i should
have the same bits in a 16-row and a 1-row launch whatever the other rows hold. The emulator assumes
this, and the tests hold the kernel to it there. PTX does not document it, so the registry's self-check
tests it on the device (a 4-row call's rows against 1-row calls) before any layer uses the kernel.

Exactness of the weights: B holds the codes q (integers below 256, exact in float16 and bfloat16),
not dequantized weights, so nothing is rounded to 16 bits. Per group, y += s * (x . q) + b * sum(x),
the factored form MLX's qmv uses. sum(x) is a second mma against a B of ones.

Layout (PTX ISA, mma.m16n8k16 .row.col; lane = 4 g + t):
    A (x):  a0 = rows g, k 2t..2t+1;  a1 = row g+8, same k;  a2 = row g, k 2t+8..+9;  a3 = row g+8, those k
    B (q):  b0 = k 2t..2t+1 of column g;  b1 = k 2t+8..+9 of column g
    D:      d0, d1 = row g, columns 2t, 2t+1;  d2, d3 = row g+8, columns 2t, 2t+1
One warp owns 8 output columns. Each group's 16-k steps add into the group's own accumulator, and
the scales are applied after each group, in the same order for every row.

    grid (32, ceil(N / (8 TILES)), 1), threadgroup (32, 2, 1) (gpu.py launches it as the FMA qmm, 16 rows
    at most a launch: the mma's M); template T, S, O, G, BITS, TILES
"""

from __future__ import annotations

import mlx.core as mx

from .gpu_codegen import cuda_function, cuda_program

NAME = "mlxspec_qmm_mma"
INPUTS = ["x", "w", "scales", "biases"]
OUTPUTS = ["y"]
TILES = 2  # 8-column tiles per warp: x's fragments serve each; the bits do not depend on it
X_DTYPES = (mx.float16, mx.bfloat16)
BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)

SETUP = """
  const int lane = int(threadIdx.x);
  const int warp = int(blockIdx.y * blockDim.y + threadIdx.y);
  const int M = x_shape[0], K = x_shape[1], N = w_shape[0];
  constexpr int SPAN = G / 4;                // k values of a group per lane (lane t: [t * SPAN, (t + 1) * SPAN))
  constexpr int XW = SPAN / 2, QW = SPAN * BITS / 32;  // their x (as 16-bit pairs) and code words
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  const int WORDS = K * BITS / 32, GROUPS = K / G;
  const int g = lane / 4, t = lane % 4;      // the mma's groupID and threadID_in_group
  const int n0 = warp * 8 * TILES;
  if (n0 >= N) return;  // uniform over the warp
  const int rows[2] = {g, g + 8};            // the rows of this lane's A and D values
  const uint32_t ones[2] = {pack2<T>(1.0f, 1.0f), pack2<T>(1.0f, 1.0f)};
  float acc[TILES][4];  // per tile: rows g, g, g+8, g+8; columns 2t, 2t+1, 2t, 2t+1
#pragma unroll
  for (int j = 0; j < TILES; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
"""

LOOP = """
  for (int gi = 0; gi < GROUPS; ++gi) {
    const int k0 = gi * G + t * SPAN;
    uint32_t xw[2][XW];  // rows g and g+8: x[k0 .. k0 + SPAN) as pairs; zeros past M
#pragma unroll
    for (int r = 0; r < 2; ++r) LOAD_PAIRS(xw[r], x + size_t(rows[r]) * K + k0, rows[r] < M);
    uint32_t qw[TILES][QW];  // column (tile * 8 + g)'s codes at the same k
#pragma unroll
    for (int j = 0; j < TILES; ++j) {
      const int n = n0 + 8 * j + g < N ? n0 + 8 * j + g : N - 1;  // past N: a duplicate column, never stored
      load_words<QW>(qw[j], w + size_t(n) * WORDS + size_t(k0) * BITS / 32);
    }
    float d[TILES][4], xs[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // this group's x . q per tile, and sum(x)
#pragma unroll
    for (int j = 0; j < TILES; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) d[j][i] = 0.0f;
#pragma unroll
    for (int s = 0; s < G / 16; ++s) {  // step s: this lane's k slots 2t, 2t+1, 2t+8, 2t+9 are k0 + 4s + 0..3
      const uint32_t a[4] = {xw[0][2 * s], xw[1][2 * s], xw[0][2 * s + 1], xw[1][2 * s + 1]};
      mma_16816(xs, a, ones, T());
#pragma unroll
      for (int j = 0; j < TILES; ++j) {
        uint32_t b[2];  // the 4 codes as pairs (q0, q1), (q2, q3)
        if constexpr (BITS == 4) {  // a code ORed into M's mantissa reads M + q: no int-to-float conversions
          const uint32_t v = (qw[j][s / 2] >> (16 * (s % 2))) & 0xFFFFu, v2 = v | (v << 12);
          b[0] = pair_minus_magic((v2 & 0x000F000Fu) | magic16(T()) * 0x10001u, T());  // (M + q) - M: exact
          b[1] = pair_minus_magic(((v2 >> 8) & 0x000F000Fu) | magic16(T()) * 0x10001u, T());
        } else {  // 8 bits: converted (the byte shuffles the trick needs cost as much; cuda_static.py)
          float q[4];
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int bit = (4 * s + c) * BITS;
            q[c] = float((qw[j][bit / 32] >> (bit % 32)) & MASK);
          }
          b[0] = pack2<T>(q[0], q[1]), b[1] = pack2<T>(q[2], q[3]);
        }
        mma_16816(d[j], a, b, T());
      }
    }
#pragma unroll
    for (int j = 0; j < TILES; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {  // y += s * (x . q) + b * sum(x), in this order for every row
        const int n = n0 + 8 * j + 2 * t + c < N ? n0 + 8 * j + 2 * t + c : N - 1;
        const float sc = float(scales[size_t(n) * GROUPS + gi]), bi = float(biases[size_t(n) * GROUPS + gi]);
#pragma unroll
        for (int i = c; i < 4; i += 2) acc[j][i] = FMA(sc, d[j][i], FMA(bi, xs[i], acc[j][i]));
      }
  }
"""

STORE = """
#pragma unroll
  for (int j = 0; j < TILES; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = rows[i / 2], n = n0 + 8 * j + 2 * t + i % 2;
      if (m < M && n < N) y[size_t(m) * N + n] = static_cast<O>(acc[j][i]);
    }
"""

# The loops run in two copies: wide loads of x where the launch's x is 16-byte aligned (always,
# unless x is a view at an odd offset), one value at a time otherwise; the same values, the same bits.
BODY = (SETUP + "  if (reinterpret_cast<size_t>(x) % 16 == 0) {  // uniform over the launch\n"
        + LOOP.replace("LOAD_PAIRS", "load_pairs_wide<XW>") + "  } else {\n"
        + LOOP.replace("LOAD_PAIRS", "load_pairs_one_by_one<XW>") + "  }\n" + STORE)


HEADER = """
#define FMA(a, b, c) fmaf(a, b, c)
// two values as the mma's 16-bit pair (the first in the low half)
template <typename T> __device__ inline uint32_t pack2(float lo, float hi) {
  const T h[2] = {T(lo), T(hi)};
  uint32_t u;
  memcpy(&u, h, 4);
  return u;
}
// NW 16-bit pairs of x from p (2 NW values), zeros for a row past M: in 16-byte loads (p aligned to 16)
template <int NW, typename T> __device__ inline void load_pairs_wide(uint32_t* out, const T* p, bool row) {
#pragma unroll
  for (int i = 0; i < NW / 4; ++i) {
    const uint4 v = row ? reinterpret_cast<const uint4*>(p)[i] : uint4{0u, 0u, 0u, 0u};
    out[4 * i] = v.x, out[4 * i + 1] = v.y, out[4 * i + 2] = v.z, out[4 * i + 3] = v.w;
  }
}
// ... or one value at a time (any alignment)
template <int NW, typename T> __device__ inline void load_pairs_one_by_one(uint32_t* out, const T* p, bool row) {
#pragma unroll
  for (int i = 0; i < NW; ++i) {
    const T h[2] = {row ? p[2 * i] : T(0.0f), row ? p[2 * i + 1] : T(0.0f)};
    memcpy(out + i, h, 4);
  }
}
// NW consecutive code words in the widest loads their count allows (the caller's offset keeps that alignment)
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
// M, the 16-bit number whose last mantissa bits hold a 4-bit code exactly: 1024 (float16), 128 (bfloat16)
constexpr __device__ uint32_t magic16(__half) { return 0x6400u; }
constexpr __device__ uint32_t magic16(__nv_bfloat16) { return 0x4300u; }
#ifndef MLXSPEC_EMULATOR
template <typename T, typename T2> __device__ inline uint32_t minus_magic(uint32_t u) {  // both halves minus M
  const uint32_t m = magic16(T()) * 0x10001u;
  T2 h, mm;
  memcpy(&h, &u, 4);
  memcpy(&mm, &m, 4);
  h = __hsub2(h, mm);
  memcpy(&u, &h, 4);
  return u;
}
__device__ inline uint32_t pair_minus_magic(uint32_t u, __half) { return minus_magic<__half, __half2>(u); }
__device__ inline uint32_t pair_minus_magic(uint32_t u, __nv_bfloat16) {
  return minus_magic<__nv_bfloat16, __nv_bfloat162>(u);
}
#else
template <typename T> inline uint32_t pair_minus_magic(uint32_t u, T) {  // the emulator: through float, exact
  T h[2];
  memcpy(h, &u, 4);
  uint16_t m = uint16_t(magic16(T()));
  T magic;
  memcpy(&magic, &m, 2);
  for (T& v : h) v = T(float(v) - float(magic));
  memcpy(&u, h, 4);
  return u;
}
#endif
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


def supports(x_dtype, group_size: int, bits: int, mode: str = "affine") -> bool:
    return mode == "affine" and x_dtype in X_DTYPES and bits in BITS and group_size in GROUP_SIZES


def template_args(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int, tiles: int = TILES) -> list[tuple]:
    return [("T", x_dtype), ("S", scale_dtype), ("O", out_dtype), ("G", group_size), ("BITS", bits), ("TILES", tiles)]


def cuda_source(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int, tiles=TILES) -> tuple[list[str], str]:
    """(function names, full CUDA program) as mx.fast.cuda_kernel would generate it, one function per
    tile count in `tiles` (an int or several)."""
    dtypes = {"x": x_dtype, "w": mx.uint32, "scales": scale_dtype, "biases": scale_dtype}
    kernel = (NAME, INPUTS, OUTPUTS, [out_dtype])
    names, texts = [], []
    for n in [tiles] if isinstance(tiles, int) else tiles:
        name, text = cuda_function(kernel, dtypes, template_args(x_dtype, scale_dtype, out_dtype, group_size, bits, n), BODY)
        names, texts = names + [name], texts + [text]
    return names, cuda_program(HEADER, texts)
