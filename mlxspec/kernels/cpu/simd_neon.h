// NEON lanes (arm64: Apple Silicon's CPU cores): the 16-lane vector as four float32x4_t quarters,
// so the 32-weight block layout, x's order and the reduction tree are those of the other ISAs
// and results are bit-identical to them (tests/kernels/test_neon.py runs this under qemu).
#pragma once

#include <arm_neon.h>

#include <cstdint>

namespace mlxspec {

struct NeonIsa {
  static constexpr int L = 16;
  struct V { float32x4_t q[4]; };
  static V zero() { V r; for (auto& q : r.q) q = vdupq_n_f32(0.0f); return r; }
  static V load(const float* p) { return {{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}}; }
  static V load_reg(const float* p) { return load(p); }
  static void store(float* p, const V& a) { for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, a.q[i]); }
  static V set1(float x) { V r; for (auto& q : r.q) q = vdupq_n_f32(x); return r; }
  static V fma(const V& a, const V& b, V c) {  // c + a * b, fused
    for (int i = 0; i < 4; ++i) c.q[i] = vfmaq_f32(c.q[i], a.q[i], b.q[i]);
    return c;
  }
  static float reduce(const V& a) {  // the fixed tree: 16 -> 8 -> 4 -> 2 -> 1
    float32x4_t h0 = vaddq_f32(a.q[0], a.q[2]), h1 = vaddq_f32(a.q[1], a.q[3]);
    float32x4_t q = vaddq_f32(h0, h1);
    float32x2_t d = vadd_f32(vget_low_f32(q), vget_high_f32(q));
    return vget_lane_f32(d, 0) + vget_lane_f32(d, 1);
  }

  struct Dq { float32x4_t s, b; };
  template <int BITS>
  static Dq dequantizer(float s, float b) { return {vdupq_n_f32(s), vdupq_n_f32(b)}; }
  // 16 bytes -> 16 lanes: widen to u32, convert, fma(q, s, b) (the value every ISA computes)
  static V dq16(uint8x16_t bytes, const Dq& d) {
    uint16x8_t lo = vmovl_u8(vget_low_u8(bytes)), hi = vmovl_u8(vget_high_u8(bytes));
    uint32x4_t u[4] = {vmovl_u16(vget_low_u16(lo)), vmovl_u16(vget_high_u16(lo)),
                       vmovl_u16(vget_low_u16(hi)), vmovl_u16(vget_high_u16(hi))};
    V r;
    for (int i = 0; i < 4; ++i) r.q[i] = vfmaq_f32(d.b, vcvtq_f32_u32(u[i]), d.s);
    return r;
  }
  template <int BITS>
  static void dequant32(const Dq& d, const uint8_t* p, V& w0, V& w1) {
    if (BITS == 4) {  // low nibbles (even elements), then high nibbles (odd ones)
      uint8x16_t bytes = vld1q_u8(p);
      w0 = dq16(vandq_u8(bytes, vdupq_n_u8(15)), d);
      w1 = dq16(vshrq_n_u8(bytes, 4), d);
    } else {
      w0 = dq16(vld1q_u8(p), d);
      w1 = dq16(vld1q_u8(p + 16), d);
    }
  }
};

}  // namespace mlxspec
