// Stand-ins for the Metal and CUDA builtins our GPU kernels use, so the source MLX would generate
// compiles as C++ and runs on the CPU: every lane of a threadgroup is a fiber of one thread, and cross-lane operations meet: each lane runs until its next meeting, then the next lane
// runs (round robin), so a meeting completes when every lane reached it. A lane operation reads its
// own warp's slots; `__syncthreads()` waits for every lane of the threadgroup, and `__shared__`
// arrays are statics (one threadgroup runs at a time). Lanes that leave while their warp's other
// lanes still meet would deadlock a GPU: the emulator aborts. Only what mlxspec's kernels need; not
// a general emulator.
#pragma once

#include <ucontext.h>
#if defined(__SANITIZE_ADDRESS__)  // the tests may build under -fsanitize=address: fiber stacks are reused
#include <sanitizer/asan_interface.h>
#define EMU_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
// the fibers' stacks are the emulator's own (no fake stacks); the harnesses free nothing at exit
extern "C" __attribute__((used)) inline const char* __asan_default_options() { return "detect_leaks=0:detect_stack_use_after_return=0"; }
#else
#define EMU_UNPOISON(p, n) ((void)0)
#endif

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>  // system headers before `#define constant` / `device` below
#include <functional>
#include <string>
#include <thread>
#include <vector>

struct dim3 { unsigned x, y, z; };
inline dim3 threadIdx, blockIdx, blockDim;  // CUDA builtins: saved and restored per lane fiber

namespace emu {
constexpr int kLanes = 32, kMaxWarps = 8;
constexpr size_t kStack = 256 * 1024;
struct Lanes {
  float values[kLanes];
  int ivalues[kLanes];  // integer exchanges (the fused acceptance kernel's argmin / argmax)
  uint32_t words[kLanes][6];  // a matrix op's operands, every register of every lane in one meeting
};
inline Lanes* lanes = nullptr;  // the running lane's warp's slots
inline int lane = 0, fiber = 0;  // lane within its warp; fiber = warp * 32 + lane
inline int fiber_count = kLanes;
inline const std::function<void(int)>* task = nullptr;
inline int arrived = 0, generation = 0;  // __syncthreads()

#if defined(__x86_64__) && defined(__ELF__) && !defined(EMU_UCONTEXT)  // EMU_UCONTEXT: the portable path
// A fiber switch without ucontext's signal-mask system calls (~450 ns a round trip here, most of an
// emulated kernel's time): push the callee-saved registers, swap stack pointers, pop, return.
// One translation unit per emulated program, so the symbol is defined once.
extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .pushsection .text
  .globl emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
  .popsection
)");
struct Context {
  void* sp = nullptr;
};
inline Context scheduler;
inline void switch_to(Context& from, Context& to) { emu_switch(&from.sp, to.sp); }
[[noreturn]] inline void fiber_main();
// A fresh stack whose first switch "returns" into fiber_main with the call ABI's alignment.
inline void prepare(Context& c, char* stack, size_t size) {
  auto* top = reinterpret_cast<void**>(reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t(15));
  top[-2] = reinterpret_cast<void*>(&fiber_main);  // at a 16-aligned slot: rsp % 16 == 8 on entry
  for (int r = 3; r <= 8; ++r) top[-r] = nullptr;  // rbp, rbx, r12-r15
  c.sp = top - 8;
}
#else
struct Context {
  ucontext_t uc;
};
inline Context scheduler;
inline void switch_to(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
[[noreturn]] inline void fiber_main();
inline void prepare(Context& c, char* stack, size_t size) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;  // fiber_main never returns
  makecontext(&c.uc, (void (*)())fiber_main, 0);
}
#endif

struct Fiber {
  Context ctx;
  dim3 tid{}, bid{}, bdim{};
  bool done = false;
};
inline Fiber fibers[kLanes * kMaxWarps];

inline void meet() { switch_to(fibers[fiber].ctx, scheduler); }  // back to the scheduler
// Every fiber starts here (as the scheduler set `fiber`), runs its lane and yields for good.
[[noreturn]] inline void fiber_main() {
  const int f = fiber;
  (*task)(f);
  fibers[f].done = true;
  for (;;) switch_to(fibers[f].ctx, scheduler);  // never resumed once done
}

// Every lane of the threadgroup reaches this before any goes on; all leave in the same round.
inline void barrier() {
  const int gen = generation;
  if (++arrived == fiber_count) arrived = 0, ++generation;
  do meet(); while (generation == gen);
}

// Run fn(f) for `warps` warps of 32 lanes (f = warp * 32 + lane): one threadgroup.
inline void run_threads(int warps, const std::function<void(int)>& fn) {
  if (warps < 1 || warps > kMaxWarps) std::abort();
  static std::vector<char> stacks(kStack * kLanes * kMaxWarps);
  static Lanes group[kMaxWarps];
  task = &fn;
  fiber_count = warps * kLanes;
  arrived = 0;
  for (int l = 0; l < fiber_count; ++l) {
    Fiber& f = fibers[l];
    f = Fiber{};
    EMU_UNPOISON(stacks.data() + kStack * l, kStack);  // under ASan: earlier fibers' frames left redzones there
    prepare(f.ctx, stacks.data() + kStack * l, kStack);
  }
  for (;;) {  // one round: every unfinished lane runs to its next meeting (or its end)
    int left = 0, met[kMaxWarps] = {}, ended[kMaxWarps] = {};
    for (int l = 0; l < fiber_count; ++l) {
      Fiber& f = fibers[l];
      if (f.done) continue;
      ++left;
      fiber = l, lane = l % kLanes, lanes = &group[l / kLanes];
      threadIdx = f.tid, blockIdx = f.bid, blockDim = f.bdim;
      switch_to(scheduler, f.ctx);
      f.tid = threadIdx, f.bid = blockIdx, f.bdim = blockDim;
      ++(f.done ? ended[l / kLanes] : met[l / kLanes]);  // not (f.done ? ended : met)[w]: GCC 12 under UBSan
      // shift checks took the warp from a stale register there (a lane's index from an earlier round)
    }
    if (left == 0) break;
    for (int w = 0; w < warps; ++w)
      if (met[w] && ended[w]) {
        std::fprintf(stderr, "emulator: %d lanes left while %d lanes wait at a lane operation\n", ended[w], met[w]);
        std::abort();
      }
    if (arrived) {  // lanes wait at the barrier: every other lane must still be running
      for (int l = 0; l < fiber_count; ++l)
        if (fibers[l].done) {
          std::fprintf(stderr, "emulator: a lane left while others wait at __syncthreads()\n");
          std::abort();
        }
    }
  }
}

// Run fn(l) for the 32 lanes of one warp.
inline void run_warp(const std::function<void(int)>& fn) { run_threads(1, fn); }

// Every lane publishes v, then reads lane `src`'s value.
template <typename V> V exchange_in(V* slots, V v, int src) {
  slots[lane] = v;
  meet();
  V r = slots[src];
  meet();
  return r;
}
inline float exchange(float v, int src) { return exchange_in(lanes->values, v, src); }
inline int exchange(int v, int src) { return exchange_in(lanes->ivalues, v, src); }

// Every lane publishes v, then reads all 32 values: one meeting for a whole reduction.
template <typename V> std::array<V, kLanes> gather_in(V* slots, V v) {
  slots[lane] = v;
  meet();
  std::array<V, kLanes> all;
  std::memcpy(all.data(), slots, sizeof(V) * kLanes);
  meet();
  return all;
}
inline std::array<float, kLanes> gather(float v) { return gather_in(lanes->values, v); }
inline std::array<int, kLanes> gather(int v) { return gather_in(lanes->ivalues, v); }

// Run fn(lane, column) for 32 lanes per column, one simdgroup at a time.
inline void run_columns(int columns, const std::function<void(int, int)>& fn) {
  for (int n = 0; n < columns; ++n) run_warp([&](int l) { fn(l, n); });
}

// Run fn(lane, y, z) for 32 lanes per (y, z) warp, one warp at a time: our kernels share nothing
// between warps (no threadgroup memory, no barriers), so any order of warps is a valid schedule.
inline void run_grid(int ys, int zs, const std::function<void(int, int, int)>& fn) {
  for (int z = 0; z < zs; ++z)
    run_columns(ys, [&](int l, int y) { fn(l, y, z); });
}

// Run fn(lane, warp, y, z) for `warps` warps per (y, z) threadgroup, one threadgroup at a time
// (kernels that share threadgroup memory: they set threadIdx.y = warp, blockIdx = (0, y, z)).
inline void run_blocks(int ys, int zs, int warps, const std::function<void(int, int, int, int)>& fn) {
  for (int z = 0; z < zs; ++z)
    for (int y = 0; y < ys; ++y) run_threads(warps, [&](int f) { fn(f % kLanes, f / kLanes, y, z); });
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

struct alignas(16) uint4 { uint32_t x, y, z, w; };  // Metal's and CUDA's 16-byte vector (the qmm kernel's loads)
struct alignas(8) uint2 { uint32_t x, y; };  // CUDA's 8-byte vector (the qmm kernel's x loads)

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
inline float ldexp(float a, int e) { return std::ldexp(a, e); }
namespace precise {
inline float tanh(float a) { return std::tanh(a); }
}
}
inline float simd_sum(float v) {  // fixed order: lane 0 + lane 1 + ... + lane 31 (one meeting, not 32)
  float s = 0.0f;
  for (float w : emu::gather(v)) s += w;
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
inline float simd_shuffle_xor(float v, unsigned short mask) { return emu::exchange(v, emu::lane ^ int(mask)); }
inline float simd_prefix_exclusive_sum(float v) {  // lane 0 + ... + lane (l - 1), in that order
  const auto all = emu::gather(v);
  float s = 0.0f;
  for (int i = 0; i < emu::lane; ++i) s += all[i];
  return s;
}

// Threadgroup memory and barriers (one threadgroup runs at a time, as for CUDA's __shared__)
#define threadgroup static
#define thread  // Metal's address space of a function's own pointers
enum class mem_flags { mem_none, mem_device, mem_threadgroup };
inline void threadgroup_barrier(mem_flags) { emu::barrier(); }

// simdgroup_matrix<float, 8, 8>: lane l holds elements (fm, fn) and (fm, fn + 1), the layout MLX's
// steel/gemm/mma.h relies on (BaseMMAFrag::get_coord). simdgroup_multiply_accumulate gives each
// output C + its 8 products in k order (the hardware's order may differ; each output depends only on
// its own row of A, column of B and element of C, as on the hardware).
template <typename T, int Cols, int Rows> struct simdgroup_matrix {
  struct Elements {
    T v[2];
    T& operator[](int i) { return v[i]; }
  } elements;
  Elements& thread_elements() { return elements; }
};
namespace emu {
inline void frag_coord(int l, int& fm, int& fn) {
  const int qid = l / 4;
  fm = (qid & 4) + (l / 2) % 4;
  fn = (qid & 2) * 2 + (l % 2) * 2;
}
// The lane holding element (r, c) of an 8 x 8 matrix, and which of its two: the inverse of frag_coord
inline void frag_owner(int r, int c, int& l, int& e) {
  for (l = 0; l < kLanes; ++l) {
    int fm, fn;
    frag_coord(l, fm, fn);
    if (fm == r && (c == fn || c == fn + 1)) {
      e = c - fn;
      return;
    }
  }
  std::abort();
}
}  // namespace emu
// Every lane publishes its 6 elements (A, B, C) in one meeting and reads the others' it needs: the same sums as
// gathering each matrix whole, in a sixth of the fiber switches
inline void simdgroup_multiply_accumulate(simdgroup_matrix<float, 8, 8>& d, const simdgroup_matrix<float, 8, 8>& a,
                                          const simdgroup_matrix<float, 8, 8>& b, const simdgroup_matrix<float, 8, 8>& c) {
  static const auto owner = [] {  // (r, c) -> lane * 2 + element
    std::array<std::array<int, 8>, 8> o{};
    for (int r = 0; r < 8; ++r)
      for (int col = 0; col < 8; ++col) {
        int l, e;
        emu::frag_owner(r, col, l, e);
        o[r][col] = 2 * l + e;
      }
    return o;
  }();
  const float mine[6] = {a.elements.v[0], a.elements.v[1], b.elements.v[0], b.elements.v[1], c.elements.v[0], c.elements.v[1]};
  std::memcpy(emu::lanes->words[emu::lane], mine, sizeof(mine));
  emu::meet();
  const auto at = [](int matrix, int r, int col) {  // element (r, col) of operand `matrix` (0 A, 1 B, 2 C)
    const int o = owner[r][col];
    float v;
    std::memcpy(&v, &emu::lanes->words[o / 2][2 * matrix + o % 2], 4);
    return v;
  };
  int fm, fn;
  emu::frag_coord(emu::lane, fm, fn);
  float out[2];
  for (int e = 0; e < 2; ++e) {
    float sum = at(2, fm, fn + e);
    for (int k = 0; k < 8; ++k) sum = std::fma(at(0, fm, k), at(1, k, fn + e), sum);
    out[e] = sum;
  }
  emu::meet();  // every lane has read before any publishes its next operands
  d.elements.v[0] = out[0], d.elements.v[1] = out[1];
}

// ---- CUDA
#define MLXSPEC_EMULATOR  // sources swap inline PTX for the stand-ins below
#define __global__
#define __device__
#define __grid_constant__
#define __shared__ static  // one threadgroup runs at a time
inline void __syncthreads() { emu::barrier(); }
using __half = _Float16;
using __nv_bfloat16 = emu::bf16;
using Shape = std::array<int32_t, 8>;
using Strides = std::array<int64_t, 8>;
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {  // byte n of the result: byte s[n] of (y:x)
  const uint64_t v = (uint64_t(y) << 32) | x;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) r |= uint32_t((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFFu) << (8 * n);
  return r;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __shfl_xor_sync(unsigned, float v, int offset) { return emu::exchange(v, emu::lane ^ offset); }
inline int __shfl_xor_sync(unsigned, int v, int offset) { return emu::exchange(v, emu::lane ^ offset); }
inline float __shfl_sync(unsigned, float v, int src) { return emu::exchange(v, src); }
inline float __shfl_up_sync(unsigned, float v, int delta) {  // lanes below delta keep their own value
  return emu::exchange(v, emu::lane >= delta ? emu::lane - delta : emu::lane);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: the PTX ISA's fragment layout (lane = 4 g + t):
// A a0 (row g, k 2t, 2t+1), a1 (row g+8, same k), a2 (row g, k 2t+8, 2t+9), a3 (row g+8, those k);
// B b0 (k 2t, 2t+1; column g), b1 (k 2t+8, 2t+9; column g); C/D (row g | g+8, column 2t | 2t+1).
// Each output is C + the 16 products added in k order (the hardware's order differs; each output
// depends only on its own row of A and column of B, as on the hardware).
namespace emu {
template <typename H> float half_at(uint32_t pair, int i) {
  H h[2];
  std::memcpy(h, &pair, 4);
  return float(h[i]);
}
template <typename H> void mma_16816(float* d, const uint32_t* a, const uint32_t* b) {
  // every lane publishes its 6 registers in one meeting and reads the 16 pairs of A and of B its 4 outputs need
  std::memcpy(lanes->words[lane], a, 16);
  std::memcpy(lanes->words[lane] + 4, b, 8);
  meet();
  const int g = lane / 4, t = lane % 4;
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float sum = 0.0f;
    for (int k = 0; k < 16; ++k) {  // A (row, k): a0..a3 of lane 4 (row % 8) + k % 8 / 2; B (k, col): b0 / b1 of lane 4 col + k % 8 / 2
      const int holder = k % 8 / 2, hi = k / 8;
      const uint32_t aw = lanes->words[4 * (row % 8) + holder][row / 8 + 2 * hi];
      const uint32_t bw = lanes->words[4 * col + holder][4 + hi];
      sum = std::fma(half_at<H>(aw, k % 2), half_at<H>(bw, k % 2), sum);
    }
    out[i] = sum;
  }
  meet();  // every lane has read before any publishes its next operands
  for (int i = 0; i < 4; ++i) d[i] += out[i];
}
}  // namespace emu
inline void mma_16816(float* d, const uint32_t* a, const uint32_t* b, __half) { emu::mma_16816<__half>(d, a, b); }
inline void mma_16816(float* d, const uint32_t* a, const uint32_t* b, __nv_bfloat16) {
  emu::mma_16816<__nv_bfloat16>(d, a, b);
}
