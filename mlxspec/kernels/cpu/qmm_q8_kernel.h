// Quantized matmul with int8 activations: llama.cpp's arithmetic for 4/8-bit weights times Q8 rows.
//
// Each 32-element block of a row of x is quantized to int8 with its own scale (d = amax / 127,
// q = nearbyint(x * 127 / amax), ties to even), as llama.cpp's Q8_0/Q8_1 do. The weight codes
// (MLX's affine layout, unchanged: no second copy) are multiplied by those int8 values with
// integer dot products (AVX-512 VNNI `vpdpbusd`: 64 u8 x s8 products a cycle), then scaled:
//
//   y[m, n] = sum_b  s[n, b] * d[m, b] * sum_i q_w[n, b, i] * q_x[m, b, i]   +   sum_b bias[n, b] * d[m, b] * sum_i q_x[m, b, i]
//
// Why: at one row a fp32 dequantize-and-FMA tile is compute-bound on 2 cores (~8 cycles per 32
// weights); integer products are ~4x fewer instructions, so one row streams the weights at the
// memory's pace and a verify pass of 4-8 rows costs far less than 4-8 rows of fp32 FMAs.
//
// Exactness rule (as qmm_kernel.h): the integer sums are exact; the float operations of one output
// (m, n) are a fixed sequence per 128-weight chunk and lane, the same whatever M, the tile or the
// thread, and the same on every ISA (the portable path below emulates the lanes), so a verify pass
// gives each row the bits of a one-row call. The numerics differ from the fp32 kernel's (x is
// rounded to 8 bits), as llama.cpp's do from a float reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "qmm_kernel.h"

namespace mlxspec {

constexpr int kChunk = 128;      // weights per step: 4 blocks of 32

// mxfp4 (gpt-oss): a 4-bit code c is the e2m1 value v(c) in {0, +-0.5, +-1, +-1.5, +-2, +-3, +-4, +-6}
// times 2^(e - 127). With p.e2m1 the tiles read c as kE2m1[c] = 2 v(c) + 12 (an unsigned byte, 0..24)
// and the group's exponents e (SType::e8m0) as the affine pair scale 2^(e - 128), bias -12 x scale,
// so that scale * kE2m1[c] + bias = v(c) * 2^(e - 127), exactly: the same integer-sum arithmetic as
// affine 4-bit codes (llama.cpp multiplies MXFP4 as int8 values the same way); no float copy of the
// exponents is kept.
alignas(16) constexpr uint8_t kE2m1[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
constexpr int kChunkLanes = 48;  // floats per chunk and row: 32 lane scales, then 16 bias-term inputs

// x quantized for one weight width. Row m: q + m * q_stride: C chunks of 128 int8 (4-bit: the 64
// even elements of the chunk's 4 blocks, 16 per block, then the 64 odd ones, the order a 64-byte
// load of packed nibbles splits into; 8-bit: natural order). d + m * d_stride: per chunk 48 floats:
// [0, 32) the block scale each int32 lane of the dot products reads (4-bit lane l <- block l / 4,
// 8-bit lane l <- block l / 8), [32, 48) the bias term's input, d * sum of q of block j in lane 4j
// (other lanes 0). 8-bit only, s + m * s_stride: per chunk 32 int32, 128 * the sum of each 4
// consecutive codes (the AVX2 path's correction for codes - 128). Blocks past K are zero everywhere.
struct Q8Rows {
  const int8_t* q;
  const float* d;
  const int32_t* s;
  size_t q_stride, d_stride, s_stride;
  Q8Rows from(int m) const { return {q + m * q_stride, d + m * d_stride, s ? s + m * s_stride : nullptr, q_stride, d_stride, s_stride}; }
};

// Owns the buffers of a Q8Rows (per thread, reused).
struct Q8Buffer {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> s;
  Q8Rows rows{};
};

inline int q8_chunks(int K) { return (K + kChunk - 1) / kChunk; }

// Where column n's codes lie, chunk by chunk. MLX's layout (pack 1): row n, chunk c at byte
// n * row_bytes + c * chunk. Packed (pack P, packing.py packs a layer's codes at install): each group of
// P columns keeps its P rows' bytes but stores chunk 0 of each column, then chunk 1 of each..., so a
// tile of P columns reads one sequential stream instead of P short ones (rows of K = 576-1152 are
// 5-9 cache lines at 4 bits, too short for the hardware prefetcher). Column j of group g = n / P:
// chunk c at g P row_bytes + c P chunk + j bytes(c); bytes(c) is chunk, or less for a last, short chunk.
struct ColumnCodes {
  const uint8_t* base = nullptr;
  size_t stride = 0, shift = 0;  // chunk c at base + c * stride, less `shift` for the last chunk
  int last = 0;
  ColumnCodes() = default;
  ColumnCodes(const QmmProblem& p, int n, int bits) {
    const size_t row_bytes = size_t(p.K) * bits / 8, chunk = size_t(kChunk) * bits / 8;
    last = q8_chunks(p.K) - 1;
    const int j = p.pack > 1 ? n % p.pack : 0;
    base = p.w + size_t(n - j) * row_bytes + size_t(j) * chunk;
    stride = p.pack > 1 ? p.pack * chunk : chunk;
    shift = size_t(j) * (chunk - (row_bytes - size_t(last) * chunk));
  }
  const uint8_t* at(int c) const { return base + size_t(c) * stride - (c == last ? shift : 0); }
};

// How far ahead of its codes a tile prefetches: MLX's layout, the next tile's same chunk (NB rows
// on); packed, 4 KB on in the group's one stream (NB rows on measured 5-10% slower at K = 6912).
inline size_t prefetch_ahead(const QmmProblem& p, int nb, size_t row_bytes) {
  return p.pack > 1 ? 4096 : size_t(nb) * row_bytes;
}

// One 32-block of fp32 -> int8 codes (natural order); returns the block scale, sets *sum.
inline float quantize_block_ref(const float* x, int8_t* q, int* sum) {
  float amax = 0.f;
  for (int i = 0; i < kBlock; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float id = amax > 0.f ? 127.f / amax : 0.f;
  int s = 0;
  for (int i = 0; i < kBlock; ++i) {
    const float v = std::nearbyint(x[i] * id);  // |v| <= 127: x * 127/amax rounds to at most 127
    const int c = v == v ? int(v) : -127;       // NaN: the vector conversion's -128, clamped as below
    q[i] = int8_t(c < -127 ? -127 : (c > 127 ? 127 : c));  // never -128: the AVX2 path negates codes
    s += q[i];
  }
  *sum = s;
  return amax / 127.f;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// The same codes, scale and sum as quantize_block_ref, 16 lanes at a time (the conversion rounds
// to nearest even under the default MXCSR, as nearbyint does; max and the products are exact/IEEE).
inline float quantize_block_avx512(const float* x, int8_t* q, int* sum) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const __m512 id = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const __m512i qa = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(a, id)), hi), lo);
  const __m512i qb = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(b, id)), hi), lo);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(qb));
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
  return amax / 127.f;
}
#endif

// fp32 rows (M, K), natural order, row stride ldx -> the Q8Rows layout for `bits` in buf.
inline void quantize_rows(const float* x, size_t ldx, int M, int K, int bits, Isa isa, Q8Buffer& buf) {
  const int C = q8_chunks(K), B = K / kBlock;
  buf.q.assign(size_t(M) * C * kChunk, 0);
  buf.d.assign(size_t(M) * C * kChunkLanes, 0.f);
  buf.s.assign(bits == 8 ? size_t(M) * C * 32 : 0, 0);
  int8_t codes[kBlock];
  for (int m = 0; m < M; ++m) {
    int8_t* q = buf.q.data() + size_t(m) * C * kChunk;
    float* d = buf.d.data() + size_t(m) * C * kChunkLanes;
    for (int b = 0; b < B; ++b) {
      int sum = 0;
      float scale;
#if defined(__AVX512F__) && defined(__AVX512BW__)
      if (isa == Isa::avx512) scale = quantize_block_avx512(x + size_t(m) * ldx + size_t(b) * kBlock, codes, &sum);
      else
#endif
        scale = quantize_block_ref(x + size_t(m) * ldx + size_t(b) * kBlock, codes, &sum);
      (void)isa;
      const int c = b / 4, j = b % 4;
      int8_t* qc = q + size_t(c) * kChunk;
      float* dc = d + size_t(c) * kChunkLanes;
      if (bits == 4) {
        for (int i = 0; i < kBlock / 2; ++i) qc[16 * j + i] = codes[2 * i], qc[64 + 16 * j + i] = codes[2 * i + 1];
        for (int l = 4 * j; l < 4 * j + 4; ++l) dc[l] = scale;
      } else {
        int32_t* sc = buf.s.data() + (size_t(m) * C + c) * 32 + 8 * j;
        for (int i = 0; i < kBlock; ++i) qc[32 * j + i] = codes[i], sc[i / 4] += 128 * codes[i];
        for (int l = 8 * j; l < 8 * j + 8; ++l) dc[l] = scale;
      }
      dc[32 + 4 * j] = scale * float(sum);
    }
  }
  buf.rows = Q8Rows{buf.q.data(), buf.d.data(), bits == 8 ? buf.s.data() : nullptr, size_t(C) * kChunk, size_t(C) * kChunkLanes, size_t(C) * 32};
}

// ---------------------------------------------------------------- portable path (the reference)
// One column, all rows; emulates the vector path's 16 lanes operation for operation. Per chunk and
// lane l: acc[l] = fma(dot, scale * d, acc[l]) (8-bit: both halves in turn), then
// acc[l] = fma(bias lane, bias input lane, acc[l]); the output is the fixed-tree sum of acc.
template <int BITS>
void column_q8_ref(const QmmProblem& p, const Q8Rows& x, int n, float* y, int ldy) {
  const int B = p.K / kBlock, gb = p.G / kBlock, groups = p.K / p.G, C = q8_chunks(p.K);
  const ColumnCodes codes(p, n, BITS);
  std::vector<float> s(groups), bias(groups);
  load_floats(p.scales, size_t(n) * groups, groups, p.stype, s.data());
  if (p.e2m1 || p.bias_of_scale != 0.f)
    for (int i = 0; i < groups; ++i) bias[i] = s[i] * (p.e2m1 ? -12.0f : p.bias_of_scale);
  else
    load_floats(p.biases, size_t(n) * groups, groups, p.stype, bias.data());
  for (int m = 0; m < p.M; ++m) {
    GenericIsa::V acc = GenericIsa::zero();
    for (int c = 0; c < C; ++c) {
      const int nblk = B - 4 * c < 4 ? B - 4 * c : 4;
      const int8_t* xc = x.q + m * x.q_stride + size_t(c) * kChunk;
      const float* dc = x.d + m * x.d_stride + size_t(c) * kChunkLanes;
      const uint8_t* w = codes.at(c);
      auto sw = [&](int blk) { return blk < nblk ? s[(4 * c + blk) / gb] : 0.f; };
      for (int half = 0; half < (BITS == 4 ? 1 : 2); ++half)
        for (int l = 0; l < 16; ++l) {
          int32_t dot = 0;
          for (int i = 0; i < 4; ++i) {
            if (BITS == 4) {
              const int v = 4 * l + i, byte = v / 16 < nblk ? w[v] : 0;
              const int lo = p.e2m1 ? (v / 16 < nblk ? kE2m1[byte & 15] : 0) : byte & 15;
              const int hi = p.e2m1 ? (v / 16 < nblk ? kE2m1[byte >> 4] : 0) : byte >> 4;
              dot += lo * int(xc[v]) + hi * int(xc[64 + v]);
            } else {
              const int v = 64 * half + 4 * l + i;
              dot += (v / 32 < nblk ? int(w[v]) : 0) * int(xc[v]);
            }
          }
          const float scale = BITS == 4 ? sw(l / 4) : sw(2 * half + l / 8);
          acc.v[l] = std::fma(float(dot), scale * dc[16 * half + l], acc.v[l]);
        }
      for (int l = 0; l < 16; ++l) {
        const float b = l % 4 == 0 && l / 4 < nblk ? bias[(4 * c + l / 4) / gb] : 0.f;
        acc.v[l] = std::fma(b, dc[32 + l], acc.v[l]);
      }
    }
    y[size_t(m) * ldy + n] = GenericIsa::reduce(acc);
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define MLXSPEC_Q8_VNNI 1
// Up to 16 consecutive scales or biases from index i as fp32 lanes (the rest 0): the values
// load_floats gives (f16 and bf16 widen exactly).
// Up to 16 mxfp4 exponents e (SType::e8m0) from index i as 2^(e - 128) (e8m0_bits), the rest 0.
inline __m512 load_e8m0_16(const void* base, size_t i, int n) {
  const __mmask16 k = __mmask16((1u << n) - 1);
  const __m512i e = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, static_cast<const uint8_t*>(base) + i));
  const __m512i bits = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()),
                                               _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23),
                                               _mm512_set1_epi32(1 << 21));
  return _mm512_castsi512_ps(_mm512_maskz_mov_epi32(k, bits));
}

inline __m512 load_params16(const void* base, size_t i, int n, SType t) {
  const __mmask16 k = __mmask16((1u << n) - 1);
  if (t == SType::f32) return _mm512_maskz_loadu_ps(k, static_cast<const float*>(base) + i);
  const __m256i h = _mm256_maskz_loadu_epi16(k, static_cast<const uint16_t*>(base) + i);
  if (t == SType::f16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// lane l -> index of its group among those loaded for a chunk: (first_block + l / per) / gb
inline __m512i lane_index(int per, int first_block, int gb) {
  alignas(64) int32_t v[16];
  for (int l = 0; l < 16; ++l) v[l] = (first_block + l / per) / gb;
  return _mm512_load_si512(v);
}

// Lane -> group index vectors for a group size of gb blocks (gb divides 4: a chunk starts on a group).
struct ChunkScales {
  __m512i i4, i8a, i8b;
  explicit ChunkScales(int gb) : i4(lane_index(4, 0, gb)), i8a(lane_index(8, 0, gb)), i8b(lane_index(8, 2, gb)) {}
};

// MR rows x NB columns from n0, one 128-weight chunk at a time: the codes times the int8 rows in
// integer dot products, scaled per lane, plus the bias term; MR*NB accumulators in registers.
template <int BITS, int MR, int NB, bool E2M1 = false>  // E2M1: mxfp4 codes (a compile-time path: no cost to affine)
void tile_q8_vnni(const QmmProblem& p, const Q8Rows& x, int n0, const ChunkScales& cs, float* out) {
  const size_t ahead = prefetch_ahead(p, NB, size_t(p.K) * BITS / 8);
  const int groups = p.K / p.G, gb = p.G / kBlock, B = p.K / kBlock, C = q8_chunks(p.K);
  ColumnCodes w[NB];
  for (int j = 0; j < NB; ++j) w[j] = ColumnCodes(p, n0 + j, BITS);
  __m512 acc[MR][NB];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_ps();
  const __m512i nib = _mm512_set1_epi8(15);
  const __m512i lut = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kE2m1)));
  constexpr bool e2m1 = BITS == 4 && E2M1;
  const int sh = gb == 1 ? 0 : (gb == 2 ? 1 : 2);  // gb is 1, 2 or 4 here: shifts, not divisions, per chunk
  for (int c = 0; c < C; ++c) {
    const int nblk = B - 4 * c < 4 ? B - 4 * c : 4, ng = (nblk + gb - 1) >> sh;
    const size_t g = size_t(4 * c) >> sh;
    __m512i wa[NB], wb[NB];
    __m512 sa[NB], sbv[NB], bl[NB];
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      __m512 s16;  // mxfp4's exponents (a compile-time path: affine tiles test nothing more per load)
      if constexpr (e2m1) s16 = load_e8m0_16(p.scales, size_t(n0 + j) * groups + g, ng);
      else s16 = load_params16(p.scales, size_t(n0 + j) * groups + g, ng, p.stype);
      __m512 b16;
      if constexpr (e2m1) b16 = _mm512_mul_ps(s16, _mm512_set1_ps(-12.0f));
      else if (p.bias_of_scale != 0.f) b16 = _mm512_mul_ps(s16, _mm512_set1_ps(p.bias_of_scale));  // exact (packing.implied_bias)
      else b16 = load_params16(p.biases, size_t(n0 + j) * groups + g, ng, p.stype);
      bl[j] = _mm512_maskz_permutexvar_ps(__mmask16(0x1111u & ((1u << (4 * nblk)) - 1)), cs.i4, b16);
      const uint8_t* wp = w[j].at(c);
      prefetch(wp + ahead);
      if (BITS == 4) {
        const __m512i v = nblk == 4 ? _mm512_loadu_si512(wp) : _mm512_maskz_loadu_epi8((~0ull) >> (64 - 16 * nblk), wp);
        wa[j] = _mm512_and_si512(v, nib);
        wb[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
        if constexpr (e2m1) {  // codes past the row's blocks were loaded as 0: their lanes' scales are 0 below
          wa[j] = _mm512_shuffle_epi8(lut, wa[j]);
          wb[j] = _mm512_shuffle_epi8(lut, wb[j]);
        }
        sa[j] = _mm512_maskz_permutexvar_ps(__mmask16((1u << (4 * nblk)) - 1), cs.i4, s16);
      } else {
        prefetch(wp + 64 + ahead);
        const int na = nblk < 2 ? nblk : 2, nb = nblk - na;
        wa[j] = na == 2 ? _mm512_loadu_si512(wp) : _mm512_maskz_loadu_epi8((~0ull) >> (64 - 32 * na), wp);
        wb[j] = nb == 2 ? _mm512_loadu_si512(wp + 64) : (nb ? _mm512_maskz_loadu_epi8((~0ull) >> (64 - 32 * nb), wp + 64) : _mm512_setzero_si512());
        sa[j] = _mm512_maskz_permutexvar_ps(__mmask16((1u << (8 * na)) - 1), cs.i8a, s16);
        sbv[j] = _mm512_maskz_permutexvar_ps(__mmask16((1u << (8 * nb)) - 1), cs.i8b, s16);
      }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const int8_t* xc = x.q + m * x.q_stride + size_t(c) * kChunk;
      const float* dc = x.d + m * x.d_stride + size_t(c) * kChunkLanes;
      const __m512i x0 = _mm512_loadu_si512(xc), x1 = _mm512_loadu_si512(xc + 64);
      const __m512 d0 = _mm512_loadu_ps(dc), sxb = _mm512_loadu_ps(dc + 32);
      if (BITS == 4) {
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) {
          __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wa[j], x0);
          dot = _mm512_dpbusd_epi32(dot, wb[j], x1);
          acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sa[j], d0), acc[m][j]);
          acc[m][j] = _mm512_fmadd_ps(bl[j], sxb, acc[m][j]);
        }
      } else {
        const __m512 d1 = _mm512_loadu_ps(dc + 16);
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) {
          const __m512i da = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wa[j], x0);
          const __m512i db = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wb[j], x1);
          acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(da), _mm512_mul_ps(sa[j], d0), acc[m][j]);
          acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(db), _mm512_mul_ps(sbv[j], d1), acc[m][j]);
          acc[m][j] = _mm512_fmadd_ps(bl[j], sxb, acc[m][j]);
        }
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NB; ++j) out[m * NB + j] = Avx512Isa::reduce(acc[m][j]);
}

// The VNNI tiles for the shared drivers below: rows per chunk, columns per tile for MR rows
// (registers for MR*NB accumulators plus the weights), per-call context.
struct VnniTiles {
  static constexpr int kRows = kMaxRows;
  template <int MR>
  static constexpr int cols() { return MR <= 2 ? 4 : 2; }
  struct Ctx {
    ChunkScales cs;
    explicit Ctx(const QmmProblem& p) : cs(p.G / kBlock) {}
  };
  template <int BITS, int MR, int NB>
  static void tile(const QmmProblem& p, const Q8Rows& x, int n0, const Ctx& c, float* out) {
    if (BITS == 4 && p.e2m1) tile_q8_vnni<BITS, MR, NB, true>(p, x, n0, c.cs, out);
    else tile_q8_vnni<BITS, MR, NB, false>(p, x, n0, c.cs, out);
  }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
#define MLXSPEC_Q8_AVX2 1
// The same 16 lanes as two 8-lane halves (lanes 0-7, 8-15) for CPUs without VNNI: u8 x s8 pairs
// with vpmaddubsw and vpmaddwd into the lanes' int32 sums, exactly vpdpbusd's; then the same fp32
// operations per lane in the same order. No int16 saturates: 4-bit codes times |x| <= 127, four
// products, is at most 7620; 8-bit codes w go in as w - 128 (llama.cpp's sign trick: |w - 128| <= 128
// times x with the sign of w - 128, two products at most 32512), plus the row's precomputed
// 128 * sum of x per lane (Q8Rows::s).

// n (1, 2 or 4) consecutive params from index i as fp32 lanes (the values load_floats gives), the rest 0.
// n (1, 2 or 4) mxfp4 exponents from index i as 2^(e - 128), the rest 0.
inline __m128 load_e8m0_4(const void* base, size_t i, int n) {
  const uint8_t* e = static_cast<const uint8_t*>(base) + i;
  return _mm_setr_ps(e8m0_to_float(e[0]), n > 1 ? e8m0_to_float(e[1]) : 0.f, n > 2 ? e8m0_to_float(e[2]) : 0.f,
                     n > 3 ? e8m0_to_float(e[3]) : 0.f);
}

inline __m128 load_params4(const void* base, size_t i, int n, SType t) {
  if (t == SType::f32) {
    const float* f = static_cast<const float*>(base) + i;
    return n == 4 ? _mm_loadu_ps(f) : (n == 2 ? _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(f))) : _mm_load_ss(f));
  }
  const uint16_t* h = static_cast<const uint16_t*>(base) + i;
  __m128i raw;
  if (n == 4) raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(h));
  else if (n == 2) raw = _mm_cvtsi32_si128(*reinterpret_cast<const int32_t*>(h));
  else raw = _mm_cvtsi32_si128(h[0]);
  if (t == SType::bf16) return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(raw), 16));
#if defined(__F16C__)
  return _mm_cvtph_ps(raw);
#else
  alignas(16) float v[4] = {};
  load_floats(base, i, n, t, v);
  return _mm_load_ps(v);
#endif
}

// int32 lanes (4 bytes each): 4-bit codes lo, hi (u8, <= 15) times x0, x1 (s8), summed
inline __m256i dot4_nibbles_avx2(__m256i lo, __m256i x0, __m256i hi, __m256i x1) {
  const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// int32 lanes: (w - 128) . x for 8-bit codes w, given a = |w - 128| (u8) and w' = w - 128 (s8)
inline __m256i dot4_signed_avx2(__m256i a, __m256i wsigned, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(x, wsigned)), _mm256_set1_epi16(1));
}

// 32 bytes of a chunk's codes from p (bytes past `valid` read as 0: a chunk cut short).
inline __m256i load32_avx2(const uint8_t* p, int valid) {
  if (valid >= 32) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  alignas(32) uint8_t tmp[32] = {};
  for (int i = 0; i < valid; ++i) tmp[i] = p[i];
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(tmp));
}

template <int BITS, int MR, int NB, bool E2M1 = false>
void tile_q8_avx2(const QmmProblem& p, const Q8Rows& x, int n0, float* out) {
  const size_t ahead = prefetch_ahead(p, NB, size_t(p.K) * BITS / 8);
  const int groups = p.K / p.G, gb = p.G / kBlock, B = p.K / kBlock, C = q8_chunks(p.K);
  const __m256i nib = _mm256_set1_epi8(15);
  const __m256i lut = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kE2m1)));
  constexpr bool e2m1 = BITS == 4 && E2M1;
  const __m256i blk01 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), blk23 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
  __m256 acc[MR][NB][2];
  ColumnCodes w[NB];
  for (int j = 0; j < NB; ++j) w[j] = ColumnCodes(p, n0 + j, BITS);
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j][0] = acc[m][j][1] = _mm256_setzero_ps();
  for (int c = 0; c < C; ++c) {
    const int nblk = B - 4 * c < 4 ? B - 4 * c : 4;
    // per block of the chunk: its group's param (group index block / gb), 0 past nblk
    const __m128i by_group = _mm_setr_epi32(0, 1 / gb, 2 / gb, 3 / gb);
    const __m128 live = _mm_castsi128_ps(_mm_cmplt_epi32(_mm_setr_epi32(0, 1, 2, 3), _mm_set1_epi32(nblk)));
    const int ng = nblk == 4 ? 4 / gb : (nblk + gb - 1) / gb, ngl = ng == 3 ? 4 : ng;  // 3 groups: load 4 (within the row)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const size_t g = size_t(n0 + j) * groups + size_t(4 * c) / gb;
      auto load4 = [&](const void* base, size_t i, int n) {  // mxfp4's exponents: a compile-time path
        if constexpr (e2m1) return load_e8m0_4(base, i, n);
        else return load_params4(base, i, n, p.stype);
      };
      auto per_block = [&](const void* base) {
        const __m128 v = ngl == 4 && g + 4 > size_t(n0 + j + 1) * groups ? load4(base, g, 2) : load4(base, g, ngl);
        return _mm_and_ps(_mm_permutevar_ps(v, by_group), live);
      };
      __m128 s4x = per_block(p.scales), b4x = _mm_setzero_ps();
      const bool implied = e2m1 || p.bias_of_scale != 0.f;  // biases from the scales (below), not read
      if (!implied) b4x = per_block(p.biases);
      if (ng == 3) {  // a 3-block tail at group size 32: the third value alone (never read past the row)
        const __m128 third = load4(p.scales, g + 2, 1);
        s4x = _mm_and_ps(_mm_insert_ps(s4x, third, 0x20), live);
        if (!implied) b4x = _mm_and_ps(_mm_insert_ps(b4x, load_params4(p.biases, g + 2, 1, p.stype), 0x20), live);
      }
      if constexpr (e2m1) b4x = _mm_mul_ps(s4x, _mm_set1_ps(-12.0f));  // mxfp4: bias -12 x scale (kE2m1's offset)
      else if (implied) b4x = _mm_mul_ps(s4x, _mm_set1_ps(p.bias_of_scale));
      const __m256 s4 = _mm256_castps128_ps256(s4x), b4 = _mm256_castps128_ps256(b4x);
      const __m256 bl[2] = {_mm256_blend_ps(_mm256_setzero_ps(), _mm256_permutevar8x32_ps(b4, blk01), 0x11),
                            _mm256_blend_ps(_mm256_setzero_ps(), _mm256_permutevar8x32_ps(b4, blk23), 0x11)};
      const uint8_t* wp = w[j].at(c);
      const int valid = nblk * kBlock * BITS / 8;
      prefetch(wp + ahead);
      // 4-bit: lo, hi nibbles of halves 0, 1 of the 64 code bytes; 8-bit: quarters 0-3 of 128 as
      // lo = |w - 128|, hi = w - 128
      __m256i lo[4], hi[4];
#pragma GCC unroll 4
      for (int q = 0; q < (BITS == 4 ? 2 : 4); ++q) {
        const __m256i v = load32_avx2(wp + 32 * q, valid - 32 * q);
        if (BITS == 4) lo[q] = _mm256_and_si256(v, nib), hi[q] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
        if constexpr (e2m1) lo[q] = _mm256_shuffle_epi8(lut, lo[q]), hi[q] = _mm256_shuffle_epi8(lut, hi[q]);  // <= 24: no int16 saturates
        if (BITS != 4) hi[q] = _mm256_xor_si256(v, _mm256_set1_epi8(char(0x80))), lo[q] = _mm256_abs_epi8(hi[q]);
      }
      __m256 sl[4];  // lane scales: 4-bit halves 0, 1; 8-bit quarters (A lanes 0-7, 8-15, B lanes 0-7, 8-15)
      if (BITS == 4) sl[0] = _mm256_permutevar8x32_ps(s4, blk01), sl[1] = _mm256_permutevar8x32_ps(s4, blk23);
      else
        for (int q = 0; q < 4; ++q) sl[q] = _mm256_permutevar8x32_ps(s4, _mm256_set1_epi32(q));
#pragma GCC unroll 4
      for (int m = 0; m < MR; ++m) {
        const int8_t* xc = x.q + m * x.q_stride + size_t(c) * kChunk;
        const float* dc = x.d + m * x.d_stride + size_t(c) * kChunkLanes;
        auto xv = [&](int off) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xc + off)); };
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          __m256& a = acc[m][j][h];
          if (BITS == 4) {
            const __m256i dot = dot4_nibbles_avx2(lo[h], xv(32 * h), hi[h], xv(64 + 32 * h));
            a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(sl[h], _mm256_loadu_ps(dc + 8 * h)), a);
          } else {
            const int32_t* sc = x.s + m * x.s_stride + size_t(c) * 32;
            for (int half = 0; half < 2; ++half) {  // A (bytes 0-63), then B (64-127), as the VNNI path
              const int q = 2 * half + h;
              const __m256i x128 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + 8 * q));
              const __m256i dot = _mm256_add_epi32(dot4_signed_avx2(lo[q], hi[q], xv(32 * q)), x128);
              a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(sl[q], _mm256_loadu_ps(dc + 16 * half + 8 * h)), a);
            }
          }
          a = _mm256_fmadd_ps(bl[h], _mm256_loadu_ps(dc + 32 + 8 * h), a);
        }
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NB; ++j) out[m * NB + j] = Avx2Isa::reduce(Avx2Isa::V{acc[m][j][0], acc[m][j][1]});
}

struct Avx2Tiles {  // as VnniTiles: 16 registers hold fewer rows and columns
  static constexpr int kRows = 4;
  template <int MR>
  static constexpr int cols() { return MR == 1 ? 2 : 1; }
  struct Ctx {
    explicit Ctx(const QmmProblem&) {}
  };
  template <int BITS, int MR, int NB>
  static void tile(const QmmProblem& p, const Q8Rows& x, int n0, const Ctx&, float* out) {
    if (BITS == 4 && p.e2m1) tile_q8_avx2<BITS, MR, NB, true>(p, x, n0, out);
    else tile_q8_avx2<BITS, MR, NB, false>(p, x, n0, out);
  }
};
#endif

// Columns [n_begin, n_end) for MR rows, NB columns a tile (the last ones one at a time).
template <class T, int BITS, int MR>
void block_q8(const QmmProblem& p, const Q8Rows& x, int n_begin, int n_end, float* y, int ldy) {
  constexpr int NB = T::template cols<MR>();
  const typename T::Ctx ctx(p);
  float out[MR * NB];
  int n = n_begin;
  for (; n + NB <= n_end; n += NB) {
    T::template tile<BITS, MR, NB>(p, x, n, ctx, out);
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < NB; ++j) y[size_t(m) * ldy + n + j] = out[m * NB + j];
  }
  for (; n < n_end; ++n) {
    T::template tile<BITS, MR, 1>(p, x, n, ctx, out);
    for (int m = 0; m < MR; ++m) y[size_t(m) * ldy + n] = out[m];
  }
}

template <class T, int BITS, int MR = T::kRows>
void block_rows_q8(const QmmProblem& p, const Q8Rows& x, int rows, int n0, int n1, float* y, int ldy) {
  if constexpr (MR > 1) {
    if (rows < MR) return block_rows_q8<T, BITS, MR - 1>(p, x, rows, n0, n1, y, ldy);
  }
  block_q8<T, BITS, MR>(p, x, n0, n1, y, ldy);
}

// Columns [n0, n1) for all rows with tiles T: column blocks that stay in cache across row chunks.
template <class T>
void columns_q8(const QmmProblem& p, const Q8Rows& x, int n0, int n1, float* y) {
  for (int c = n0; c < n1; c += kColumnBlock) {
    const int c1 = c + kColumnBlock < n1 ? c + kColumnBlock : n1;
    for (int r = 0; r < p.M; r += T::kRows) {
      const int rows = p.M - r < T::kRows ? p.M - r : T::kRows;
      const Q8Rows xr = x.from(r);
      if (p.bits == 4) block_rows_q8<T, 4>(p, xr, rows, c, c1, y + size_t(r) * p.N, p.N);
      else block_rows_q8<T, 8>(p, xr, rows, c, c1, y + size_t(r) * p.N, p.N);
    }
  }
}

enum class Q8Path { portable, avx2, vnni };

// Which int8 path an ISA runs here.
inline Q8Path q8_path_of(Isa isa) {
#if defined(MLXSPEC_Q8_VNNI)
  if (isa == Isa::avx512) return Q8Path::vnni;
#endif
#if defined(MLXSPEC_Q8_AVX2)
  if (isa == Isa::avx512 || isa == Isa::avx2) return Q8Path::avx2;
#endif
  (void)isa;
  return Q8Path::portable;
}

// The best ISA's int8 path by name: "avx512-vnni", "avx2" or "portable".
inline const char* q8_path_name() {
  const Q8Path path = q8_path_of(best_isa());
  return path == Q8Path::vnni ? "avx512-vnni" : (path == Q8Path::avx2 ? "avx2" : "portable");
}

// Columns [n0, n1) of a q8 problem for all rows (p.x is unused; x holds the quantized rows). Group
// sizes 32, 64 and 128 take the vector tiles; others the portable path.
inline void run_columns_q8(Isa isa, const QmmProblem& p, const Q8Rows& x, int n0, int n1, float* y) {
  const Q8Path path = 4 % (p.G / kBlock) == 0 ? q8_path_of(isa) : Q8Path::portable;
#if defined(MLXSPEC_Q8_VNNI)
  if (path == Q8Path::vnni) return columns_q8<VnniTiles>(p, x, n0, n1, y);
#endif
#if defined(MLXSPEC_Q8_AVX2)
  if (path == Q8Path::avx2) return columns_q8<Avx2Tiles>(p, x, n0, n1, y);
#endif
  (void)path;
  for (int n = n0; n < n1; ++n) {
    if (p.bits == 4) column_q8_ref<4>(p, x, n, y, p.N);
    else column_q8_ref<8>(p, x, n, y, p.N);
  }
}

}  // namespace mlxspec
