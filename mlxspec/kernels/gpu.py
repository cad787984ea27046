"""The GPU kernels through MLX's JIT: Metal on Apple GPUs, CUDA on NVIDIA (sources: gpu_source.py).

    qmm = metal_qmm_function()     # or cuda_qmm_function(); KernelUnavailable where there is no such GPU
    y = qmm(x, w, scales, biases, group_size, bits)     # x (..., K) -> (..., N), on the GPU stream
    dense = metal_dense_function()  # or cuda_dense_function()
    y = dense(x, w)                                      # x (..., K), w (N, K) -> (..., N)

Rows run in launches of up to MAX_ROWS; every row's result is the same whatever the launch's row
count. These cannot run on the Linux CPU machines where mlxspec is developed: the registry runs the
same self-check as for the CPU kernel on the user's device before any layer uses them.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from .build import KernelUnavailable
from .gpu_source import (COLS, CUDA_BODY, CUDA_DENSE_BODY, CUDA_HEADER, DENSE_INPUTS, DENSE_NAME, INPUTS, MAX_ROWS,
                         METAL_BODY, METAL_DENSE_BODY, METAL_HEADER, NAME, OUTPUTS, THREADGROUP,
                         dense_template_args, template_args)
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


def _rows(kernel, x: mx.array, weights: list[mx.array], n: int, targs: list, out_type) -> mx.array:
    """Flatten x's leading dims, launch per chunk of MAX_ROWS rows, restore the shape."""
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k)
    parts = []
    for r in range(0, rows.shape[0], MAX_ROWS):
        chunk = rows[r : r + MAX_ROWS]
        parts += kernel(inputs=[chunk, *weights], template=targs, grid=(32, (n + COLS - 1) // COLS, 1),
                        threadgroup=THREADGROUP, output_shapes=[(chunk.shape[0], n)], output_dtypes=[out_type])
    y = parts[0] if len(parts) == 1 else mx.concatenate(parts) if parts else mx.zeros((0, n), out_type)
    return y.reshape(*lead, n)


def _qmm_function(kernel) -> Callable[..., mx.array]:
    def qmm(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int) -> mx.array:
        if x.shape[-1] % group_size or group_size not in (32, 64, 128) or bits not in (4, 8):
            raise ValueError(f"qmm kernel: K={x.shape[-1]}, group size {group_size}, {bits} bits unsupported")
        out_type = output_dtype(x.dtype, scales.dtype)
        targs = template_args(x.dtype, scales.dtype, out_type, group_size, bits)
        return _rows(kernel, x, [w, scales, biases], w.shape[0], targs, out_type)

    return qmm


def _dense_function(kernel) -> Callable[..., mx.array]:
    def dense(x: mx.array, w: mx.array) -> mx.array:
        out_type = output_dtype(x.dtype, w.dtype)
        return _rows(kernel, x, [w], w.shape[0], dense_template_args(x.dtype, w.dtype, out_type), out_type)

    return dense
