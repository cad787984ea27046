"""The GPU kernels through MLX's JIT: Metal on Apple GPUs, CUDA on NVIDIA (sources: gpu_source.py).

    qmm = metal_qmm_function()     # or cuda_qmm_function(); KernelUnavailable where there is no such GPU
    y = qmm(x, w, scales, biases, group_size, bits)     # x (..., K) -> (..., N), on the GPU stream
    y = qmm(x, w, scales, None, 32, 4, mode="mxfp4")    # gpt-oss's layers
    gather = metal_gather_qmm_function()   # or cuda_...: MoE experts, w (E, N, .), indices (P,)
    y = gather(x, w, scales, biases, indices, group_size, bits)   # x (P, K) -> (P, N)
    y = gather(..., per_expert=T)   # T tokens' rows: each chosen expert read once, the same bits
    qmm = cuda_mma_qmm_function(fallback)   # CUDA tensor cores: float16/bfloat16 x, 2-6/8-bit affine
    dense = metal_dense_function()  # or cuda_dense_function()
    y = dense(x, w)                                      # x (..., K), w (N, K) -> (..., N)

Rows run in launches of up to MAX_ROWS, each compiled for the smallest row capacity (1, 2, 4, 8, 16)
that holds them (fewer registers for plain decoding's one row); the tensor-core qmm takes any number
of rows in one launch (8 to 64 a warp). Every row's result is the same whatever the launch's row
count and capacity. These cannot run on the Linux CPU machines where mlxspec is developed: the registry runs the
same self-check as for the CPU kernel on the user's device before any layer uses them.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from .build import KernelUnavailable
from .gpu_source import (COLS, CUDA_BODY, CUDA_DENSE_BODY, CUDA_GATHER_BODY, CUDA_GROUPED_BODY, CUDA_HEADER,
                         DENSE_INPUTS, DENSE_NAME, GATHER_INPUTS, GATHER_NAME, GROUPED_NAME, INPUTS, MAX_ROWS,
                         METAL_BODY, METAL_DENSE_BODY, METAL_GATHER_BODY, METAL_GROUPED_BODY, METAL_HEADER, MODES,
                         NAME, OUTPUTS, THREADGROUP, dense_template_args, row_capacity, template_args)
from . import gpu_mma_source as mma
from .reference import output_dtype


def require_metal() -> None:
    if not mx.metal.is_available():
        raise KernelUnavailable("no Metal device")


def require_cuda() -> None:
    if not (hasattr(mx, "cuda") and mx.cuda.is_available()):
        raise KernelUnavailable("no CUDA device")


def metal_qmm_function() -> Callable[..., mx.array]:
    require_metal()
    kernel = mx.fast.metal_kernel(name=NAME, input_names=INPUTS, output_names=OUTPUTS, source=METAL_BODY,
                                  header=METAL_HEADER)
    return _qmm_function(kernel)


def cuda_qmm_function() -> Callable[..., mx.array]:
    require_cuda()
    kernel = mx.fast.cuda_kernel(name=NAME, input_names=INPUTS, output_names=OUTPUTS, source=CUDA_BODY,
                                 header=CUDA_HEADER)
    return _qmm_function(kernel)


def metal_gather_qmm_function() -> Callable[..., mx.array]:
    require_metal()
    kernels = [mx.fast.metal_kernel(name=name, input_names=GATHER_INPUTS, output_names=OUTPUTS, source=body,
                                    header=METAL_HEADER)
               for name, body in ((GATHER_NAME, METAL_GATHER_BODY), (GROUPED_NAME, METAL_GROUPED_BODY))]
    return _gather_function(*kernels)


def cuda_gather_qmm_function() -> Callable[..., mx.array]:
    require_cuda()
    kernels = [mx.fast.cuda_kernel(name=name, input_names=GATHER_INPUTS, output_names=OUTPUTS, source=body,
                                   header=CUDA_HEADER)
               for name, body in ((GATHER_NAME, CUDA_GATHER_BODY), (GROUPED_NAME, CUDA_GROUPED_BODY))]
    return _gather_function(*kernels)


def metal_dense_function() -> Callable[..., mx.array]:
    require_metal()
    kernel = mx.fast.metal_kernel(name=DENSE_NAME, input_names=DENSE_INPUTS, output_names=OUTPUTS,
                                  source=METAL_DENSE_BODY, header=METAL_HEADER)
    return _dense_function(kernel)


def cuda_dense_function() -> Callable[..., mx.array]:
    require_cuda()
    kernel = mx.fast.cuda_kernel(name=DENSE_NAME, input_names=DENSE_INPUTS, output_names=OUTPUTS,
                                 source=CUDA_DENSE_BODY, header=CUDA_HEADER)
    return _dense_function(kernel)


def cuda_mma_qmm_function(fallback: Callable[..., mx.array] | None = None, tiles: int = mma.TILES,
                          ksplit: int = mma.KSPLIT) -> Callable[..., mx.array]:
    """The tensor-core qmm (gpu_mma_source.py): float16 / bfloat16 x, 2-6 or 8-bit affine layers, any
    number of rows in one launch. Other calls (float32 x) go to `fallback` (the FMA kernel), so a
    layer's dtype always meets one kernel. `tiles` (16-column tiles per threadgroup) trades
    parallelism for x's reuse; it does not change the bits. `ksplit` (warps splitting K) does: a
    layer keeps the default."""
    require_cuda()
    kernel = mx.fast.cuda_kernel(name=mma.NAME, input_names=mma.INPUTS, output_names=mma.OUTPUTS, source=mma.BODY,
                                 header=mma.HEADER)

    def qmm(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array | None, group_size: int, bits: int,
            mode: str = "affine") -> mx.array:
        if not mma.supports(x.dtype, group_size, bits, mode) or x.shape[-1] % group_size:
            if fallback is None:
                raise ValueError(f"tensor-core qmm: x {x.dtype}, group size {group_size}, {bits} bits, {mode} unsupported")
            return fallback(x, w, scales, biases, group_size, bits, **({} if mode == "affine" else {"mode": mode}))
        out_type = output_dtype(x.dtype, scales.dtype)
        lead, k, n = x.shape[:-1], x.shape[-1], w.shape[0]
        rows = x.reshape(-1, k)
        if rows.shape[0] == 0:
            return mx.zeros((*lead, n), out_type)
        targs = mma.template_args(x.dtype, scales.dtype, out_type, group_size, bits, tiles, rows.shape[0], ksplit)
        y = kernel(inputs=[rows, w, scales, biases], template=targs, output_shapes=[(rows.shape[0], n)],
                   output_dtypes=[out_type], **mma.launch(rows.shape[0], n, tiles, ksplit))[0]
        return y.reshape(*lead, n)

    return qmm


def _rows(kernel, x: mx.array, weights: list[mx.array], n: int, targs: list, out_type) -> mx.array:
    """Flatten x's leading dims, launch per chunk of MAX_ROWS rows (COLS output columns per warp),
    restore the shape."""
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k)
    parts = []
    for r in range(0, rows.shape[0], MAX_ROWS):
        chunk = rows[r : r + MAX_ROWS]
        capacity = [(name, row_capacity(chunk.shape[0])) if name == "ROWS" else (name, v) for name, v in targs]
        parts += kernel(inputs=[chunk, *weights], template=capacity, grid=(32, (n + COLS - 1) // COLS, 1),
                        threadgroup=THREADGROUP, output_shapes=[(chunk.shape[0], n)], output_dtypes=[out_type])
    y = parts[0] if len(parts) == 1 else mx.concatenate(parts) if parts else mx.zeros((0, n), out_type)
    return y.reshape(*lead, n)


def _check_layout(k: int, group_size: int, bits: int, mode: str) -> None:
    layouts = {"affine": group_size in (32, 64, 128) and bits in AFFINE_BITS, "mxfp4": group_size == 32 and bits == 4}
    if k % group_size or not layouts.get(mode, False):
        raise ValueError(f"qmm kernel: K={k}, group size {group_size}, {bits} bits, mode {mode!r} unsupported")


AFFINE_BITS = (2, 3, 4, 5, 6, 8)  # every width MLX quantizes to (GGUF Q5_K / Q6_K layers load as 5 / 6 bits)
UNUSED_BIASES = {}  # mode -> the stand-in passed as `biases` where the mode has none (never read)


def _biases(biases: mx.array | None, scales: mx.array, mode: str) -> mx.array:
    if MODES[mode] == 0:
        return biases
    if mode not in UNUSED_BIASES:
        UNUSED_BIASES[mode] = mx.zeros((1,), scales.dtype)
    return UNUSED_BIASES[mode]


def _qmm_function(kernel) -> Callable[..., mx.array]:
    def qmm(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array | None, group_size: int, bits: int,
            mode: str = "affine") -> mx.array:
        _check_layout(x.shape[-1], group_size, bits, mode)
        out_type = output_dtype(x.dtype, scales.dtype)
        targs = template_args(x.dtype, scales.dtype, out_type, group_size, bits, mode)
        return _rows(kernel, x, [w, scales, _biases(biases, scales, mode)], w.shape[0], targs, out_type)

    return qmm


def _gather_function(kernel, grouped=None) -> Callable[..., mx.array]:
    def gather_qmm(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array | None, indices: mx.array,
                   group_size: int, bits: int, mode: str = "affine", per_expert: int = 1) -> mx.array:
        """x (P, K), w (E, N, .), indices (P,) -> (P, N): row p times expert indices[p], as qmm's one row.
        per_expert > 1 (at most that many rows on one expert: a verify pass's tokens): the grouped kernel
        reads each chosen expert once for all its rows, with the same bits per row."""
        _check_layout(x.shape[-1], group_size, bits, mode)
        out_type = output_dtype(x.dtype, scales.dtype)
        rows, n = x.shape[0], w.shape[1]
        if rows == 0:
            return mx.zeros((0, n), out_type)
        inputs = [x, w, scales, _biases(biases, scales, mode), indices.astype(mx.uint32)]
        if grouped is not None and per_expert > 1:  # grid z: the experts; more rows than ROWS: more passes
            targs = template_args(x.dtype, scales.dtype, out_type, group_size, bits, mode,
                                  rows=min(per_expert, MAX_ROWS))
            return grouped(inputs=inputs, template=targs, grid=(32, (n + COLS - 1) // COLS, w.shape[0]),
                           threadgroup=THREADGROUP, output_shapes=[(rows, n)], output_dtypes=[out_type])[0]
        targs = template_args(x.dtype, scales.dtype, out_type, group_size, bits, mode, rows=1)  # one row per z
        return kernel(inputs=inputs, template=targs, grid=(32, (n + COLS - 1) // COLS, rows), threadgroup=THREADGROUP,
                      output_shapes=[(rows, n)], output_dtypes=[out_type])[0]

    gather_qmm.groups_experts = grouped is not None
    return gather_qmm


def _dense_function(kernel) -> Callable[..., mx.array]:
    def dense(x: mx.array, w: mx.array) -> mx.array:
        out_type = output_dtype(x.dtype, w.dtype)
        return _rows(kernel, x, [w], w.shape[0], dense_template_args(x.dtype, w.dtype, out_type), out_type)

    return dense
