// Stand-ins for the Metal and CUDA builtins our GPU kernel uses, so the source MLX would generate
// compiles as C++ and runs on the CPU: every lane of a simdgroup/warp is a thread, and cross-lane
// operations meet at a barrier. Only what mlxspec's kernels need; not a general emulator.
#pragma once

#include <array>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace emu {
constexpr int kLanes = 32;
struct Lanes {
  std::barrier<> meet{kLanes};
  float values[kLanes];
  int ivalues[kLanes];  // integer exchanges (the fused acceptance kernel's argmin / argmax)
};
inline thread_local Lanes* lanes = nullptr;
inline thread_local int lane = 0;

// Every lane publishes v, then reads lane `src(lane)`'s value.
inline float exchange(float v, int src) {
  lanes->values[lane] = v;
  lanes->meet.arrive_and_wait();
  float r = lanes->values[src];
  lanes->meet.arrive_and_wait();
  return r;
}

inline int exchange(int v, int src) {
  lanes->ivalues[lane] = v;
  lanes->meet.arrive_and_wait();
  int r = lanes->ivalues[src];
  lanes->meet.arrive_and_wait();
  return r;
}

// Every lane publishes v, then reads all 32 values: one meeting for a whole reduction.
inline std::array<float, kLanes> gather(float v) {
  lanes->values[lane] = v;
  lanes->meet.arrive_and_wait();
  std::array<float, kLanes> all;
  std::memcpy(all.data(), lanes->values, sizeof(lanes->values));
  lanes->meet.arrive_and_wait();
  return all;
}
inline std::array<int, kLanes> gather(int v) {
  lanes->ivalues[lane] = v;
  lanes->meet.arrive_and_wait();
  std::array<int, kLanes> all;
  std::memcpy(all.data(), lanes->ivalues, sizeof(lanes->ivalues));
  lanes->meet.arrive_and_wait();
  return all;
}

// Run fn(lane, column) for 32 lanes per column, one simdgroup at a time.
inline void run_columns(int columns, const std::function<void(int, int)>& fn) {
  for (int n = 0; n < columns; ++n) {
    Lanes group;
    std::vector<std::thread> threads;
    for (int l = 0; l < kLanes; ++l)
      threads.emplace_back([&, l] { lanes = &group; lane = l; fn(l, n); });
    for (auto& t : threads) t.join();
  }
}

// Run fn(lane, y, z) for 32 lanes per (y, z) warp, one warp at a time: our kernels share nothing
// between warps (no threadgroup memory, no barriers), so any order of warps is a valid schedule.
inline void run_grid(int ys, int zs, const std::function<void(int, int, int)>& fn) {
  for (int z = 0; z < zs; ++z)
    run_columns(ys, [&](int l, int y) { fn(l, y, z); });
}

struct bf16 {  // storage-only bfloat16, round-to-nearest-even from float
  uint16_t bits;
  bf16() = default;
  bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bits = uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  }
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
}  // namespace emu

struct uint4 { uint32_t x, y, z, w; };  // Metal's and CUDA's 16-byte vector (the qmm kernel's loads)

// ---- Metal
#define device
#define constant
struct uint3 { unsigned x, y, z; };
using ushort = unsigned short;
using float16_t = _Float16;
using bfloat16_t = emu::bf16;
namespace metal {
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline float exp(float a) { return std::exp(a); }
}
inline float simd_sum(float v) {  // fixed order: lane 0 + lane 1 + ... + lane 31
  float s = 0.0f;
  for (int i = 0; i < emu::kLanes; ++i) s += emu::exchange(v, i);
  return s;
}

// Reductions every lane must reach, like the hardware's (the fused acceptance kernel's).
inline float simd_max(float v) {
  float m = v;
  for (float w : emu::gather(v)) m = w > m ? w : m;
  return m;
}
inline int simd_max(int v) {
  int m = v;
  for (int w : emu::gather(v)) m = w > m ? w : m;
  return m;
}
inline int simd_min(int v) {
  int m = v;
  for (int w : emu::gather(v)) m = w < m ? w : m;
  return m;
}
inline float simd_shuffle(float v, unsigned short src) { return emu::exchange(v, int(src)); }
inline float simd_prefix_exclusive_sum(float v) {  // lane 0 + ... + lane (l - 1), in that order
  const auto all = emu::gather(v);
  float s = 0.0f;
  for (int i = 0; i < emu::lane; ++i) s += all[i];
  return s;
}

// ---- CUDA
#define __global__
#define __device__
#define __grid_constant__
struct dim3 { unsigned x, y, z; };
inline thread_local dim3 threadIdx, blockIdx, blockDim;
using __half = _Float16;
using __nv_bfloat16 = emu::bf16;
using Shape = std::array<int32_t, 8>;
using Strides = std::array<int64_t, 8>;
inline float __shfl_xor_sync(unsigned, float v, int offset) { return emu::exchange(v, emu::lane ^ offset); }
inline int __shfl_xor_sync(unsigned, int v, int offset) { return emu::exchange(v, emu::lane ^ offset); }
inline float __shfl_sync(unsigned, float v, int src) { return emu::exchange(v, src); }
inline float __shfl_up_sync(unsigned, float v, int delta) {  // lanes below delta keep their own value
  return emu::exchange(v, emu::lane >= delta ? emu::lane - delta : emu::lane);
}
