// Scalar float helpers shared by the CPU kernels: a fixed-order sum and exp for x <= 0.
// Written branch-free on plain floats so GCC vectorises loops over them (-O3 -march=native).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace mlxspec {

// exp(x) for x <= 0 (scores minus their max): Cody-Waite reduction and a degree-6 polynomial,
// within 2 ulp of std::exp; the same code for every row keeps rows exact. Branch-free, so loops
// over it vectorise.
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

// Sum of n floats in a fixed order (16 lanes, then the lanes pairwise).
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
