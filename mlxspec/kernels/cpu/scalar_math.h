// Float helpers shared by the CPU kernels: a fixed-order sum and exp for x <= 0, scalar and over
// spans. GCC does not vectorise std::nearbyint, so the spans have AVX2 bodies written out (AVX-512
// machines run them too): the same IEEE operations in the same order per element, so every lane
// equals the scalar (isa_check.cpp compares them).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace mlxspec {

// exp(x) for x <= 0 (scores minus their max): Cody-Waite reduction and a degree-6 polynomial,
// within 2 ulp of std::exp; the same code for every row keeps rows exact.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);  // exp(-87) ~ 1.6e-38: the smallest normal float, and weights below it vanish
  float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(n, -0.693145751953125f, x);
  r = std::fma(n, -1.428606765330187045e-06f, r);
  float p = 1.0f / 720;
  p = std::fma(p, r, 1.0f / 120);
  p = std::fma(p, r, 1.0f / 24);
  p = std::fma(p, r, 1.0f / 6);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  uint32_t bits = uint32_t(int32_t(n) + 127) << 23;  // 2^n, n in [-126, 0]
  float two_n;
  std::memcpy(&two_n, &bits, 4);
  return p * two_n;
}

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 exp_nonpositive(__m256 x) {  // exp_nonpositive on 8 lanes, op for op
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693145751953125f), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
#endif

// s[t] = exp_nonpositive(s[t] - m) for t < n (softmax numerators).
inline void exp_shifted_span(float* s, float m, int n) {
  int t = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; t + 8 <= n; t += 8)
    _mm256_storeu_ps(s + t, exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + t), _mm256_set1_ps(m))));
#endif
  for (; t < n; ++t) s[t] = exp_nonpositive(s[t] - m);
}

// Sum of n floats in a fixed order (16 lanes, then the lanes pairwise).
// The loop `m = m < a[i] ? a[i] : m` over a[0..n) (NaNs never win), 8 lanes at a time where AVX2
// is compiled (a scalar chain of maxes was 7% of a long-context attention). A max is exact and its
// order only decides between +0 and -0, which exp_nonpositive(s - m) maps to the same values.
inline float max_span(const float* a, int n, float m) {
  int i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (n >= 8) {
    __m256 v = _mm256_set1_ps(m);
    for (; i + 8 <= n; i += 8) v = _mm256_max_ps(_mm256_loadu_ps(a + i), v);  // lane: a > v ? a : v
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    for (float x : lanes) m = m < x ? x : m;
  }
#endif
  for (; i < n; ++i) m = m < a[i] ? a[i] : m;
  return m;
}

inline float sum16(const float* a, int n) {
  float lanes[16] = {0};
  int i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += a[i + l];
  for (int l = 0; i < n; ++i, ++l) lanes[l] += a[i];
  for (int w = 8; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
  return lanes[0];
}

}  // namespace mlxspec
