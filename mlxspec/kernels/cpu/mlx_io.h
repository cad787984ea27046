// Moving MLX arrays in and out of the kernels' fp32 rows (any strides in, contiguous out).
#pragma once

#include <algorithm>
#include <cstdint>

#include "mlx/array.h"
#include "simd.h"

namespace mlxspec {

namespace mx = mlx::core;

// Element offset of row r of `a` seen as (rows, last dim), through its strides.
inline int64_t row_offset(const mx::array& a, int64_t r) {
  int64_t off = 0;
  for (int ax = int(a.ndim()) - 2; ax >= 0; --ax) {
    int64_t n = a.shape(ax);
    off += (r % n) * a.strides()[ax];
    r /= n;
  }
  return off;
}

inline SType stype(mx::Dtype d) { return d == mx::float32 ? SType::f32 : (d == mx::float16 ? SType::f16 : SType::bf16); }

// Row r of a float32/float16/bfloat16 array -> n fp32 values.
inline void row_to_f32(const mx::array& a, int64_t r, float* out) {
  const int n = a.shape(-1);
  const int64_t off = row_offset(a, r), s = n > 1 ? a.strides().back() : 1;
  if (s == 1) {  // contiguous row: the vectorised conversion
    load_floats(static_cast<const void*>(a.data<uint8_t>()), size_t(off), n, stype(a.dtype()), out);
    return;
  }
  if (a.dtype() == mx::float32) {
    const float* p = a.data<float>() + off;
    for (int i = 0; i < n; ++i) out[i] = p[i * s];
    return;
  }
  const uint16_t* p = a.data<uint16_t>() + off;
  if (a.dtype() == mx::float16)
    for (int i = 0; i < n; ++i) out[i] = half_to_float(p[i * s]);
  else
    for (int i = 0; i < n; ++i) out[i] = bf16_to_float(p[i * s]);
}

// n fp32 values -> out's elements [i, i + n) in out's dtype (round to nearest even).
inline void store_f32(const float* y, size_t n, mx::array& out, size_t i = 0) {
  store_floats(y, int(n), stype(out.dtype()), out.data<uint8_t>() + i * out.itemsize());
}

// x rounded to dtype t and back (what storing an intermediate in t does to it).
inline float round_to(float x, mx::Dtype t) {
  if (t == mx::float16) return float(mx::float16_t(x));
  if (t == mx::bfloat16) return float(mx::bfloat16_t(x));
  return x;
}

}  // namespace mlxspec
