"""A row-invariant qmm on Apple GPUs' simdgroup matrices (Metal only): 8 rows cost what one row costs.

    y (M, N) = x (M, K) @ dequant(w).T, any M, x float32 / float16 / bfloat16, 2-6 or 8-bit affine, G in 32/64/128

Why: the FMA kernel (gpu_source.py) spends one FMA per weight per row, so a verify pass of 8 rows does
8x a decoding step's arithmetic (on an H200 its 16-row launch took 2.5-3.6x its one-row one); MLX's own
Metal qmm changes its arithmetic with the row count (qmv, qmv_wide, then the steel qmm), which is what
makes speculation inexact there. Here one `simdgroup_multiply_accumulate` multiplies an 8 x 8 tile of
dequantized weights by 8 rows of x, so a simdgroup's work per weight does not depend on M up to 8 rows
(two row tiles to 16), and rows past M read as zeros: a one-row decoding step runs this same kernel.
This is the CUDA tensor-core design (gpu_mma_source.py) on Apple's 8 x 8 float matrices.

Row invariance: an output of D = A B + C is computed from its own row of A (a column of w), column of B
(a row of x) and element of C, so x's row m gets the same bits in a 1-row and a 16-row launch whatever the
other rows hold. Metal does not document the order of the 8 products; the emulator sums them in its own
order and the registry's self-check tests the kernel on the user's GPU before any layer uses it.

Layout (the one MLX's steel/gemm/mma.h relies on: BaseMMAFrag::get_coord): lane l holds elements (fm, fn)
and (fm, fn + 1) of each 8 x 8 matrix, fm = (l / 4 & 4) + (l / 2 % 4), fn = (l / 4 & 2) * 2 + (l % 2) * 2.
    A (w, n x k):  column n0 + fm of w, codes k + fn, k + fn + 1, dequantized in float32 (fma(q, s, b))
    B (x^T, k x m): rows m0 + fn, m0 + fn + 1 of x at k + fm (zeros past M)
    C, D (y^T, n x m): y[m0 + fn (+1)][n0 + fm], float32 accumulators
A lane loads its column's codes 16 bytes at a time at 4 and 8 bits (32 codes, 16: the 4 lanes of a row fm
read the same bytes, one transaction); at 2, 3, 5 and 6 bits (MLX's little-endian bit stream: a GGUF's
Q5_K / Q6_K layers) the word or two holding its two codes of each 8 x 8 step. Each block of K lies in
one scale group (G >= 32).

A threadgroup's KSPLIT simdgroups share its TILES 8-column tiles and take every KSPLIT-th block of K
each; their partial sums are added in threadgroup memory in simdgroup order 0, 1, 2, 3. That order
depends on K only, never on M, so the rows stay invariant. The grid's z covers RT row tiles at a time,
so any number of rows is one launch.

    grid (32, ceil(N / (8 TILES)) * KSPLIT, ceil(M / (8 RT))), threadgroup (32, KSPLIT, 1)
    template T, S, O, G, BITS, TILES, RT, KSPLIT
"""

from __future__ import annotations

import mlx.core as mx

from .gpu_codegen import METAL_LOAD4, metal_function

NAME = "mlxspec_qmm_simdgroup"
INPUTS = ["x", "w", "scales", "biases"]
OUTPUTS = ["y"]
TILES = 2  # 8-column tiles per simdgroup: each B (x) fragment serves them all; the bits do not depend on it
KSPLIT = 4  # simdgroups of a threadgroup, each taking every KSPLIT-th block of K: it orders the sums
X_DTYPES = (mx.float32, mx.float16, mx.bfloat16)  # float32 matrices: every x is exact in them
BITS = (2, 3, 4, 5, 6, 8)  # 4 and 8: whole codes a word, read 16 bytes at a time; the others: MLX's bit stream
GROUP_SIZES = (32, 64, 128)

# The 8 x 8 float32 product from a lane's elements: shared with the simdgroup attention (gpu_attention_simdgroup_source)
MMA8 = """
#include <metal_simdgroup_matrix>
// D = A B + C on 8 x 8 float32 matrices, from and to the two elements this lane holds of each
inline void mma8(thread float* d, float a0, float a1, float b0, float b1) {
  simdgroup_matrix<float, 8, 8> A, B, C, D;
  A.thread_elements()[0] = a0;
  A.thread_elements()[1] = a1;
  B.thread_elements()[0] = b0;
  B.thread_elements()[1] = b1;
  C.thread_elements()[0] = d[0];
  C.thread_elements()[1] = d[1];
  simdgroup_multiply_accumulate(D, A, B, C);
  d[0] = D.thread_elements()[0];
  d[1] = D.thread_elements()[1];
}
"""
HEADER = MMA8 + METAL_LOAD4 + """#define UNROLL _Pragma("clang loop unroll(full)")  // loops over template constants: registers, not memory
inline uint32_t word_of(uint4 q, int i) { return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w; }
"""

BODY = """
  const int lane = int(thread_position_in_threadgroup.x), part = int(thread_position_in_threadgroup.y);
  const int M = x_shape[0], K = x_shape[1], N = w_shape[0];
  const int WORDS = K * BITS / 32, GROUPS = K / G;
  constexpr bool WHOLE = BITS == 4 || BITS == 8;  // whole codes in each word: 16-byte loads of codes
  constexpr int PER = 32 / BITS;                  // (WHOLE) codes per word
  constexpr int KB = WHOLE ? 4 * PER : 32;        // k per block: one 16-byte load (WHOLE), else 32 codes
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  const int fm = (lane / 4 & 4) + (lane / 2) % 4, fn = (lane / 4 & 2) * 2 + (lane % 2) * 2;  // MLX's layout
  const int n0 = int(threadgroup_position_in_grid.y) * 8 * TILES, m0 = int(threadgroup_position_in_grid.z) * 8 * RT;
  threadgroup float partial[KSPLIT * RT * TILES * 2 * 32];  // the simdgroups' sums (at kernel scope, as Metal asks)
  int col[TILES];  // this lane's column of w in each tile (past N: N - 1, computed, never stored)
  UNROLL for (int j = 0; j < TILES; ++j) col[j] = n0 + 8 * j + fm < N ? n0 + 8 * j + fm : N - 1;
  float acc[RT][TILES][2];
  UNROLL for (int r = 0; r < RT; ++r)
    UNROLL for (int j = 0; j < TILES; ++j) acc[r][j][0] = acc[r][j][1] = 0.0f;
  for (int k0 = part * KB; k0 < K; k0 += KSPLIT * KB) {  // KB divides G, and G divides K: blocks are whole
    uint4 q[TILES];
    float s[TILES], b[TILES];
    UNROLL for (int j = 0; j < TILES; ++j) {
      if (WHOLE) q[j] = LOAD4(w + size_t(col[j]) * WORDS + k0 / PER);
      const size_t g = size_t(col[j]) * GROUPS + k0 / G;
      s[j] = float(scales[g]);
      b[j] = float(biases[g]);
    }
    UNROLL for (int i = 0; i < KB / 8; ++i) {  // one 8 x 8 x 8 product per tile and row tile
      const int k = k0 + 8 * i;
      float xb[RT][2];  // B: x's rows m0 + 8r + fn, fn + 1 at k + fm
      UNROLL for (int r = 0; r < RT; ++r)
        UNROLL for (int e = 0; e < 2; ++e) {
          const int m = m0 + 8 * r + fn + e;
          xb[r][e] = m < M ? float(x[size_t(m) * K + k + fm]) : 0.0f;
        }
      const int at = 8 * i + fn;  // this lane's first code in the block
      UNROLL for (int j = 0; j < TILES; ++j) {
        uint32_t word;  // this lane's two codes in its low bits
        if (WHOLE) {
          word = word_of(q[j], at / PER) >> (at % PER * BITS);  // fn is even: both codes in one word
        } else {  // a little-endian bit stream: the two codes may straddle two words
          const int bit = (k0 + at) * BITS, sh = bit % 32;
          const auto p = w + size_t(col[j]) * WORDS + bit / 32;  // w's address space (device, or constant)
          word = uint32_t((uint64_t(p[0]) | (sh + 2 * BITS > 32 ? uint64_t(p[1]) << 32 : uint64_t(0))) >> sh);
        }
        const float a0 = metal::fma(float(word & MASK), s[j], b[j]);
        const float a1 = metal::fma(float((word >> BITS) & MASK), s[j], b[j]);
        UNROLL for (int r = 0; r < RT; ++r) mma8(acc[r][j], a0, a1, xb[r][0], xb[r][1]);
      }
    }
  }
  if (KSPLIT > 1) {  // simdgroup 0 adds the others' partial sums, in simdgroup order
    UNROLL for (int r = 0; r < RT; ++r)
      UNROLL for (int j = 0; j < TILES; ++j)
        UNROLL for (int e = 0; e < 2; ++e) partial[((part * RT + r) * TILES * 2 + j * 2 + e) * 32 + lane] = acc[r][j][e];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (part != 0) return;
    UNROLL for (int r = 0; r < RT; ++r)
      UNROLL for (int j = 0; j < TILES; ++j)
        UNROLL for (int e = 0; e < 2; ++e) {
          float total = acc[r][j][e];
          UNROLL for (int p = 1; p < KSPLIT; ++p) total += partial[((p * RT + r) * TILES * 2 + j * 2 + e) * 32 + lane];
          acc[r][j][e] = total;
        }
  }
  UNROLL for (int r = 0; r < RT; ++r)
    UNROLL for (int j = 0; j < TILES; ++j)
      UNROLL for (int e = 0; e < 2; ++e) {
        const int m = m0 + 8 * r + fn + e, n = n0 + 8 * j + fm;
        if (m < M && n < N) y[size_t(m) * N + n] = static_cast<O>(acc[r][j][e]);
      }
"""


def supports(x_dtype, group_size: int, bits: int, mode: str = "affine") -> bool:
    return mode == "affine" and x_dtype in X_DTYPES and bits in BITS and group_size in GROUP_SIZES


def row_tiles(rows: int) -> int:
    """8-row tiles a simdgroup computes with each weights fragment it dequantizes, for a launch of `rows`: 1 up
    to 8 rows, else 2 (the grid's z covers the rest)."""
    return 1 if rows <= 8 else 2


def tiles_for(rows: int) -> int:
    """The column tiles a launch of `rows` rows uses (the bits are the same with any)."""
    return TILES


def template_args(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int, tiles: int = TILES,
                  rows: int = 1, ksplit: int = KSPLIT) -> list[tuple]:
    return [("T", x_dtype), ("S", scale_dtype), ("O", out_dtype), ("G", group_size), ("BITS", bits),
            ("TILES", tiles), ("RT", row_tiles(rows)), ("KSPLIT", ksplit)]


def launch(rows: int, n: int, tiles: int = TILES, ksplit: int = KSPLIT) -> dict:
    """grid (in threads, as mx.fast.metal_kernel takes it) and threadgroup of a launch over `rows` rows and `n` columns."""
    per_block = 8 * row_tiles(rows)
    return {"grid": (32, (n + 8 * tiles - 1) // (8 * tiles) * ksplit, max(1, (rows + per_block - 1) // per_block)),
            "threadgroup": (32, ksplit, 1)}


def metal_source(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int,
                 builds=((TILES, 1, KSPLIT),)) -> tuple[list[str], str]:
    """(function names, full Metal program) as mx.fast.metal_kernel would generate it (minus MLX's utils),
    one function per (column tiles, row tiles, K split) in `builds`."""
    dtypes = {"x": x_dtype, "w": mx.uint32, "scales": scale_dtype, "biases": scale_dtype}
    sizes = dict.fromkeys(INPUTS, 1 << 20)
    names, texts = [], []
    for tiles, rt, ksplit in builds:
        targs = template_args(x_dtype, scale_dtype, out_dtype, group_size, bits, tiles, 8 * rt, ksplit)
        name, text = metal_function((NAME, INPUTS, OUTPUTS, [out_dtype]), dtypes, sizes, targs, BODY)
        names, texts = names + [name], texts + [text]
    return names, HEADER + "".join(texts)
