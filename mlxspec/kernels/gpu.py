"""The GPU kernel through MLX's JIT: Metal on Apple GPUs, CUDA on NVIDIA (source: gpu_source.py).

    qmm = metal_qmm_function()   # or cuda_qmm_function(); KernelUnavailable where there is no such GPU
    y = qmm(x, w, scales, biases, group_size, bits)     # x (..., K) -> (..., N), on the GPU stream

These cannot run on the Linux CPU machines where mlxspec is developed: the registry runs the same
self-check as for the CPU kernel on the user's device before any layer uses them.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from .build import KernelUnavailable
from .gpu_source import (CUDA_BODY, CUDA_HEADER, INPUTS, MAX_ROWS, METAL_BODY, METAL_HEADER, NAME, OUTPUTS,
                         THREADGROUP, template_args)
from .reference import output_dtype


def metal_qmm_function() -> Callable[..., mx.array]:
    if not mx.metal.is_available():
        raise KernelUnavailable("no Metal device")
    kernel = mx.fast.metal_kernel(name=NAME, input_names=INPUTS, output_names=OUTPUTS, source=METAL_BODY,
                                  header=METAL_HEADER)
    return _rows_function(kernel)


def cuda_qmm_function() -> Callable[..., mx.array]:
    if not (hasattr(mx, "cuda") and mx.cuda.is_available()):
        raise KernelUnavailable("no CUDA device")
    kernel = mx.fast.cuda_kernel(name=NAME, input_names=INPUTS, output_names=OUTPUTS, source=CUDA_BODY,
                                 header=CUDA_HEADER)
    return _rows_function(kernel)


def _rows_function(kernel) -> Callable[..., mx.array]:
    """Wrap a JIT kernel: flatten leading dims, launch per chunk of MAX_ROWS rows, restore the shape."""

    def qmm(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int) -> mx.array:
        lead, k = x.shape[:-1], x.shape[-1]
        n, out_type = w.shape[0], output_dtype(x.dtype, scales.dtype)
        rows = x.reshape(-1, k)
        targs = template_args(x.dtype, scales.dtype, out_type, group_size, bits)
        parts = []
        for r in range(0, rows.shape[0], MAX_ROWS):
            chunk = rows[r : r + MAX_ROWS]
            parts += kernel(inputs=[chunk, w, scales, biases], template=targs, grid=(32, n, 1),
                            threadgroup=THREADGROUP, output_shapes=[(chunk.shape[0], n)], output_dtypes=[out_type])
        y = parts[0] if len(parts) == 1 else mx.concatenate(parts) if parts else mx.zeros((0, n), out_type)
        return y.reshape(*lead, n)

    return qmm
