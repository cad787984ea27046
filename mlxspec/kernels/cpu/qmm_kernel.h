// Multi-row affine quantized matmul on the CPU: y (M, N) = x (M, K) @ dequant(w).T
//
// MLX layout: w (N, K*bits/32) uint32 little-endian, element j of a word at bits [bits*j, bits*j+bits);
// scales, biases (N, K/G); dequant(w)[n, k] = scales[n, k/G] * q[n, k] + biases[n, k/G].
//
// Each 32-weight block of a row of w is unpacked and dequantized once per chunk of up to 8 rows of
// x and multiplied into all of them from registers; a 48-column block's weights stay in cache across
// chunks, so memory sees each weight once per call whatever M.
//
// Exactness rule: the arithmetic for one output (m, n) is the same sequence of fp32 FMAs over K and
// the same final lane reduction, whatever M, the row chunk or the thread; so a verify pass of k+1
// rows gives bit-identical rows to k+1 one-row calls.
//
// x is first converted to fp32 and, for 4 bits, permuted inside each 32-block to "even elements,
// then odd elements": that is the order in which one 16-byte load unpacks to low/high nibbles.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace mlxspec {

constexpr int kBlock = 32;   // weights per unpack step (one 16-byte load at 4 bits)
constexpr int kMaxRows = 8;  // rows of x per register tile (more rows: more chunks)

struct Q8Rows;  // qmm_q8_kernel.h: x quantized to int8 blocks

// One problem; x is already fp32 (and permuted for 4 bits), rows of length K; or, with q8 set,
// x quantized for the int8-activation kernel (qmm_q8_kernel.h) and x unused.
struct QmmProblem {
  const float* x;      // (M, K)
  const uint8_t* w;    // (N, K*bits/8) bytes
  const void* scales;  // (N, K/G)
  const void* biases;  // (N, K/G)
  SType stype;
  int M, N, K, G, bits;
  const Q8Rows* q8 = nullptr;
  bool e2m1 = false;  // 4-bit codes are mxfp4's e2m1 values, read through kE2m1 (the int8 path only)
  int pack = 1;       // > 1: w's codes in groups of `pack` columns, chunk by chunk (ColumnCodes; the int8 path only)
  float bias_of_scale = 0.f;  // != 0: every bias is this times its scale (GGUF Q4_0: -8), not read (the int8 path only)
};

// Columns per tile for a row tile of MR rows: MR*NB accumulators stay in registers, each x vector
// load feeds NB FMAs and each dequantized weight vector MR FMAs. With the next tile prefetched, 4
// columns at one row measured best here (AMD EPYC, AVX-512: 8 columns were 0-19% slower); 5-8 rows
// fill 24 registers with 3. AVX2 has 16 registers of half the width: 4, 3, 2, 2 columns for 1-4
// rows, then 1 (AMD EPYC Zen 3; fewer columns at one row lose to the FMA latency chain).
template <class I, int MR, int BITS>
constexpr int cols_for_rows() {
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<I, Avx2Isa>) return MR == 1 ? 4 : (MR == 2 ? 3 : (MR <= 4 ? 2 : 1));
#endif
  return MR == 1 ? 4 : (MR <= 4 ? 4 : 3);
}

constexpr int kGroupChunk = 32;  // groups whose scales/biases a tile converts to fp32 at a time (on the stack)

// The weight rows of the NB columns a tile reads, and the problem's group counts.
template <int BITS, int NB, int GB>
struct TileRows {
  size_t row_bytes;
  int groups, gb;  // groups per row; 32-weight blocks per group
  const uint8_t* w[NB];
  TileRows(const QmmProblem& p, int n0)
      : row_bytes(size_t(p.K) * BITS / 8), groups(p.K / p.G), gb(GB ? GB : p.G / kBlock) {
    for (int j = 0; j < NB; ++j) w[j] = p.w + size_t(n0 + j) * row_bytes;
  }
};

// Scales and biases of groups [g0, g0 + gn) of NB columns from n0, as fp32: sb[j] and sb[NB + j]
// point into the problem's own arrays when they are fp32 (no copy: a tied head's f32 scales cost
// a memcpy per column otherwise), else into `buf`, converted.
template <int NB>
#if defined(__GNUC__) || defined(__clang__)
__attribute__((always_inline))
#endif
inline void group_params(const QmmProblem& p, int n0, int groups, int g0, int gn, float (*buf)[kGroupChunk],
                  const float** sb) {
  for (int j = 0; j < NB; ++j) {
    const size_t i = size_t(n0 + j) * groups + g0;
    if (p.stype == SType::f32) {
      sb[j] = static_cast<const float*>(p.scales) + i;
      sb[NB + j] = static_cast<const float*>(p.biases) + i;
    } else {
      load_floats(p.scales, i, gn, p.stype, buf[j]);
      load_floats(p.biases, i, gn, p.stype, buf[NB + j]);
      sb[j] = buf[j], sb[NB + j] = buf[NB + j];
    }
  }
}

// out[m][j] (fp32, m < MR, j < NB) = sum_k x[m, k] * dequant(w)[n0 + j, k]
// GB = 32-weight blocks per group when known at compile time (1, 2, 4: group sizes 32, 64, 128), else 0.
// The FMA sequence of one (m, j) does not depend on MR, NB or GB: that is the exactness rule.
template <class I, int BITS, int MR, int NB, int GB>
void tile(const QmmProblem& p, const float* x, int n0, float* out) {
  using V = typename I::V;
  const TileRows<BITS, NB, GB> t(p, n0);
  const size_t row_bytes = t.row_bytes;
  const int groups = t.groups, gb = t.gb;
  const uint8_t* const* w = t.w;
  alignas(64) float buf[2 * NB][kGroupChunk];
  const float* sb[2 * NB];  // scales of the NB columns, then their biases
  V acc[MR][NB];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = I::zero();
  for (int g0 = 0; g0 < groups; g0 += kGroupChunk) {
    const int gn = groups - g0 < kGroupChunk ? groups - g0 : kGroupChunk;
    group_params<NB>(p, n0, groups, g0, gn, buf, sb);
    for (int g = 0; g < gn; ++g) {
      typename I::Dq dq[NB];
      for (int j = 0; j < NB; ++j) dq[j] = I::template dequantizer<BITS>(sb[j][g], sb[NB + j][g]);
      for (int blk = 0; blk < gb; ++blk) {
        const int k = ((g0 + g) * gb + blk) * kBlock;
        V w0[NB], w1[NB];
        if ((k * BITS / 8) % 64 == 0)  // the next tile's rows, one cache line at a time: loads stall here otherwise
          for (int j = 0; j < NB; ++j) prefetch(w[j] + NB * row_bytes + size_t(k) * BITS / 8);
        for (int j = 0; j < NB; ++j) I::template dequant32<BITS>(dq[j], w[j] + size_t(k) * BITS / 8, w0[j], w1[j]);
        for (int m = 0; m < MR; ++m) {
          V x0 = I::load_reg(x + size_t(m) * p.K + k), x1 = I::load_reg(x + size_t(m) * p.K + k + I::L);
          for (int j = 0; j < NB; ++j) {
            acc[m][j] = I::fma(x0, w0[j], acc[m][j]);
            acc[m][j] = I::fma(x1, w1[j], acc[m][j]);
          }
        }
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NB; ++j) out[m * NB + j] = I::reduce(acc[m][j]);
}

#if defined(__AVX2__) && defined(__FMA__)
// tile() for AVX2, whose 16-lane vector is two registers: each half's accumulators are arrays of
// __m256 of their own, so they stay in registers (GCC kept tile()'s array of two-register structs
// on the stack, a store and a reload per block: 15-20% slower at one to four rows on Zen 3).
// Per output, the same FMAs in the same order as tile(): bit-identical results.
template <int BITS, int MR, int NB, int GB>
void tile_avx2(const QmmProblem& p, const float* x, int n0, float* out) {
  using I = Avx2Isa;
  const TileRows<BITS, NB, GB> t(p, n0);
  const size_t row_bytes = t.row_bytes;
  const int groups = t.groups, gb = t.gb;
  const uint8_t* const* w = t.w;
  alignas(64) float buf[2 * NB][kGroupChunk];
  const float* sb[2 * NB];  // scales of the NB columns, then their biases
  __m256 acc[2][MR][NB];                       // [half][row][column]
  for (int h = 0; h < 2; ++h)
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < NB; ++j) acc[h][m][j] = _mm256_setzero_ps();
  for (int g0 = 0; g0 < groups; g0 += kGroupChunk) {
    const int gn = groups - g0 < kGroupChunk ? groups - g0 : kGroupChunk;
    group_params<NB>(p, n0, groups, g0, gn, buf, sb);
    for (int g = 0; g < gn; ++g)
      for (int blk = 0; blk < gb; ++blk) {
        const int k = ((g0 + g) * gb + blk) * kBlock;
        if ((k * BITS / 8) % 64 == 0)
          for (int j = 0; j < NB; ++j) prefetch(w[j] + NB * row_bytes + size_t(k) * BITS / 8);
        for (int j = 0; j < NB; ++j) {
          const I::Dq dq = I::dequantizer<BITS>(sb[j][g], sb[NB + j][g]);
          for (int h = 0; h < 2; ++h) {
            __m256 w0, w1;
            I::dequant16<BITS>(dq, w[j] + size_t(k) * BITS / 8, h, w0, w1);
            for (int m = 0; m < MR; ++m) {  // x straight from L1 into the FMAs: no registers held for it
              const float* xm = x + size_t(m) * p.K + k + 8 * h;
              acc[h][m][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xm), w0, acc[h][m][j]);
              acc[h][m][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xm + I::L), w1, acc[h][m][j]);
            }
          }
        }
      }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NB; ++j) out[m * NB + j] = I::reduce(I::V{acc[0][m][j], acc[1][m][j]});
}
#endif

template <class I, int BITS, int MR, int NB>
void tile(const QmmProblem& p, const float* x, int n0, float* out) {
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<I, Avx2Isa>) {
    switch (p.G) {
      case 32: return tile_avx2<BITS, MR, NB, 1>(p, x, n0, out);
      case 64: return tile_avx2<BITS, MR, NB, 2>(p, x, n0, out);
      case 128: return tile_avx2<BITS, MR, NB, 4>(p, x, n0, out);
      default: return tile_avx2<BITS, MR, NB, 0>(p, x, n0, out);
    }
  }
#endif
  switch (p.G) {
    case 32: return tile<I, BITS, MR, NB, 1>(p, x, n0, out);
    case 64: return tile<I, BITS, MR, NB, 2>(p, x, n0, out);
    case 128: return tile<I, BITS, MR, NB, 4>(p, x, n0, out);
    default: return tile<I, BITS, MR, NB, 0>(p, x, n0, out);
  }
}

// MR rows starting at x, columns [n_begin, n_end) -> y (MR, ldy) fp32.
template <class I, int BITS, int MR>
void block(const QmmProblem& p, const float* x, int n_begin, int n_end, float* y, int ldy) {
  constexpr int NB = cols_for_rows<I, MR, BITS>();
  float out[MR * NB];
  int n = n_begin;
  for (; n + NB <= n_end; n += NB) {
    tile<I, BITS, MR, NB>(p, x, n, out);
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < NB; ++j) y[size_t(m) * ldy + n + j] = out[m * NB + j];
  }
  for (; n < n_end; ++n) {  // tail: one column at a time, same per-output arithmetic
    tile<I, BITS, MR, 1>(p, x, n, out);
    for (int m = 0; m < MR; ++m) y[size_t(m) * ldy + n] = out[m];
  }
}

template <class I, int BITS, int MR = kMaxRows>
void block_rows(const QmmProblem& p, const float* x, int rows, int n0, int n1, float* y, int ldy) {
  if constexpr (MR > 1) {
    if (rows < MR) return block_rows<I, BITS, MR - 1>(p, x, rows, n0, n1, y, ldy);
  }
  block<I, BITS, MR>(p, x, n0, n1, y, ldy);
}

constexpr int kColumnBlock = 48;  // columns per step (a multiple of every NB): its weights stay in cache across row chunks

// Columns [n0, n1) for all rows, in chunks of up to kMaxRows: one thread's work.
template <class I>
void run_columns(const QmmProblem& p, int n0, int n1, float* y) {
  for (int c = n0; c < n1; c += kColumnBlock) {
    int c1 = c + kColumnBlock < n1 ? c + kColumnBlock : n1;
    for (int r = 0; r < p.M; r += kMaxRows) {
      int rows = p.M - r < kMaxRows ? p.M - r : kMaxRows;
      const float* x = p.x + size_t(r) * p.K;
      float* yr = y + size_t(r) * p.N;
      if (p.bits == 4) block_rows<I, 4>(p, x, rows, c, c1, yr, p.N);
      else block_rows<I, 8>(p, x, rows, c, c1, yr, p.N);
    }
  }
}

inline void run_columns(Isa isa, const QmmProblem& p, int n0, int n1, float* y) {
#if defined(__ARM_NEON) && defined(__aarch64__)
  if (isa == Isa::neon) return run_columns<NeonIsa>(p, n0, n1, y);
#endif
#if defined(__AVX512F__)
  if (isa == Isa::avx512) return run_columns<Avx512Isa>(p, n0, n1, y);
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (isa == Isa::avx2) return run_columns<Avx2Isa>(p, n0, n1, y);
#endif
  run_columns<GenericIsa>(p, n0, n1, y);
}

// x (M, K) with element strides (s0, s1) -> fp32 rows of K, 4-bit order permuted per 32-block.
template <typename T, typename Cvt>
void prepare_x(const T* x, int64_t s0, int64_t s1, int M, int K, int bits, float* out, Cvt cvt) {
  for (int m = 0; m < M; ++m) {
    const T* row = x + m * s0;
    float* o = out + size_t(m) * K;
    if (bits == 8) {
      for (int k = 0; k < K; ++k) o[k] = cvt(row[k * s1]);
      continue;
    }
    for (int k = 0; k < K; k += kBlock)
      for (int i = 0; i < kBlock / 2; ++i) {
        o[k + i] = cvt(row[(k + 2 * i) * s1]);
        o[k + kBlock / 2 + i] = cvt(row[(k + 2 * i + 1) * s1]);
      }
  }
}

}  // namespace mlxspec
