"""The few-row attention kernels through MLX's JIT (source: gpu_attention_source.py).

    sdpa = metal_sdpa_function()   # or cuda_sdpa_function(); KernelUnavailable where there is no such GPU
    o = sdpa(q, k, v, scale, causal)   # q (1, H, M, D), k (1, HKV, L, D), v (1, HKV, L, DV) -> (1, H, M, DV)

Row i of an M-row causal call is bit-identical to a 1-row call over keys [: L - M + i + 1], masked or
not (the mask is a runtime value: one compiled kernel). q, k and v are read in place through their
strides (ensure_row_contiguous=False): a KV cache view costs no copy.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from .gpu import require_cuda, require_metal
from .gpu_attention_source import (BODIES, CHUNK, COMBINE_INPUTS, COMBINE_NAME, COMBINE_OUTPUTS, HEADERS,
                                   MAX_VALUE_DIM, PARTIAL_INPUTS, PARTIAL_NAME, PARTIAL_OUTPUTS, THREADGROUP,
                                   combine_template, partial_template)


def metal_sdpa_function() -> Callable[..., mx.array]:
    require_metal()
    return _sdpa_function(mx.fast.metal_kernel, "metal")


def cuda_sdpa_function() -> Callable[..., mx.array]:
    require_cuda()
    return _sdpa_function(mx.fast.cuda_kernel, "cuda")


def _sdpa_function(make, backend: str) -> Callable[..., mx.array]:
    partial = make(name=PARTIAL_NAME, input_names=PARTIAL_INPUTS, output_names=PARTIAL_OUTPUTS,
                   source=BODIES[(backend, "partial")], header=HEADERS[backend], ensure_row_contiguous=False)
    combine = make(name=COMBINE_NAME, input_names=COMBINE_INPUTS, output_names=COMBINE_OUTPUTS,
                   source=BODIES[(backend, "combine")], header=HEADERS[backend])

    def sdpa(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool) -> mx.array:
        b, h, m, _ = q.shape
        hkv, length, dv = k.shape[1], k.shape[2], v.shape[3]
        same_dtype = q.dtype == k.dtype == v.dtype
        if b != 1 or h % hkv or dv > MAX_VALUE_DIM or not same_dtype or length == 0 or (causal and m > length):
            raise ValueError(f"sdpa kernel: q {q.shape} {q.dtype}, k {k.shape} {k.dtype}, v {v.shape} unsupported")
        nch, f32 = (length + CHUNK - 1) // CHUNK, mx.float32
        params = mx.array([scale, float(causal)], f32)
        pmax, psum, pacc = partial(inputs=[q, k, v, params], template=partial_template(q.dtype),
                                   grid=(32, h * m, nch), threadgroup=THREADGROUP,
                                   output_shapes=[(h * m, nch), (h * m, nch), (h * m, nch, dv)],
                                   output_dtypes=[f32, f32, f32])
        return combine(inputs=[pmax, psum, pacc], template=combine_template(q.dtype), grid=(32, h * m, 1),
                       threadgroup=THREADGROUP, output_shapes=[(1, h, m, dv)], output_dtypes=[q.dtype])[0]

    return sdpa
