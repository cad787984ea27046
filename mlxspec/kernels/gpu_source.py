"""The GPU kernel's source, shared by Metal (`mx.fast.metal_kernel`) and CUDA (`mx.fast.cuda_kernel`).

One simdgroup / warp of 32 lanes computes one output column n for all M <= 16 rows: lane l reads
words l, l+32, ... of weight row n (coalesced), dequantizes each weight once and multiplies it into
M accumulators; then a fixed 32-lane reduction. The per-(m, n) arithmetic does not depend on M.

    grid (32, N, 1), threadgroup (32, 8, 1); inputs x (M, K), w (N, K*BITS/32), scales, biases (N, K/G)
    template: T (x), S (scales/biases), O (output), G (group size), BITS (4 or 8)

Each backend adds a prologue (lane, n, M, K, N from its builtins; MLX detects the builtins it must
pass by finding their names in the body) and a header (FMA, lane_sum). `metal_source` and
`cuda_source` rebuild the full program exactly as MLX generates it, so the tests can compile and run
it on the CPU under stand-in definitions of the builtins (tests/kernels/gpu_emulator.h).
"""

from __future__ import annotations

import mlx.core as mx

NAME = "mlxspec_qmm_rows"
MAX_ROWS = 16  # rows per launch; more rows run as several launches
THREADGROUP = (32, 8, 1)  # 8 columns (simdgroups/warps) per threadgroup
INPUTS = ["x", "w", "scales", "biases"]
OUTPUTS = ["y"]

CORE = """
  if (n >= N) return;  // n is the same for the 32 lanes of a simdgroup: they leave together
  const int PER = 32 / BITS;  // values per uint32 word
  const int WORDS = K / PER;
  const int GROUPS = K / G;
  float acc[16];
  for (int m = 0; m < 16; ++m) acc[m] = 0.0f;
  for (int wi = lane; wi < WORDS; wi += 32) {
    const uint32_t word = w[n * WORDS + wi];
    const int k0 = wi * PER;
    const float s = float(scales[n * GROUPS + k0 / G]);
    const float b = float(biases[n * GROUPS + k0 / G]);
    for (int j = 0; j < PER; ++j) {
      const float wv = FMA(float((word >> (BITS * j)) & ((1u << BITS) - 1u)), s, b);
      for (int m = 0; m < 16; ++m)
        if (m < M) acc[m] = FMA(float(x[m * K + k0 + j]), wv, acc[m]);
    }
  }
  for (int m = 0; m < 16; ++m) {
    if (m < M) {  // uniform over the simdgroup: every lane takes part in lane_sum
      const float total = lane_sum(acc[m]);
      if (lane == 0) y[m * N + n] = static_cast<O>(total);
    }
  }
"""

METAL_PROLOGUE = """
  const int lane = int(thread_position_in_grid.x);
  const int n = int(thread_position_in_grid.y);
  const int M = x_shape[0], K = x_shape[1], N = w_shape[0];
"""
METAL_HEADER = """
#define FMA(a, b, c) metal::fma(a, b, c)
inline float lane_sum(float v) { return simd_sum(v); }
"""

CUDA_PROLOGUE = """
  const int lane = int(threadIdx.x);
  const int n = int(blockIdx.y * blockDim.y + threadIdx.y);
  const int M = x_shape[0], K = x_shape[1], N = w_shape[0];
"""
CUDA_HEADER = """
#define FMA(a, b, c) fmaf(a, b, c)
__device__ inline float lane_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
"""

METAL_BODY = METAL_PROLOGUE + CORE
CUDA_BODY = CUDA_PROLOGUE + CORE

_METAL_TYPES = {mx.float32: "float", mx.float16: "float16_t", mx.bfloat16: "bfloat16_t", mx.uint32: "uint32_t",
                mx.int32: "int32_t"}
_CUDA_TYPES = {mx.float32: "float", mx.float16: "__half", mx.bfloat16: "__nv_bfloat16", mx.uint32: "uint32_t",
               mx.int32: "int32_t"}
CUDA_PREAMBLE = ('\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'
                 "#define inf cuda::std::numeric_limits<float>::infinity()\n\n")
CUDA_NAMESPACE = "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
_METAL_ATTRIBUTES = {"thread_position_in_grid": "uint3"}  # the builtins the body uses


def template_args(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int) -> list[tuple]:
    return [("T", x_dtype), ("S", scale_dtype), ("O", out_dtype), ("G", group_size), ("BITS", bits)]


def _uses(body: str, name: str) -> bool:
    return name in body


def metal_input_names(inputs, dtypes: dict, sizes: dict[str, int]) -> str:
    """The part of MLX's kernel name that spells each input's type (+ 'c' when in constant space)."""
    return "".join(f"_{_METAL_TYPES[dtypes[i]]}" + ("c" if sizes[i] < 8 else "") for i in inputs)


def metal_params(inputs, dtypes: dict, sizes: dict[str, int], body: str) -> tuple[list[str], int]:
    """MLX's Metal parameter list for the inputs (with the _shape/_strides/_ndim the body uses); next buffer."""
    params, index = [], 0
    for i in inputs:
        space = "constant" if sizes[i] < 8 else "device"  # MLX: inputs of < 8 elements go to constant space
        params.append(f"  const {space} {_METAL_TYPES[dtypes[i]]}* {i} [[buffer({index})]]")
        index += 1
        for suffix, ctype in (("_shape", "int*"), ("_strides", "int64_t*"), ("_ndim", "int&")):
            if _uses(body, i + suffix):
                params.append(f"  const constant {ctype} {i}{suffix} [[buffer({index})]]")
                index += 1
    return params, index


def cuda_params(inputs, dtypes: dict, body: str) -> list[str]:
    """MLX's CUDA parameter list for the inputs (with the _shape/_strides/_ndim the body uses)."""
    params = []
    for i in inputs:
        params.append(f"    const {_CUDA_TYPES[dtypes[i]]}* {i}")
        for suffix, ctype in (("_shape", "Shape"), ("_strides", "Strides"), ("_ndim", "int")):
            if _uses(body, i + suffix):
                params.append(f"    const __grid_constant__ {ctype} {i}{suffix}")
    return params


def metal_source(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int, sizes: dict[str, int]) -> tuple[str, str]:
    """(function name, full Metal source) as mx.fast.metal_kernel would generate it (minus MLX's utils).

    `sizes` maps input names to element counts: MLX puts inputs of fewer than 8 elements in the
    constant address space.
    """
    targs = template_args(x_dtype, scale_dtype, out_dtype, group_size, bits)
    dtypes = {"x": x_dtype, "w": mx.uint32, "scales": scale_dtype, "biases": scale_dtype}
    tdef = "<" + ", ".join(_METAL_TYPES[v] if isinstance(v, mx.Dtype) else str(v) for _, v in targs) + ">"
    name = f"custom_kernel_{NAME}__" + tdef.strip("<>").replace(", ", "_")  # MLX: "_" + "<a, b>" with <, >, ", " -> "_"
    name += metal_input_names(INPUTS, dtypes, sizes) + f"_{_METAL_TYPES[out_dtype]}"
    params, index = metal_params(INPUTS, dtypes, sizes, METAL_BODY)
    params.append(f"  device {_METAL_TYPES[out_dtype]}* y [[buffer({index})]]")
    params += [f"  {t} {a} [[{a}]]" for a, t in _METAL_ATTRIBUTES.items() if _uses(METAL_BODY, a)]
    kinds = ", ".join(("typename " if isinstance(v, mx.Dtype) else "int ") + k for k, v in targs)
    src = (METAL_HEADER + f"template <{kinds}>\n[[kernel]] void {name}(\n" + ",\n".join(params) + ") {\n"
           + METAL_BODY + "\n}\n")
    src += f'\ntemplate [[host_name("{name}")]] [[kernel]] decltype({name}{tdef}) {name}{tdef};\n'
    return name, src


def cuda_source(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int) -> tuple[str, str]:
    """(function name, full CUDA source) as mx.fast.cuda_kernel would generate it."""
    targs = template_args(x_dtype, scale_dtype, out_dtype, group_size, bits)
    dtypes = {"x": x_dtype, "w": mx.uint32, "scales": scale_dtype, "biases": scale_dtype}
    name = f"custom_kernel_{NAME}" + "".join(
        f"_{_METAL_TYPES[v]}" if isinstance(v, mx.Dtype) else f"_{v}" for _, v in targs)
    params = cuda_params(INPUTS, dtypes, CUDA_BODY) + [f"    {_CUDA_TYPES[out_dtype]}* y"]
    consts = "".join(f"  using {k} = {_CUDA_TYPES[v]};\n" if isinstance(v, mx.Dtype) else f"  constexpr int {k} = {v};\n"
                     for k, v in targs)
    src = (CUDA_PREAMBLE + CUDA_HEADER + CUDA_NAMESPACE
           + f"__global__ void {name}(\n" + ",\n".join(params) + ") {\n" + consts + "\n" + CUDA_BODY
           + "\n}\n\n} // namespace mlx::core::cu\n")
    return name, src
