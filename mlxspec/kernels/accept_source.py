"""Fused acceptance kernels' source, shared by Metal (`mx.fast.metal_kernel`) and CUDA (`mx.fast.cuda_kernel`).

One simdgroup / warp of 32 lanes does a whole round, so the host reads back one (2,) int32 = [n, next]:

    greedy:    inputs logits (k+1, V) T, drafts (k,) uint32
    rejection: inputs p (k+1, V) T, q (k, V) T, drafts (k,) uint32, u (k+1,) float32
    grid (32, 1, 1), threadgroup (32, 1, 1); template T (logits / probabilities dtype)

k is read from the rows of logits / p, never from drafts, so k = 0 can pass a one-element dummy for
drafts and q. Definitions (mlxspec/verify.py stays the reference):
- greedy: n = leading run of drafts[i] == argmax(logits[i]) (first index of the max, as mx.argmax;
  NaN is never picked), next = argmax(logits[n]).
- rejection: n = leading run of u[i] * q[i, d_i] < p[i, d_i] (the reference's exact comparison);
  next = inverse CDF at u[k] of max(0, p_n - q_n) (of p_n when that has no mass, of p_k when n = k).
  Lane l owns the contiguous chunk [l*C, (l+1)*C) of the vocabulary, so chunk sums plus an exclusive
  lane prefix give every lane its CDF offset; tokens with zero mass are never drawn.

`metal_source` / `cuda_source` rebuild the program as MLX generates it (same scheme as gpu_source.py)
so tests can compile and run it on the CPU under tests/kernels/emulator/gpu_emulator.h.
"""

from __future__ import annotations

import mlx.core as mx

from .gpu_source import (
    _CUDA_TYPES,
    _METAL_TYPES,
    CUDA_NAMESPACE,
    CUDA_PREAMBLE,
    cuda_params,
    metal_input_names,
    metal_params,
)

GREEDY = "greedy"
REJECTION = "rejection"
NAMES = {GREEDY: "mlxspec_accept_greedy", REJECTION: "mlxspec_accept_rejection"}
INPUTS = {GREEDY: ["logits", "drafts"], REJECTION: ["p", "q", "drafts", "u"]}
OUTPUTS = ["out"]
GRID = (32, 1, 1)
THREADGROUP = (32, 1, 1)

GREEDY_CORE = """
  const int V = logits_shape[1];
  const int K = logits_shape[0] - 1;
  int n = 0, best = 0;
  for (;;) {  // argmax of row n; stop at the first draft that differs (uniform over the lanes)
    const int row = n * V;
    float top = float(logits[row]);  // every lane starts from element 0, so no lane is empty
    int idx = 0;
    for (int j = lane; j < V; j += 32) {
      const float x = float(logits[row + j]);
      if (x > top) { top = x; idx = j; }  // strict: the first index of the lane's max
    }
    const float all_top = lane_max(top);
    best = lane_min_int(top == all_top ? idx : V);  // first index of the max over all lanes
    if (n == K || uint32_t(best) != drafts[n]) break;
    ++n;
  }
  if (lane == 0) { out[0] = n; out[1] = best; }
"""

REJECTION_CORE = """
  const int V = p_shape[1];
  const int K = p_shape[0] - 1;
  int n = 0;  // every lane walks the few drafts itself: all agree without talking
  while (n < K && drafts[n] < uint32_t(V) && u[n] * float(q[n * V + drafts[n]]) < float(p[n * V + drafts[n]])) ++n;
  const int row = n * V;
  bool residual = n < K;  // rejected at n: draw from max(0, p_n - q_n); all kept: from p_k
#define MASS(j) (residual ? MAX0(float(p[row + (j)]) - float(q[row + (j)])) : float(p[row + (j)]))
  const int C = (V + 31) / 32;
  const int lo = lane * C < V ? lane * C : V;
  const int hi = lo + C < V ? lo + C : V;
  float chunk = 0.0f;
  for (int j = lo; j < hi; ++j) chunk += MASS(j);
  if (residual && !(lane_sum(chunk) > 0.0f)) {  // p_n == q_n leaves no residual: p_n is the fallback
    residual = false;
    chunk = 0.0f;
    for (int j = lo; j < hi; ++j) chunk += MASS(j);
  }
  const float target = u[K] * lane_sum(chunk);  // inverse CDF without normalising
  float acc = lane_prefix(chunk);
  int pick = V;
  for (int j = lo; j < hi; ++j) {
    const float m = MASS(j);
    acc += m;
    if (m > 0.0f && acc > target) { pick = j; break; }
  }
  int next = lane_min_int(pick);
  if (next == V) {  // rounding left the target at the very top: take the last token with mass
    int last = -1;
    for (int j = lo; j < hi; ++j) if (MASS(j) > 0.0f) last = j;
    next = lane_max_int(last);
    next = next < 0 ? 0 : next;
  }
#undef MASS
  if (lane == 0) { out[0] = n; out[1] = next; }
"""

METAL_PROLOGUE = "\n  const int lane = int(thread_position_in_grid.x);\n"
METAL_HEADER = """
#define MAX0(x) metal::max((x), 0.0f)
inline float lane_sum(float v) { return simd_sum(v); }
inline float lane_max(float v) { return simd_max(v); }
inline int lane_min_int(int v) { return simd_min(v); }
inline int lane_max_int(int v) { return simd_max(v); }
inline float lane_prefix(float v) { return simd_prefix_exclusive_sum(v); }
"""

CUDA_PROLOGUE = "\n  const int lane = int(threadIdx.x);\n"
CUDA_HEADER = """
#define MAX0(x) fmaxf((x), 0.0f)
// xor butterflies: every lane ends with the same bits (a + b == b + a), which the kernel relies on
__device__ inline float lane_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float lane_max(float v) {
  for (int o = 16; o > 0; o /= 2) { const float w = __shfl_xor_sync(0xffffffffu, v, o); v = w > v ? w : v; }
  return v;
}
__device__ inline int lane_min_int(int v) {
  for (int o = 16; o > 0; o /= 2) { const int w = __shfl_xor_sync(0xffffffffu, v, o); v = w < v ? w : v; }
  return v;
}
__device__ inline int lane_max_int(int v) {
  for (int o = 16; o > 0; o /= 2) { const int w = __shfl_xor_sync(0xffffffffu, v, o); v = w > v ? w : v; }
  return v;
}
__device__ inline float lane_prefix(float v) {  // exclusive: sum over lanes below this one
  const int lane = int(threadIdx.x) & 31;
  float s = v;
  for (int o = 1; o < 32; o *= 2) { const float w = __shfl_up_sync(0xffffffffu, s, o); if (lane >= o) s += w; }
  const float below = __shfl_up_sync(0xffffffffu, s, 1);
  return lane == 0 ? 0.0f : below;
}
"""

CORES = {GREEDY: GREEDY_CORE, REJECTION: REJECTION_CORE}


def metal_body(kind: str) -> str:
    return METAL_PROLOGUE + CORES[kind]


def cuda_body(kind: str) -> str:
    return CUDA_PROLOGUE + CORES[kind]




def input_dtypes(kind: str, dtype) -> dict:
    if kind == GREEDY:
        return {"logits": dtype, "drafts": mx.uint32}
    return {"p": dtype, "q": dtype, "drafts": mx.uint32, "u": mx.float32}


def metal_source(kind: str, dtype, sizes: dict[str, int]) -> tuple[str, str]:
    """(function name, full Metal source) as mx.fast.metal_kernel would generate it (minus MLX's utils).

    `sizes` maps input names to element counts: MLX puts inputs of fewer than 8 elements (drafts and
    u for small k) in the constant address space.
    """
    body, dtypes, inputs = metal_body(kind), input_dtypes(kind, dtype), INPUTS[kind]
    tdef = f"<{_METAL_TYPES[dtype]}>"
    name = f"custom_kernel_{NAMES[kind]}__{_METAL_TYPES[dtype]}"
    name += metal_input_names(inputs, dtypes, sizes) + f"_{_METAL_TYPES[mx.int32]}"
    params, index = metal_params(inputs, dtypes, sizes, body)
    params.append(f"  device {_METAL_TYPES[mx.int32]}* out [[buffer({index})]]")
    params.append("  uint3 thread_position_in_grid [[thread_position_in_grid]]")
    src = (METAL_HEADER + f"template <typename T>\n[[kernel]] void {name}(\n" + ",\n".join(params) + ") {\n"
           + body + "\n}\n")
    src += f'\ntemplate [[host_name("{name}")]] [[kernel]] decltype({name}{tdef}) {name}{tdef};\n'
    return name, src


def cuda_source(kind: str, dtype) -> tuple[str, str]:
    """(function name, full CUDA source) as mx.fast.cuda_kernel would generate it."""
    body, dtypes = cuda_body(kind), input_dtypes(kind, dtype)
    name = f"custom_kernel_{NAMES[kind]}_{_METAL_TYPES[dtype]}"
    params = cuda_params(INPUTS[kind], dtypes, body) + [f"    {_CUDA_TYPES[mx.int32]}* out"]
    src = (CUDA_PREAMBLE + CUDA_HEADER + CUDA_NAMESPACE
           + f"__global__ void {name}(\n" + ",\n".join(params) + ") {\n"
           + f"  using T = {_CUDA_TYPES[dtype]};\n\n" + body + "\n}\n\n} // namespace mlx::core::cu\n")
    return name, src
