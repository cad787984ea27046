"""Row-invariant few-row matmuls for the GPU, one source shared by Metal and CUDA (mx.fast.*_kernel).

qmm: y (M, N) = x (M, K) @ dequant(w).T, w (N, K*BITS/32) uint32, scales/biases (N, K/G), M <= 16.
dense: y (M, N) = x (M, K) @ w.T, w (N, K) float32/float16/bfloat16, M <= 16.

One simdgroup / warp of 32 lanes computes COLS = 4 output columns for all M rows, so each x value
it loads serves 4 columns and each weight it dequantizes serves M rows. A threadgroup holds 2 of them.
  qmm: lane l owns K-blocks [k0, k0 + VPL) with k0 = l*VPL + i*32*VPL; VPL = 4 words (one 16-byte
       load per column: 32 values at 4 bits, 16 at 8 bits), one scale/bias per (block, column).
  dense: lane l owns k = l + 32*j (coalesced 2-4 byte loads).
Per (m, n): FMA into acc[m][c] in a fixed k order, then a fixed 32-lane reduction; the loop over m
never reorders additions, so row m's result does not depend on M (nor on the column's slot c).
M = 1 (plain decoding) runs the very same code.

    grid (32, ceil(N / 4), 1), threadgroup (32, 2, 1)
    qmm template: T (x), S (scales/biases), O (output), G (32/64/128), BITS (4 or 8); needs K % G == 0
    dense template: T (x), W (weights), O (output); any K

Each backend adds a prologue (lane, warp, shapes from its builtins; MLX passes the builtins whose
names the body mentions) and a header (FMA, lane_sum, LOAD4). `metal_source` / `cuda_source` rebuild
the full program as MLX generates it so tests compile and run it under tests/kernels/emulator.
"""

from __future__ import annotations

import mlx.core as mx

from .gpu_codegen import CUDA_NAMESPACE, CUDA_PREAMBLE, CUDA_TYPES, METAL_TYPES, cuda_function, cuda_params
from .gpu_codegen import cuda_program, metal_function, metal_input_names, metal_params

# older names, imported by accept_source.py
_METAL_TYPES, _CUDA_TYPES = METAL_TYPES, CUDA_TYPES
__all__ = ["CUDA_NAMESPACE", "CUDA_PREAMBLE", "cuda_params", "metal_input_names", "metal_params"]

NAME = "mlxspec_qmm_rows"
DENSE_NAME = "mlxspec_dense_rows"
MAX_ROWS = 16  # rows per launch; more rows run as several launches
COLS = 4  # output columns per simdgroup / warp
THREADGROUP = (32, 2, 1)  # 2 simdgroups / warps per threadgroup
INPUTS = ["x", "w", "scales", "biases"]
DENSE_INPUTS = ["x", "w"]
OUTPUTS = ["y"]

QMM_CORE = """
  constexpr int COLS = 4;
  constexpr int PER = 32 / BITS;  // values per uint32 word
  constexpr int VPL = 4 * PER;    // values per lane per block: 4 words, one 16-byte load
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  const int M = x_shape[0], K = x_shape[1], N = w_shape[0];
  const int WORDS = K / PER, GROUPS = K / G;
  const int n0 = warp * COLS;
  if (n0 >= N) return;  // uniform over the warp
  float acc[16][COLS];
#pragma unroll
  for (int m = 0; m < 16; ++m)
#pragma unroll
    for (int c = 0; c < COLS; ++c) acc[m][c] = 0.0f;
  for (int k0 = lane * VPL; k0 < K; k0 += 32 * VPL) {  // K % 32 == 0 (G | K): blocks are whole
    uint4 q[COLS];
    float s[COLS], b[COLS];
#pragma unroll
    for (int c = 0; c < COLS; ++c) {
      const int n = n0 + c < N ? n0 + c : N - 1;  // past N: a duplicate column, computed, never stored
      q[c] = LOAD4(w + size_t(n) * WORDS + k0 / PER);
      s[c] = float(scales[size_t(n) * GROUPS + k0 / G]);  // VPL divides G: one group per block
      b[c] = float(biases[size_t(n) * GROUPS + k0 / G]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float wv[COLS][PER];  // dequantized once, used by every row
#pragma unroll
      for (int c = 0; c < COLS; ++c) {
        const uint32_t word = i == 0 ? q[c].x : i == 1 ? q[c].y : i == 2 ? q[c].z : q[c].w;
#pragma unroll
        for (int j = 0; j < PER; ++j) wv[c][j] = FMA(float((word >> (BITS * j)) & MASK), s[c], b[c]);
      }
#pragma unroll
      for (int m = 0; m < 16; ++m) {
        if (m < M) {
#pragma unroll
          for (int j = 0; j < PER; ++j) {
            const float xv = float(x[size_t(m) * K + k0 + i * PER + j]);
#pragma unroll
            for (int c = 0; c < COLS; ++c) acc[m][c] = FMA(xv, wv[c][j], acc[m][c]);
          }
        }
      }
    }
  }
"""

DENSE_CORE = """
  constexpr int COLS = 4;
  const int M = x_shape[0], K = x_shape[1], N = w_shape[0];
  const int n0 = warp * COLS;
  if (n0 >= N) return;  // uniform over the warp
  float acc[16][COLS];
#pragma unroll
  for (int m = 0; m < 16; ++m)
#pragma unroll
    for (int c = 0; c < COLS; ++c) acc[m][c] = 0.0f;
  for (int k = lane; k < K; k += 32) {  // consecutive lanes, consecutive k: coalesced
    float wv[COLS];
#pragma unroll
    for (int c = 0; c < COLS; ++c) {
      const int n = n0 + c < N ? n0 + c : N - 1;  // past N: a duplicate column, computed, never stored
      wv[c] = float(w[size_t(n) * K + k]);
    }
#pragma unroll
    for (int m = 0; m < 16; ++m) {
      if (m < M) {
        const float xv = float(x[size_t(m) * K + k]);
#pragma unroll
        for (int c = 0; c < COLS; ++c) acc[m][c] = FMA(xv, wv[c], acc[m][c]);
      }
    }
  }
"""

STORE = """
#pragma unroll
  for (int m = 0; m < 16; ++m) {
    if (m < M) {  // uniform over the warp: every lane takes part in lane_sum
#pragma unroll
      for (int c = 0; c < COLS; ++c) {
        const float total = lane_sum(acc[m][c]);
        if (lane == c && n0 + c < N) y[size_t(m) * N + n0 + c] = static_cast<O>(total);
      }
    }
  }
"""

METAL_PROLOGUE = """
  const int lane = int(thread_position_in_grid.x);
  const int warp = int(thread_position_in_grid.y);
"""
METAL_HEADER = """
#define FMA(a, b, c) metal::fma(a, b, c)
#define LOAD4(p) (*((const device uint4*)(p)))
inline float lane_sum(float v) { return simd_sum(v); }
"""

CUDA_PROLOGUE = """
  const int lane = int(threadIdx.x);
  const int warp = int(blockIdx.y * blockDim.y + threadIdx.y);
"""
CUDA_HEADER = """
#define FMA(a, b, c) fmaf(a, b, c)
#define LOAD4(p) (*((const uint4*)(p)))
__device__ inline float lane_sum(float v) {  // xor butterfly: fixed order, every lane gets the same bits
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
"""

METAL_BODY = METAL_PROLOGUE + QMM_CORE + STORE
CUDA_BODY = CUDA_PROLOGUE + QMM_CORE + STORE
METAL_DENSE_BODY = METAL_PROLOGUE + DENSE_CORE + STORE
CUDA_DENSE_BODY = CUDA_PROLOGUE + DENSE_CORE + STORE


def template_args(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int) -> list[tuple]:
    return [("T", x_dtype), ("S", scale_dtype), ("O", out_dtype), ("G", group_size), ("BITS", bits)]


def dense_template_args(x_dtype, w_dtype, out_dtype) -> list[tuple]:
    return [("T", x_dtype), ("W", w_dtype), ("O", out_dtype)]


def _qmm(x_dtype, scale_dtype, out_dtype):
    return ((NAME, INPUTS, OUTPUTS, [out_dtype]),
            {"x": x_dtype, "w": mx.uint32, "scales": scale_dtype, "biases": scale_dtype})


def _dense(x_dtype, w_dtype, out_dtype):
    return (DENSE_NAME, DENSE_INPUTS, OUTPUTS, [out_dtype]), {"x": x_dtype, "w": w_dtype}


def metal_source(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int, sizes: dict[str, int]) -> tuple[str, str]:
    """(function name, full Metal qmm source) as mx.fast.metal_kernel would generate it (minus MLX's utils)."""
    kernel, dtypes = _qmm(x_dtype, scale_dtype, out_dtype)
    targs = template_args(x_dtype, scale_dtype, out_dtype, group_size, bits)
    name, text = metal_function(kernel, dtypes, sizes, targs, METAL_BODY)
    return name, METAL_HEADER + text


def cuda_source(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int) -> tuple[str, str]:
    """(function name, full CUDA qmm source) as mx.fast.cuda_kernel would generate it."""
    kernel, dtypes = _qmm(x_dtype, scale_dtype, out_dtype)
    name, text = cuda_function(kernel, dtypes, template_args(x_dtype, scale_dtype, out_dtype, group_size, bits),
                               CUDA_BODY)
    return name, cuda_program(CUDA_HEADER, [text])


def metal_dense_source(x_dtype, w_dtype, out_dtype) -> tuple[str, str]:
    kernel, dtypes = _dense(x_dtype, w_dtype, out_dtype)
    sizes = dict.fromkeys(DENSE_INPUTS, 1 << 20)
    name, text = metal_function(kernel, dtypes, sizes, dense_template_args(x_dtype, w_dtype, out_dtype),
                                METAL_DENSE_BODY)
    return name, METAL_HEADER + text


def cuda_dense_source(x_dtype, w_dtype, out_dtype) -> tuple[str, str]:
    kernel, dtypes = _dense(x_dtype, w_dtype, out_dtype)
    name, text = cuda_function(kernel, dtypes, dense_template_args(x_dtype, w_dtype, out_dtype), CUDA_DENSE_BODY)
    return name, cuda_program(CUDA_HEADER, [text])
