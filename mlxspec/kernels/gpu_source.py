"""Row-invariant few-row matmuls for the GPU, one source shared by Metal and CUDA (mx.fast.*_kernel).

qmm: y (M, N) = x (M, K) @ dequant(w).T, w (N, K*BITS/32) uint32, scales/biases (N, K/G), M <= 16.
gather qmm (MoE experts): y (P, N), row p = x[p] @ dequant(w[indices[p]]).T, w (E, N, K*BITS/32): each
  row is a one-row qmm of its expert (grid z = p), so it has the bits of qmm's M = 1 on that matrix.
dense: y (M, N) = x (M, K) @ w.T, w (N, K) float32/float16/bfloat16, M <= 16.
MODE 0 is MLX's affine quantization (w = code * scale + bias); MODE 1 is "mxfp4" (gpt-oss): 4-bit e2m1
codes, group 32, uint8 scales 2^(s - 127), no biases (a one-element stand-in is passed, never read);
every weight it dequantizes is exact in float32 (a power of two times a 2-bit mantissa).

One simdgroup / warp of 32 lanes computes COLS = 4 output columns for all M rows, so each x value
it loads serves 4 columns and each weight it dequantizes serves M rows. A threadgroup holds 2 of them.
  qmm: lane l owns K-blocks [k0, k0 + VPL) with k0 = l*VPL + i*32*VPL; VPL = 4 words (one 16-byte
       load per column: 32 values at 4 bits, 16 at 8 bits), one scale/bias per (block, column).
       2/3/5/6 bits (MLX packs them as a little-endian bit stream, codes straddling words): blocks of
       32 values, BITS words each, k0 = l*32 + i*1024.
  dense: lane l owns k = l + 32*j (coalesced 2-4 byte loads).
Per (m, n): FMA into acc[m][c] in a fixed k order, then a fixed 32-lane reduction; the loop over m
never reorders additions, so row m's result does not depend on M (nor on the column's slot c).
M = 1 (plain decoding) runs the very same code.

    grid (32, ceil(N / 4), 1), threadgroup (32, 2, 1)
    qmm template: T (x), S (scales/biases), O (output), G (32/64/128), BITS (2-6 or 8), MODE; needs K % G == 0
    dense template: T (x), W (weights), O (output); any K

Each backend adds a prologue (lane, warp, shapes from its builtins; MLX passes the builtins whose
names the body mentions) and a header (FMA, lane_sum, LOAD4). `metal_source` / `cuda_source` rebuild
the full program as MLX generates it so tests compile and run it under tests/kernels/emulator.
"""

from __future__ import annotations

import mlx.core as mx

from .gpu_codegen import CUDA_NAMESPACE, CUDA_PREAMBLE, CUDA_TYPES, METAL_LOAD4, METAL_TYPES, cuda_function, cuda_params
from .gpu_codegen import cuda_program, metal_function, metal_input_names, metal_params

# older names, imported by accept_source.py
_METAL_TYPES, _CUDA_TYPES = METAL_TYPES, CUDA_TYPES
__all__ = ["CUDA_NAMESPACE", "CUDA_PREAMBLE", "cuda_params", "metal_input_names", "metal_params"]

NAME = "mlxspec_qmm_rows"
GATHER_NAME = "mlxspec_gather_qmm_rows"
GROUPED_NAME = "mlxspec_grouped_gather_qmm_rows"
DENSE_NAME = "mlxspec_dense_rows"
MAX_ROWS = 16  # rows per launch; more rows run as several launches
COLS = 4  # output columns per simdgroup / warp
THREADGROUP = (32, 2, 1)  # 2 simdgroups / warps per threadgroup
INPUTS = ["x", "w", "scales", "biases"]
GATHER_INPUTS = ["x", "w", "scales", "biases", "indices"]
MODES = {"affine": 0, "mxfp4": 1}
DENSE_INPUTS = ["x", "w"]
OUTPUTS = ["y"]

QMM_SHAPES = """
  const int M = x_shape[0], K = x_shape[1], N = w_shape[0];
  const size_t xo = 0, wo = 0, so = 0, yo = 0;  // offsets of x, w, scales and y (the gather's row and expert)
  constexpr bool GATHER = false;
"""
GATHER_SHAPES = """
  const int M = 1, K = x_shape[1], N = w_shape[1];  // one row: qmm's arithmetic at M = 1
  const size_t e = indices[row];
  const size_t xo = size_t(row) * K, wo = e * N * (K * BITS / 32), so = e * N * (K / G), yo = size_t(row) * N;
  constexpr bool GATHER = true;
"""

# The grouped gather (verify passes of MoE models): grid z = expert, and each threadgroup runs qmm's
# rows over the pairs on its expert, ROWS at a time in pair order, so an expert's weights are read
# once for all the tokens that chose it (the gather above reads them once per pair). Row m is pair
# rows_of[m]; its arithmetic is qmm's, so it gets the bits the one-row gather gives it.
GROUPED_SHAPES = """
  const int P = x_shape[0], K = x_shape[1], N = w_shape[1];
  const uint32_t e = uint32_t(row);
  const size_t xo = 0, wo = size_t(e) * N * (K * BITS / 32), so = size_t(e) * N * (K / G), yo = 0;
  constexpr bool GATHER = true;
  for (int first = 0; first < P;) {
    int rows_of[ROWS], M = 0;
    for (; first < P && M < ROWS; ++first)
      if (indices[first] == e) rows_of[M++] = first;
    if (M == 0) break;  // uniform: every lane scans the same indices
"""

QMM_SETUP = """
  constexpr int COLS = 4;
  constexpr int PER = 32 / BITS;  // values per uint32 word
  constexpr int VPL = 4 * PER;    // values per lane per block: 4 words, one 16-byte load
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  constexpr uint32_t E2M1X2 = 0xC8643210u;  // MODE 1: e2m1 magnitudes x 2 (0 1 2 3 4 6 8 12), 4 bits each
  const int WORDS = K * BITS / 32, GROUPS = K / G;
  const int n0 = warp * COLS;
  if (n0 >= N) return;  // uniform over the warp
  float acc[ROWS][COLS];  // ROWS: the launch's row capacity (1, 2, 4, 8 or 16), M <= ROWS
#pragma unroll
  for (int m = 0; m < ROWS; ++m)
#pragma unroll
    for (int c = 0; c < COLS; ++c) acc[m][c] = 0.0f;
"""


def _load_block(k: str) -> str:
    """The 4/8-bit loop's loads of one K-block (codes, raw scales and biases of COLS columns) at k into qn/sn/bn."""
    return f"""#pragma unroll
    for (int c = 0; c < COLS; ++c) {{
      const int n = n0 + c < N ? n0 + c : N - 1;  // past N: a duplicate column, computed, never stored
      qn[c] = LOAD4(w + wo + size_t(n) * WORDS + ({k}) / PER);
      const size_t g = so + size_t(n) * GROUPS + ({k}) / G;  // VPL divides G: one group per block
      sn[c] = scales[g];
      bn[c] = MODE == 0 ? biases[g] : scales[g];  // mxfp4 has no biases: its stand-in is never read
    }}
"""


# One-row launches on CUDA (AHEAD) load block i + 1 (its codes and scales) before they compute block i, so those
# loads are in flight meanwhile: a lane owns few blocks (4 for K = 4096) and waited for each one's loads in turn.
# It holds 95 registers at one row, not 64 (more rows would pass 250: they load each block as they reach it), and
# is unmeasured on a device, so Metal and the MoE gathers keep the plain loop. The arithmetic is the same, in order.
QMM_LOOPS = """
  if (BITS == 4 || BITS == 8) {  // a compile-time choice: codes never straddle words
  constexpr bool AHEAD = QMM_AHEAD && ROWS == 1 && !GATHER;  // MoE gathers keep their registers (one row each)
  uint4 qn[COLS];
  S sn[COLS], bn[COLS];
  if (AHEAD && lane * VPL < K) {
""" + _load_block("lane * VPL") + """  }
  for (int k0 = lane * VPL; k0 < K; k0 += 32 * VPL) {  // K % 32 == 0 (G | K): blocks are whole
    if (!AHEAD) {
""" + _load_block("k0") + """    }
    uint4 q[COLS];
    float s[COLS], b[COLS];
#pragma unroll
    for (int c = 0; c < COLS; ++c) {
      q[c] = qn[c];
      s[c] = MODE == 0 ? float(sn[c]) : LDEXP(1.0f, int(float(sn[c])) - 128);  // mxfp4: 2^(s - 127) / 2, exact
      b[c] = MODE == 0 ? float(bn[c]) : 0.0f;
    }
    if (AHEAD && k0 + 32 * VPL < K) {  // the next block's loads, in flight while this one computes
""" + _load_block("k0 + 32 * VPL") + """    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float wv[COLS][PER];  // dequantized once, used by every row
#pragma unroll
      for (int c = 0; c < COLS; ++c) {
        const uint32_t word = i == 0 ? q[c].x : i == 1 ? q[c].y : i == 2 ? q[c].z : q[c].w;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
          const uint32_t code = (word >> (BITS * j)) & MASK;
          const float e2m1 = CODE_F((E2M1X2 >> ((code & 7u) * 4u)) & 15u);  // a shift, not a local array
          wv[c][j] = MODE == 0 ? FMA(CODE_F(code), s[c], b[c]) : (code & 8u ? -e2m1 : e2m1) * s[c];
        }
      }
#pragma unroll
      for (int m = 0; m < ROWS; ++m) {
        if (m < M) {
          float xv[PER];
          LOAD_X(xv, x + xo + size_t(m) * K + k0 + i * PER, PER);
#pragma unroll
          for (int j = 0; j < PER; ++j)
#pragma unroll
            for (int c = 0; c < COLS; ++c) acc[m][c] = FMA(xv[j], wv[c][j], acc[m][c]);
        }
      }
    }
  }
  } else {  // 2, 3, 5, 6 bits (affine): 32 codes are BITS words of a little-endian bit stream
  for (int k0 = lane * 32; k0 < K; k0 += 32 * 32) {
    uint32_t q[COLS][BITS];
    float s[COLS], b[COLS];
#pragma unroll
    for (int c = 0; c < COLS; ++c) {
      const int n = n0 + c < N ? n0 + c : N - 1;
#pragma unroll
      for (int i = 0; i < BITS; ++i) q[c][i] = w[wo + size_t(n) * WORDS + (k0 / 32) * BITS + i];
      const size_t g = so + size_t(n) * GROUPS + k0 / G;  // 32 divides G: one group per block
      s[c] = float(scales[g]);
      b[c] = float(biases[g]);
    }
#pragma unroll
    for (int j0 = 0; j0 < 32; j0 += 8) {  // 8 codes at a time: each row's x read in one load
      float wv[COLS][8];  // dequantized once, used by every row
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const int bit = (j0 + jj) * BITS, i = bit / 32, sh = bit % 32, i2 = i + 1 < BITS ? i + 1 : i;
#pragma unroll
        for (int c = 0; c < COLS; ++c) {
          uint32_t code = q[c][i] >> sh;
          if (sh + BITS > 32) code |= q[c][i2] << (32 - sh);  // the code straddles two words
          wv[c][jj] = FMA(CODE_F(code & MASK), s[c], b[c]);
        }
      }
#pragma unroll
      for (int m = 0; m < ROWS; ++m) {
        if (m < M) {
          float xv[8];
          LOAD_X(xv, x + xo + size_t(m) * K + k0 + j0, 8);
#pragma unroll
          for (int jj = 0; jj < 8; ++jj)  // each acc[m][c] still adds k in order
#pragma unroll
            for (int c = 0; c < COLS; ++c) acc[m][c] = FMA(xv[jj], wv[c][jj], acc[m][c]);
        }
      }
    }
  }
  }
"""

DENSE_CORE = """
  constexpr int COLS = 4;
  const int M = x_shape[0], K = x_shape[1], N = w_shape[0];
  const size_t yo = 0;  // STORE's output offset
  const int n0 = warp * COLS;
  if (n0 >= N) return;  // uniform over the warp
  float acc[ROWS][COLS];  // ROWS: the launch's row capacity (1, 2, 4, 8 or 16), M <= ROWS
#pragma unroll
  for (int m = 0; m < ROWS; ++m)
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
    for (int m = 0; m < ROWS; ++m) {
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
  for (int m = 0; m < ROWS; ++m) {
    if (m < M) {  // uniform over the warp: every lane takes part in lane_sum
#pragma unroll
      for (int c = 0; c < COLS; ++c) {
        const float total = lane_sum(acc[m][c]);
        if (lane == c && n0 + c < N) y[yo + size_t(m) * N + n0 + c] = static_cast<O>(total);
      }
    }
  }
"""

METAL_PROLOGUE = """
  const int lane = int(thread_position_in_grid.x);
  const int warp = int(thread_position_in_grid.y);
"""
METAL_ROW = """
  const int row = int(thread_position_in_grid.z);
"""
METAL_HEADER = """
#define QMM_AHEAD 0
#define FMA(a, b, c) metal::fma(a, b, c)
#define LDEXP(a, e) metal::ldexp(a, e)
#define CODE_F(c) float(c)
""" + METAL_LOAD4 + """#define LOAD_X_ONE_BY_ONE(out, p, N) for (int j_ = 0; j_ < (N); ++j_) (out)[j_] = float((p)[j_])
inline float lane_sum(float v) { return simd_sum(v); }
"""

CUDA_PROLOGUE = """
  const int lane = int(threadIdx.x);
  const int warp = int(blockIdx.y * blockDim.y + threadIdx.y);
"""
CUDA_ROW = """
  const int row = int(blockIdx.z);
"""
CUDA_HEADER = """
#define QMM_AHEAD 1
#define FMA(a, b, c) fmaf(a, b, c)
#define LDEXP(a, e) ldexpf(a, e)
// A code (below 2^23) as a float, exactly: its bits under 2^23's exponent, minus 2^23. An int-to-float
// conversion (I2FP) issues at 16 a clock per SM (NVIDIA's throughput table), FFMA at 128, and the loop
// had one conversion a weight to its two FFMAs; the OR and FADD here issue at full rate. Same bits.
#define CODE_F(c) (__uint_as_float(uint32_t(c) | 0x4B000000u) - 8388608.0f)
#define LOAD4(p) (*((const uint4*)(p)))
#define LOAD_X_ONE_BY_ONE(out, p, N) for (int j_ = 0; j_ < (N); ++j_) (out)[j_] = float((p)[j_])
#define LOAD_X_WIDE(out, p, N) load_x_wide<N>(out, p)
// N consecutive values of x as floats in 16-byte loads (8-byte where N values fill only 8): one load
// instruction instead of up to 8; p must be aligned to that width
template <int N, typename T> __device__ inline void load_x_wide(float* out, const T* p) {
  constexpr int BYTES = N * int(sizeof(T)), WIDE = BYTES % 16 == 0 ? 16 : 8, PER_LOAD = WIDE / int(sizeof(T));
  if constexpr (BYTES % 8 != 0) {  // never run: the 4/8-bit loop compiled for other widths
    LOAD_X_ONE_BY_ONE(out, p, N);
    return;
  }
#pragma unroll
  for (int v = 0; v < N / PER_LOAD; ++v) {
    T t[PER_LOAD];
    if constexpr (WIDE == 16) {
      const uint4 w = reinterpret_cast<const uint4*>(p)[v];
      memcpy(t, &w, 16);
    } else {
      const uint2 w = reinterpret_cast<const uint2*>(p)[v];
      memcpy(t, &w, 8);
    }
#pragma unroll
    for (int j = 0; j < PER_LOAD; ++j) out[v * PER_LOAD + j] = float(t[j]);
  }
}
__device__ inline float lane_sum(float v) {  // xor butterfly: fixed order, every lane gets the same bits
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
"""

# Metal reads x one value at a time. CUDA runs the loops in two copies: wide loads where x's rows
# are 16-byte aligned (always, unless x is a view at an odd offset), one by one otherwise. Both read
# the same values, so they give the same bits; a loop with both kinds of load inside held ~40% more
# registers (benchmarks/cuda_static.py).
METAL_QMM_CORE = QMM_SETUP + QMM_LOOPS.replace("LOAD_X", "LOAD_X_ONE_BY_ONE")


def _compact(loops: str) -> str:
    """The loops for an x at an odd offset, kept small: MLX hashes a precompiled kernel's whole binary at every
    launch (~0.37 us a KB on an H200), and unrolled, this never-taken copy was ~45% of it (16 of 36 KB at one row,
    64 of 144 at 16). Here no loop is unrolled, and the sums are its own (local memory: the other copy's stay in
    registers); each sum takes the same FMAs in the same order, so the bits are the same."""
    assert "acc[" in loops and "#pragma unroll 1" not in loops
    rolled = loops.replace("acc[", "acc_u[").replace("#pragma unroll\n", "#pragma unroll 1\n")
    return ("  float acc_u[ROWS][COLS] = {};\n" + rolled.replace("LOAD_X", "LOAD_X_ONE_BY_ONE")
            + "#pragma unroll\n  for (int m = 0; m < ROWS; ++m)\n#pragma unroll\n"
              "    for (int c = 0; c < COLS; ++c) acc[m][c] = acc_u[m][c];\n")


CUDA_QMM_CORE = (QMM_SETUP + "  if (reinterpret_cast<size_t>(x + xo) % 16 == 0) {  // uniform over the launch\n"
                 + QMM_LOOPS.replace("LOAD_X", "LOAD_X_WIDE") + "  } else {\n" + _compact(QMM_LOOPS) + "  }\n")
METAL_BODY = METAL_PROLOGUE + QMM_SHAPES + METAL_QMM_CORE + STORE
CUDA_BODY = CUDA_PROLOGUE + QMM_SHAPES + CUDA_QMM_CORE + STORE
METAL_GATHER_BODY = METAL_PROLOGUE + METAL_ROW + GATHER_SHAPES + METAL_QMM_CORE + STORE
CUDA_GATHER_BODY = CUDA_PROLOGUE + CUDA_ROW + GATHER_SHAPES + CUDA_QMM_CORE + STORE


def _grouped(core: str) -> str:
    """qmm's core and store with row m read from and written to pair rows_of[m], inside GROUPED_SHAPES' loop."""
    assert "size_t(m) * K" in core and "size_t(m) * N" in STORE  # the rows this rewrites must be there
    rows = core.replace("size_t(m) * K", "size_t(rows_of[m]) * K")
    return GROUPED_SHAPES + rows + STORE.replace("size_t(m) * N", "size_t(rows_of[m]) * N") + "  }\n"


METAL_GROUPED_BODY = METAL_PROLOGUE + METAL_ROW + _grouped(METAL_QMM_CORE)
CUDA_GROUPED_BODY = CUDA_PROLOGUE + CUDA_ROW + _grouped(CUDA_QMM_CORE)
METAL_DENSE_BODY = METAL_PROLOGUE + DENSE_CORE + STORE
CUDA_DENSE_BODY = CUDA_PROLOGUE + DENSE_CORE + STORE


def row_capacity(rows: int) -> int:
    """The ROWS a launch of `rows` rows is compiled for: the smallest of 1, 2, 4, 8, 16 that holds them.
    Fewer accumulators (registers) for few rows; row m's arithmetic is the same in every capacity."""
    if not 0 < rows <= MAX_ROWS:
        raise ValueError(f"{rows} rows in one launch (1..{MAX_ROWS})")
    return 1 << (rows - 1).bit_length()


def template_args(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int, mode: str = "affine",
                  rows: int = MAX_ROWS) -> list[tuple]:
    return [("T", x_dtype), ("S", scale_dtype), ("O", out_dtype), ("G", group_size), ("BITS", bits),
            ("MODE", MODES[mode]), ("ROWS", row_capacity(rows))]


def dense_template_args(x_dtype, w_dtype, out_dtype, rows: int = MAX_ROWS) -> list[tuple]:
    return [("T", x_dtype), ("W", w_dtype), ("O", out_dtype), ("ROWS", row_capacity(rows))]


def _qmm(x_dtype, scale_dtype, out_dtype, gather: bool | str = False):
    dtypes = {"x": x_dtype, "w": mx.uint32, "scales": scale_dtype, "biases": scale_dtype}
    if gather:
        name = GROUPED_NAME if gather == "grouped" else GATHER_NAME
        return (name, GATHER_INPUTS, OUTPUTS, [out_dtype]), dtypes | {"indices": mx.uint32}
    return (NAME, INPUTS, OUTPUTS, [out_dtype]), dtypes


def _body(backend: str, gather: bool | str) -> str:
    bodies = {"metal": (METAL_BODY, METAL_GATHER_BODY, METAL_GROUPED_BODY),
              "cuda": (CUDA_BODY, CUDA_GATHER_BODY, CUDA_GROUPED_BODY)}[backend]
    return bodies[2 if gather == "grouped" else 1 if gather else 0]


def _dense(x_dtype, w_dtype, out_dtype):
    return (DENSE_NAME, DENSE_INPUTS, OUTPUTS, [out_dtype]), {"x": x_dtype, "w": w_dtype}


def metal_source(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int, sizes: dict[str, int],
                 mode: str = "affine", gather: bool | str = False, rows: int = MAX_ROWS) -> tuple[str, str]:
    """(function name, full Metal qmm (or gather qmm; gather="grouped": the grouped gather) source) as
    mx.fast.metal_kernel would generate it (minus MLX's utils); the biases' dtype is the scales'
    (mxfp4's unused stand-in too)."""
    kernel, dtypes = _qmm(x_dtype, scale_dtype, out_dtype, gather)
    targs = template_args(x_dtype, scale_dtype, out_dtype, group_size, bits, mode, 1 if gather is True else rows)
    name, text = metal_function(kernel, dtypes, sizes, targs, _body("metal", gather))
    return name, METAL_HEADER + text


def cuda_source(x_dtype, scale_dtype, out_dtype, group_size: int, bits: int, mode: str = "affine",
                gather: bool | str = False, rows=MAX_ROWS) -> tuple[list[str], str]:
    """(function names, full CUDA qmm (or gather qmm, or grouped gather) source) as mx.fast.cuda_kernel
    would generate it, one function per row capacity in `rows` (an int or several)."""
    kernel, dtypes = _qmm(x_dtype, scale_dtype, out_dtype, gather)
    names, texts = [], []
    for r in ([rows] if isinstance(rows, int) else rows):
        targs = template_args(x_dtype, scale_dtype, out_dtype, group_size, bits, mode, 1 if gather is True else r)
        name, text = cuda_function(kernel, dtypes, targs, _body("cuda", gather))
        names, texts = names + [name], texts + [text]
    return names, cuda_program(CUDA_HEADER, texts)


def metal_dense_source(x_dtype, w_dtype, out_dtype) -> tuple[str, str]:
    kernel, dtypes = _dense(x_dtype, w_dtype, out_dtype)
    sizes = dict.fromkeys(DENSE_INPUTS, 1 << 20)
    name, text = metal_function(kernel, dtypes, sizes, dense_template_args(x_dtype, w_dtype, out_dtype),
                                METAL_DENSE_BODY)
    return name, METAL_HEADER + text


def cuda_dense_source(x_dtype, w_dtype, out_dtype, rows=MAX_ROWS) -> tuple[list[str], str]:
    kernel, dtypes = _dense(x_dtype, w_dtype, out_dtype)
    names, texts = [], []
    for r in ([rows] if isinstance(rows, int) else rows):
        name, text = cuda_function(kernel, dtypes, dense_template_args(x_dtype, w_dtype, out_dtype, r), CUDA_DENSE_BODY)
        names, texts = names + [name], texts + [text]
    return names, cuda_program(CUDA_HEADER, texts)
