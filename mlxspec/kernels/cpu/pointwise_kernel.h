// The per-token ops between the matmuls, on fp32 rows: RMSNorm, rotary embedding, SwiGLU.
//
// MLX's CPU backend runs these as chains of generic ops (its rope is ~15 ops and ~50 us a call,
// its sigmoid ~10 ns an element): in a 135M-parameter model they cost more than the matmuls.
// Each function here is one pass over a row, defined as MLX defines the op (mlx/fast.cpp
// fallbacks, mlx-lm's swiglu); results agree to rounding (checked on first use, registry-style).
//
// Exactness rule, as for the matmul: a row's result depends only on that row (and, for rope, its
// position), computed the same way whatever the number of rows.
#pragma once

#include <cmath>

#include "scalar_math.h"

namespace mlxspec {

// 1 / sqrt(mean(x^2) + eps) over one row (MLX: rsqrt(mean(square(x)) + eps) in fp32).
inline float inv_rms(const float* x, int n, float eps) {
  float lanes[16] = {0};
  int i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += x[i + l] * x[i + l];
  for (int l = 0; i < n; ++i, ++l) lanes[l] += x[i] * x[i];
  for (int w = 8; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
  return 1.0f / std::sqrt(lanes[0] / float(n) + eps);
}

// One row of RMSNorm as MLX computes it: round(x * inv_rms) * w, where `round` casts to the output
// dtype (MLX casts before multiplying by the weight); the caller rounds the result once more.
template <class Round>
inline void rms_norm_row(const float* x, const float* w, int D, float eps, Round round, float* y) {
  const float inv = inv_rms(x, D, eps);
  for (int d = 0; d < D; ++d) y[d] = round(x[d] * inv) * w[d];
}

// cos/sin of position `pos` times each inverse frequency (MLX: theta = pos * inv_freq, fp32).
inline void rope_angles(float pos, const float* inv_freq, int half, float* c, float* s) {
  for (int i = 0; i < half; ++i) {
    float theta = pos * inv_freq[i];
    c[i] = std::cos(theta);
    s[i] = std::sin(theta);
  }
}

// rope_angles, then cos and sin cast to the output dtype (as MLX's fallback does).
template <class Round>
inline void rope_angles_rounded(float pos, const float* inv_freq, int half, Round round, float* c, float* s) {
  rope_angles(pos, inv_freq, half, c, s);
  for (int k = 0; k < half; ++k) c[k] = round(c[k]), s[k] = round(s[k]);
}

// One row of D features rotated in its first `dims`: pairs (2i, 2i+1) when traditional, else
// (i, i + dims/2); the rest is copied. y1 = x1 c - x2 s, y2 = x1 s + x2 c.
inline void rope_row(const float* x, float* y, int D, int dims, bool traditional, const float* c, const float* s) {
  const int half = dims / 2;
  const int step = traditional ? 2 : 1, other = traditional ? 1 : half;
  for (int i = 0; i < half; ++i) {
    const int a = i * step, b = a + other;
    const float x1 = x[a], x2 = x[b];
    y[a] = x1 * c[i] - x2 * s[i];
    y[b] = x1 * s[i] + x2 * c[i];
  }
  for (int d = dims; d < D; ++d) y[d] = x[d];
}

// sigmoid(z) from exp(-|z|) <= 1, so nothing overflows: (z >= 0 ? 1 : e) / (1 + e)
inline float sigmoid_of(float z) {
  const float e = exp_nonpositive(-std::fabs(z));
  return (z >= 0.0f ? 1.0f : e) / (1.0f + e);
}
#if defined(__AVX2__) && defined(__FMA__)
inline __m256 sigmoid_of(__m256 z) {  // the scalar one, op for op on 8 lanes
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = exp_nonpositive(_mm256_or_ps(z, _mm256_set1_ps(-0.0f)));  // -|z|
  const __m256 num = _mm256_blendv_ps(e, one, _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_GE_OQ));
  return _mm256_div_ps(num, _mm256_add_ps(one, e));
}
#endif

// y = silu(g) * u = g * sigmoid(g) * u
inline void swiglu_span(const float* g, const float* u, float* y, int n) {
  int i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_loadu_ps(g + i);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(a, sigmoid_of(a)), _mm256_loadu_ps(u + i)));
  }
#endif
  for (; i < n; ++i) y[i] = (g[i] * sigmoid_of(g[i])) * u[i];
}

// y = gelu_approx(g) * u: 0.5 g (1 + tanh(z)) with z = sqrt(2 / pi) (g + 0.044715 g^3) is g sigmoid(2 z),
// 2 z = g (K1 + K2 g^2) (no tanh to approximate).
inline void geglu_span(const float* g, const float* u, float* y, int n) {
  constexpr float K1 = 1.5957691216057308f, K2 = 0.0713548162726009f;  // 2 sqrt(2 / pi), that x 0.044715
  int i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 k1 = _mm256_set1_ps(K1), k2 = _mm256_set1_ps(K2);
  for (; i + 8 <= n; i += 8) {  // the scalar loop below, op for op on 8 lanes
    const __m256 a = _mm256_loadu_ps(g + i);
    const __m256 z = _mm256_mul_ps(a, _mm256_fmadd_ps(k2, _mm256_mul_ps(a, a), k1));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(a, sigmoid_of(z)), _mm256_loadu_ps(u + i)));
  }
#endif
  for (; i < n; ++i) {
    const float a = g[i], z = a * std::fma(K2, a * a, K1);
    y[i] = (a * sigmoid_of(z)) * u[i];
  }
}

}  // namespace mlxspec
