// Lane types the CPU kernels are written against: 16 fp32 lanes with zero/load/store/set1/fma,
// a fixed-order reduction, and dequantization of 32 packed weights. One struct per instruction set
// (portable, AVX2, AVX-512, NEON in simd_neon.h); a kernel instantiated for one of them does the
// same arithmetic for every row, which is what keeps multi-row calls bit-identical to one-row
// calls. All of them compute each output with the same fp32 operations in the same order, so
// they also agree with each other bit for bit.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace mlxspec {

// A hint to load a cache line soon (no effect on results).
inline void prefetch(const void* p) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, 3);
#endif
}

// dtype of scales/biases; e8m0: mxfp4's uint8 exponents e, read as the scale 2^(e - 128) (the units
// of qmm_q8_kernel.h's kE2m1 codes; the int8 path alone reads them, its bias being -12 x the scale)
enum class SType : int { f32 = 0, f16 = 1, bf16 = 2, e8m0 = 3 };
enum class Isa : int { generic = 0, avx512 = 1, avx2 = 2, neon = 3 };

inline float half_to_float(uint16_t h) {
  // IEEE binary16 -> binary32, exact (subnormals included).
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do { man <<= 1; ++e; } while (!(man & 0x400));
    bits = sign | uint32_t(112 - e) << 23 | ((man & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// binary32 -> binary16, round to nearest even (overflow to inf, subnormals, NaN kept).
inline uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00u);             // NaN
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);            // rounds to >= 65520: inf
  if (ax < 0x38800000u) {                                            // below 2^-14: subnormal or zero
    if (ax < 0x33000000u) return uint16_t(sign);                     // below half the smallest subnormal
    const uint32_t man = (ax & 0x7fffffu) | 0x800000u;
    const int shift = 126 - int(ax >> 23);                           // 14..24 more bits dropped
    uint32_t h = man >> (shift);
    const uint32_t rest = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1u))) ++h;
    return uint16_t(sign | h);
  }
  uint32_t h = ((ax - 0x38000000u) >> 13);                           // rebias 127 -> 15
  const uint32_t rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

inline float bf16_to_float(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// 2^(e - 128) as fp32 bits, exactly: the exponent field e - 1, or 2^-128 (a subnormal) for e = 0.
inline uint32_t e8m0_bits(uint32_t e) { return e ? (e - 1) << 23 : 1u << 21; }

inline float e8m0_to_float(uint8_t e) {
  const uint32_t bits = e8m0_bits(e);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// n values of scales/biases (any SType) from index i -> fp32; vectorised where the CPU converts.
inline void load_floats(const void* p, size_t i, int n, SType t, float* out) {
  if (t == SType::f32) {
    std::memcpy(out, static_cast<const float*>(p) + i, sizeof(float) * n);
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(p) + i;
  int k = 0;
#if defined(__AVX512F__)
  if (t == SType::f16)
    for (; k + 16 <= n; k += 16)
      _mm512_storeu_ps(out + k, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + k))));
#endif
#if defined(__F16C__)
  if (t == SType::f16)
    for (; k + 8 <= n; k += 8)
      _mm256_storeu_ps(out + k, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + k))));
  if (t == SType::f16)
    for (; k < n; ++k) out[k] = _cvtsh_ss(h[k]);
#endif
  if (t == SType::f16)
    for (; k < n; ++k) out[k] = half_to_float(h[k]);
  else if (t == SType::bf16)
    for (; k < n; ++k) out[k] = bf16_to_float(h[k]);
  else  // e8m0: mxfp4's exponents, a byte each
    for (; k < n; ++k) out[k] = e8m0_to_float(static_cast<const uint8_t*>(p)[i + k]);
}

// n fp32 values -> dtype t at out (round to nearest even, as MLX's conversions round).
inline void store_floats(const float* y, int n, SType t, void* out) {
  if (t == SType::f32) {
    std::memcpy(out, y, sizeof(float) * n);
    return;
  }
  uint16_t* h = static_cast<uint16_t*>(out);
  int k = 0;
  if (t == SType::f16) {
#if defined(__F16C__)
    for (; k + 8 <= n; k += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(h + k), _mm256_cvtps_ph(_mm256_loadu_ps(y + k), _MM_FROUND_TO_NEAREST_INT));
    for (; k < n; ++k) h[k] = _cvtss_sh(y[k], _MM_FROUND_TO_NEAREST_INT);
#endif
    for (; k < n; ++k) h[k] = float_to_half(y[k]);
    return;
  }
  for (; k < n; ++k) {  // bf16: round to nearest even on the top 16 bits; NaN -> MLX's quiet NaN
    uint32_t bits;
    std::memcpy(&bits, &y[k], 4);
    h[k] = (bits & 0x7fffffffu) > 0x7f800000u ? uint16_t(0x7fc0) : uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
}

// ---------------------------------------------------------------- portable path
// 16 float lanes as plain arrays: correct on any CPU (the reference for the others); std::fma keeps the
// contraction explicit, so results never depend on the optimiser. Speed depends on the compiler
// vectorising std::fma (GCC 12 on x86 keeps it scalar: the AVX-512 path below is the fast one here).

struct GenericIsa {
  static constexpr int L = 16;
  struct V { float v[L]; };
  static V zero() { V r; for (int i = 0; i < L; ++i) r.v[i] = 0.f; return r; }
  static V load(const float* p) { V r; for (int i = 0; i < L; ++i) r.v[i] = p[i]; return r; }
  static V load_reg(const float* p) { return load(p); }
  static void store(float* p, const V& a) { for (int i = 0; i < L; ++i) p[i] = a.v[i]; }
  static V set1(float x) { V r; for (int i = 0; i < L; ++i) r.v[i] = x; return r; }
  static V fma(V a, V b, V c) { for (int i = 0; i < L; ++i) c.v[i] = std::fma(a.v[i], b.v[i], c.v[i]); return c; }
  static float reduce(const V& a) {  // pairwise, fixed order
    float t[L];
    for (int i = 0; i < L; ++i) t[i] = a.v[i];
    for (int w = L / 2; w > 0; w /= 2)
      for (int i = 0; i < w; ++i) t[i] += t[i + w];
    return t[0];
  }
  // Dequantizing one group of one row: `dq` is set up once per group (scale, bias; at 4 bits the
  // 16 possible values fma(q, s, b)), then each 32 weights -> two vectors; at 4 bits: even elements,
  // then odd ones (the order one 16-byte load unpacks to; qmm_kernel.h permutes x to match).
  // Every ISA computes each weight as fma(float(q), s, b), so all of them agree bit for bit.
  struct Dq { float s, b, table[16]; };
  template <int BITS>
  static Dq dequantizer(float s, float b) {
    Dq d{s, b, {}};
    if (BITS == 4)
      for (int q = 0; q < 16; ++q) d.table[q] = std::fma(float(q), s, b);
    return d;
  }
  template <int BITS>
  static void dequant32(const Dq& d, const uint8_t* p, V& w0, V& w1) {
    if (BITS == 4) {
      for (int i = 0; i < L; ++i) {
        w0.v[i] = d.table[p[i] & 15];
        w1.v[i] = d.table[p[i] >> 4];
      }
    } else {
      for (int i = 0; i < L; ++i) {
        w0.v[i] = std::fma(float(p[i]), d.s, d.b);
        w1.v[i] = std::fma(float(p[i + L]), d.s, d.b);
      }
    }
  }
};

#if defined(__AVX512F__)
struct Avx512Isa {
  static constexpr int L = 16;
  using V = __m512;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  // A load kept in a register (not folded into each FMA): it feeds NB FMAs from one L1/L2 read.
  static V load_reg(const float* p) { V v = _mm512_loadu_ps(p); asm("" : "+v"(v)); return v; }
  static void store(float* p, V a) { _mm512_storeu_ps(p, a); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float reduce(const V& a) {  // fixed tree: 16 -> 8 -> 4 -> 2 -> 1
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
  }
  // 4 bits: a 16-entry table of fma(q, s, b) in one register, looked up by each nibble (vpermps
  // reads only an index's low 4 bits). 8 bits: widen, convert, fma.
  struct Dq { V a, b; };
  template <int BITS>
  static Dq dequantizer(float s, float b) {
    const V vs = _mm512_set1_ps(s), vb = _mm512_set1_ps(b);
    if (BITS == 4) {
      const V q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      return {_mm512_fmadd_ps(q, vs, vb), vb};
    }
    return {vs, vb};
  }
  template <int BITS>
  static void dequant32(const Dq& d, const uint8_t* p, V& w0, V& w1) {
    if (BITS == 4) {
      __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      w0 = _mm512_permutexvar_ps(bytes, d.a);
      w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), d.a);
    } else {
      __m512i q0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      __m512i q1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
      w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q0), d.a, d.b);
      w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q1), d.a, d.b);
    }
  }
};
#endif

#if defined(__AVX2__) && defined(__FMA__)
// 16 lanes as two 8-lane halves, so the 32-block layout (and x's order) is the AVX-512 one.
struct Avx2Isa {
  static constexpr int L = 16;
  struct V { __m256 a, b; };
  static V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static V load_reg(const float* p) { return load(p); }
  static void store(float* p, const V& v) { _mm256_storeu_ps(p, v.a); _mm256_storeu_ps(p + 8, v.b); }
  static V set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
  static V fma(const V& x, const V& y, const V& c) { return {_mm256_fmadd_ps(x.a, y.a, c.a), _mm256_fmadd_ps(x.b, y.b, c.b)}; }
  static float reduce(const V& v) {  // fixed tree: 16 -> 8 -> 4 -> 2 -> 1
    __m256 h = _mm256_add_ps(v.a, v.b);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
  }
  static __m256 widen8(const uint8_t* p) {  // 8 bytes -> 8 ints -> 8 floats
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  struct Dq { __m256 s, b; };
  template <int BITS>
  static Dq dequantizer(float s, float b) { return {_mm256_set1_ps(s), _mm256_set1_ps(b)}; }
  // Half h of dequant32 (h = 0: lanes 0-7 of w0 and w1, h = 1: lanes 8-15): the same values, for a
  // kernel that keeps each half's accumulators in registers of their own (qmm_kernel.h tile_avx2).
  template <int BITS>
  static void dequant16(const Dq& d, const uint8_t* p, int h, __m256& w0, __m256& w1) {
    if (BITS == 4) {
      __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * h)));
      w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(15))), d.s, d.b);
      w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), d.s, d.b);
    } else {
      w0 = _mm256_fmadd_ps(widen8(p + 8 * h), d.s, d.b);
      w1 = _mm256_fmadd_ps(widen8(p + 16 + 8 * h), d.s, d.b);
    }
  }
  template <int BITS>
  static void dequant32(const Dq& d, const uint8_t* p, V& w0, V& w1) {
    auto dq = [&](__m256i q) { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), d.s, d.b); };
    if (BITS == 4) {
      __m256i lo8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
      __m256i hi8 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
      const __m256i m = _mm256_set1_epi32(15);
      w0 = {dq(_mm256_and_si256(lo8, m)), dq(_mm256_and_si256(hi8, m))};
      w1 = {dq(_mm256_srli_epi32(lo8, 4)), dq(_mm256_srli_epi32(hi8, 4))};
    } else {
      w0 = {_mm256_fmadd_ps(widen8(p), d.s, d.b), _mm256_fmadd_ps(widen8(p + 8), d.s, d.b)};
      w1 = {_mm256_fmadd_ps(widen8(p + 16), d.s, d.b), _mm256_fmadd_ps(widen8(p + 24), d.s, d.b)};
    }
  }
};
#endif

}  // namespace mlxspec

#if defined(__ARM_NEON) && defined(__aarch64__)
#include "simd_neon.h"
#endif

namespace mlxspec {

inline bool isa_compiled(Isa isa) {
#if defined(__ARM_NEON) && defined(__aarch64__)
  if (isa == Isa::neon) return true;
#endif
#if defined(__AVX512F__)
  if (isa == Isa::avx512) return true;
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (isa == Isa::avx2) return true;
#endif
  return isa == Isa::generic;
}

inline Isa best_isa() {
#if defined(__ARM_NEON) && defined(__aarch64__)
  return Isa::neon;
#elif defined(__AVX512F__)
  return Isa::avx512;
#elif defined(__AVX2__) && defined(__FMA__)
  return Isa::avx2;
#else
  return Isa::generic;
#endif
}

}  // namespace mlxspec
