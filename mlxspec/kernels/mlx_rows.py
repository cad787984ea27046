"""Metal: verify rows with the bits of MLX's own one-row quantized matmul, so exact decoding costs plain decoding nothing.

Plain decoding's one-row matmul is MLX's `quantized_matmul` (its `qmv_fast` or `qmv` kernel: the fastest there is on
a Mac); a verify pass of M rows runs this kernel, which is MLX's `qmv_fast_impl` (or `qmv_impl`) with the rows in a
loop: each weight pack is fetched once for all rows, and each row's arithmetic is MLX's for that row alone (MLX's own
`load_vector(_safe)` and `qdot(_safe)`, pasted from the installed MLX's headers, qdot reading a lane's packs from its
registers; the same accumulation order; the same `simd_sum`). MLX itself runs another kernel for 2+ rows on M3 and later GPUs (`qmv_wide`), whose bits differ
from the one-row call's.

    qmm = mlx_rows_function()             # KernelUnavailable off Metal, or where MLX's kernels are not the mirrored ones
    y = qmm(x, w, scales, biases, 64, 4)  # 1 row: mx.quantized_matmul; 2+ rows: the kernel, 16 rows a launch

It serves a layer only where MLX's one-row call runs `qmv_fast` or `qmv` over whole tiles of 8 outputs (`supports`:
affine 4 or 8 bits, N a multiple of 8, K not 64 or 128 (`qmv_quad`); x in any float dtype, computed in the dtype
MLX's call promotes x and the scales to, a GGUF's float32 rows over float16 scales too), where the installed
MLX's two kernels are the ones mirrored (a hash of their text: MIRRORED), and only after its self-check on the device
found every row bit-identical to MLX's one-row call (registry family "qmm-mlx-rows"; a Metal compiler that orders the
arithmetic otherwise fails it, and the layer keeps mlxspec's own row-invariant kernels). Unmeasured on a Mac: no Mac
here; tests/kernels/test_mlx_rows.py runs it and MLX's own two kernels under the CPU emulator and compares their bits.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Callable

import mlx.core as mx

from .build import KernelUnavailable
from .gpu_source import row_capacity

NAME = "mlxspec_qmm_mlx_rows"
INPUTS, OUTPUTS = ["x", "w", "scales", "biases"], ["y"]
BITS = (4, 8)
BLOCK = {4: 512, 8: 256}  # qmv_fast's K step: pack_factor<bits, 32> * 2 packs * 32 lanes (qmv's: half)
MAX_ROWS = 16
# sha256 of qmv_fast_impl's and qmv_impl's text (whitespace collapsed) in the MLX whose loops this kernel mirrors
MIRRORED = {"e75fc184ccea0eb0": "0.32.4"}

BODY = """
  // MLX's qmv_fast_impl<T, G, BITS, false> (FAST) or qmv_impl (kernels/quantized.h; N a multiple of 8: its full-tile
  // branch), every x row in turn inside their K loop
  constexpr int packs_per_thread = FAST ? (BITS <= 2 ? 1 : 2) : 1;
  constexpr int num_simdgroups = 2;
  constexpr int results_per_simdgroup = 4;
  constexpr int pack_factor = get_pack_factor<BITS, 32>();
  constexpr int bytes_per_pack = get_bytes_per_pack<BITS, 32>();
  constexpr int values_per_thread = pack_factor * packs_per_thread;
  constexpr int block_size = values_per_thread * 32;
  constexpr int scale_step_per_thread = G / values_per_thread;
  typedef float U;
  const int in_vec_size = x_shape[1], out_vec_size = w_shape[0], rows = x_shape[0];
  const uint3 tid = threadgroup_position_in_grid;
  const uint simd_gid = simdgroup_index_in_threadgroup, simd_lid = thread_index_in_simdgroup;

  thread U x_thread[values_per_thread];
  thread U result[ROWS][results_per_simdgroup] = {};
  const int in_vec_size_w = in_vec_size * bytes_per_pack / pack_factor;
  const int in_vec_size_g = in_vec_size / G;
  const int out_row = tid.y * (num_simdgroups * results_per_simdgroup) + simd_gid * results_per_simdgroup;
  const device uint8_t* ws = (const device uint8_t*)w + out_row * in_vec_size_w
      + simd_lid * packs_per_thread * bytes_per_pack;
  // scales and biases in their own dtype S, each read as float: the value MLX's call reads after casting them to T
  const device S* sc = scales + out_row * in_vec_size_g + simd_lid / scale_step_per_thread;
  const device S* bi = biases + out_row * in_vec_size_g + simd_lid / scale_step_per_thread;
  const device T* xs = x + simd_lid * values_per_thread;

  constexpr int pack_words = packs_per_thread * bytes_per_pack / 4;  // a lane's packs of an output row, in words
  static_assert(packs_per_thread * bytes_per_pack % 4 == 0, "4 and 8 bits: whole words");
  thread uint32_t wq[results_per_simdgroup][pack_words];
  thread U sq[results_per_simdgroup], bq[results_per_simdgroup];
  int k = 0;
  for (; k < (FAST ? in_vec_size : in_vec_size - block_size); k += block_size) {  // qmv_impl: its last block safe
    for (int row = 0; row < results_per_simdgroup; row++) {  // fetched once for every x row
      const device uint32_t* wl = (const device uint32_t*)(ws + row * in_vec_size_w);
      for (int i = 0; i < pack_words; i++) {
        wq[row][i] = wl[i];
      }
      sq[row] = sc[row * in_vec_size_g];
      bq[row] = bi[row * in_vec_size_g];
    }
    for (int m = 0; m < ROWS; m++) {
      if (m < rows) {  // row m: MLX's one-row loop body, as it runs for x = row m alone
        U sum = load_vector<T, U, values_per_thread, BITS>(xs + m * in_vec_size, x_thread);
        for (int row = 0; row < results_per_simdgroup; row++) {
          result[m][row] += qdot_thread<U, values_per_thread, BITS>((const thread uint8_t*)wq[row], x_thread, sq[row],
                                                                    bq[row], sum);
        }
      }
    }
    ws += block_size * bytes_per_pack / pack_factor;
    sc += block_size / G;
    bi += block_size / G;
    xs += block_size;
  }
  const int remaining = clamp(static_cast<int>(in_vec_size - k - simd_lid * values_per_thread), 0, values_per_thread);
  if (!FAST && remaining > 0) {
    for (int m = 0; m < ROWS; m++) {
      if (m < rows) {
        U sum = load_vector_safe<T, U, values_per_thread, BITS>(xs + m * in_vec_size, x_thread, remaining);
        for (int row = 0; row < results_per_simdgroup; row++) {
          auto wl = (const device uint8_t*)(ws + row * in_vec_size_w);
          const device S* sl = sc + row * in_vec_size_g;
          const device S* bl = bi + row * in_vec_size_g;
          U s = sl[0];
          U b = bl[0];
          result[m][row] += qdot_safe<U, values_per_thread, BITS>(wl, x_thread, s, b, sum, remaining);
        }
      }
    }
  }
  for (int m = 0; m < ROWS; m++) {
    if (m < rows) {
      for (int row = 0; row < results_per_simdgroup; row++) {
        result[m][row] = simd_sum(result[m][row]);
        if (simd_lid == 0) {
          y[m * out_vec_size + out_row + row] = static_cast<T>(result[m][row]);
        }
      }
    }
  }
"""


def mlx_metal_header(name: str = "quantized.h") -> str:
    """One of the installed MLX's Metal kernel headers (its wheels ship them), or KernelUnavailable."""
    import mlx

    for root in getattr(mlx, "__path__", []):
        path = Path(root) / "include" / "mlx" / "backend" / "metal" / "kernels" / name
        if path.is_file():
            return path.read_text()
    raise KernelUnavailable(f"MLX's Metal header {name} is not installed with mlx")


def _function(text: str, start: str, end: str) -> str:
    """From the `template` line before `start` to the one before `end` (KernelUnavailable if either is missing)."""
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise KernelUnavailable(f"MLX's quantized.h has no {start!r} before {end!r}")
    return text[text.rfind("template", 0, i) : text.rfind("template", 0, j)]


def mlx_helpers(text: str) -> str:
    """MLX's get_pack_factor, get_bytes_per_pack, load_vector(_safe) and qdot(_safe), as the installed MLX has them."""
    return _function(text, "inline constexpr short get_pack_factor", "qouter(const thread uint8_t* w")


def qdot_on_registers(text: str) -> str:
    """MLX's qdot, reading the weight bytes from the thread's own copy: the same arithmetic on the same values (a
    verify pass fetches each lane's packs once for all its rows)."""
    qdot = _function(text, "inline U qdot(", "inline U qdot_safe(")
    ours = (qdot.replace("inline U qdot(", "inline U qdot_thread(").replace("const device uint8_t* w", "const thread uint8_t* w")
            .replace("const device uint16_t* ws = (const device uint16_t*)w", "const thread uint16_t* ws = (const thread uint16_t*)w"))
    if "device" in ours:
        raise KernelUnavailable("MLX's qdot reads its weights otherwise than the mirrored one")
    return ours


def qmv_digest(text: str) -> str:
    """The mirrored loops' identity: qmv_fast_impl's and qmv_impl's text with whitespace collapsed."""
    impls = (_function(text, "METAL_FUNC void qmv_fast_impl(", "METAL_FUNC void qmv_impl(")
             + _function(text, "METAL_FUNC void qmv_impl(", "METAL_FUNC void qmv_wide_impl("))
    return hashlib.sha256(re.sub(r"\s+", " ", impls).strip().encode()).hexdigest()[:16]


def header(text: str | None = None) -> str:
    """The kernel's header: MLX's helpers, where the installed MLX's qmv_fast_impl and qmv_impl are the mirrored ones."""
    text = text if text is not None else mlx_metal_header()
    digest = qmv_digest(text)
    if digest not in MIRRORED:
        raise KernelUnavailable(f"MLX {mx.__version__}'s qmv_fast_impl / qmv_impl ({digest}) are not the ones this "
                                f"kernel mirrors (MLX {', '.join(MIRRORED.values())})")
    return mlx_helpers(text) + qdot_on_registers(text)


def fast(k: int, bits: int) -> bool:
    """Does MLX's one-row call run qmv_fast (K a multiple of its block), or qmv (its last block bounds-checked)?"""
    return k % BLOCK[bits] == 0


FLOATS = (mx.float16, mx.bfloat16, mx.float32)


def supports(n: int, k: int, group_size: int, bits: int, scale_dtype) -> bool:
    """Where MLX's one-row call runs qmv_fast or qmv over whole tiles of 8 outputs (not qmv_quad's K of 64 or 128)."""
    return (bits in BITS and n % 8 == 0 and n > 0 and k % group_size == 0 and k not in (64, 128)
            and group_size in (32, 64, 128) and scale_dtype in FLOATS)


def template_args(dtype, scale_dtype, group_size: int, bits: int, rows: int, k: int) -> list[tuple]:
    """dtype: the call's (x's and the scales' promoted, as MLX's quantized_matmul casts them)."""
    return [("T", dtype), ("S", scale_dtype), ("G", group_size), ("BITS", bits), ("ROWS", row_capacity(rows)),
            ("FAST", int(fast(k, bits)))]


def mlx_rows_function(make: Callable | None = None) -> Callable[..., mx.array]:
    """qmm(x, w, scales, biases, group_size, bits): one row through MLX's op, 2-16 through the kernel (same bits
    a row, where the self-check found them). make: mx.fast.metal_kernel or a stand-in (tests)."""
    if make is None:
        from .gpu import require_metal

        require_metal()
        make = mx.fast.metal_kernel
    kernel = make(name=NAME, input_names=INPUTS, output_names=OUTPUTS, source=BODY, header=header())

    def qmm(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int,
            mode: str = "affine", **_) -> mx.array:
        k, n = x.shape[-1], w.shape[0]
        rows = x.size // k
        if rows == 1 or mode != "affine":
            return mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size=group_size, bits=bits, mode=mode)
        dtype = mx.result_type(x, scales)  # MLX's call casts x, scales and biases to it (a GGUF's float32 rows)
        if not supports(n, k, group_size, bits, scales.dtype) or dtype not in FLOATS:
            raise ValueError(f"mlx-rows qmm: {x.dtype} over {n} x {k} {bits}-bit g{group_size} unsupported")
        flat = x.reshape(rows, k)
        flat = flat if flat.dtype == dtype else flat.astype(dtype)
        parts = [kernel(inputs=[flat[i : i + MAX_ROWS], w, scales, biases], grid=(32, 2 * (n // 8), 1),
                        template=template_args(dtype, scales.dtype, group_size, bits, min(MAX_ROWS, rows - i), k),
                        threadgroup=(32, 2, 1), output_shapes=[(min(MAX_ROWS, rows - i), n)], output_dtypes=[dtype])[0]
                 for i in range(0, rows, MAX_ROWS)]  # a row's bits do not depend on the rows beside it
        return (parts[0] if len(parts) == 1 else mx.concatenate(parts)).reshape(*x.shape[:-1], n)

    qmm.supports = supports
    return qmm


def x_dtypes(scale_dtype) -> list:
    """The rows a self-check multiplies: the model's (its scales' dtype) and float32 (a GGUF's)."""
    return list(dict.fromkeys([scale_dtype, mx.float32]))


def self_check(qmm: Callable[..., mx.array], n: int, k: int, group_size: int, bits: int, scale_dtype) -> str | None:
    """None if, for x in the scales' dtype and in float32 (a GGUF's rows), every row of a 16-row and a 5-row call
    carries the bits of MLX's own one-row call and the result is within the reference's tolerance, else what
    differs."""
    from .reference import random_quantized, within_tolerance

    key = mx.random.key(n * 7919 + k + 1)
    w, s, b = random_quantized(n, k, group_size, bits, scale_dtype, key=key)
    for x_dtype in x_dtypes(scale_dtype):
        x = mx.random.normal((MAX_ROWS, k), key=mx.random.split(key)[1]).astype(x_dtype)
        y = qmm(x, w, s, b, group_size, bits)
        for i in range(MAX_ROWS):
            one = mx.quantized_matmul(x[i : i + 1], w, s, b, transpose=True, group_size=group_size, bits=bits)
            if not mx.array_equal(one[0], y[i]).item():
                return f"{x_dtype} rows: row {i} of a {MAX_ROWS}-row call differs from MLX's one-row call"
        if not mx.array_equal(qmm(x[:5], w, s, b, group_size, bits), y[:5]).item():
            return f"{x_dtype} rows: a 5-row call differs from the 16-row call's rows"
        ok, ratio = within_tolerance(y, x, w, s, b, group_size, bits)
        if not ok:
            return f"{x_dtype} rows: error {ratio:.3g}x the tolerance"
    return None
