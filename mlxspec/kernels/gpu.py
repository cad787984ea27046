"""The GPU kernels through MLX's JIT: Metal on Apple GPUs, CUDA on NVIDIA (sources: gpu_source.py).

    qmm = metal_qmm_function()     # or cuda_qmm_function(); KernelUnavailable where there is no such GPU
    y = qmm(x, w, scales, biases, group_size, bits)     # x (..., K) -> (..., N), on the GPU stream
    y = qmm(x, w, scales, None, 32, 4, mode="mxfp4")    # gpt-oss's layers
    gather = metal_gather_qmm_function()   # or cuda_...: MoE experts, w (E, N, .), indices (P,)
    y = gather(x, w, scales, biases, indices, group_size, bits)   # x (P, K) -> (P, N)
    y = gather(..., per_expert=T)   # T tokens' rows: each chosen expert read once, the same bits
    qmm = cuda_mma_qmm_function(fallback)   # CUDA tensor cores: float16/bfloat16 x, 2-6/8-bit affine
    qmm = metal_mma_qmm_function(fallback)  # Metal simdgroup matrices: any x, 2-6/8-bit affine
    dense = metal_dense_function()  # or cuda_dense_function()
    y = dense(x, w)                                      # x (..., K), w (N, K) -> (..., N)

Rows run in launches of up to MAX_ROWS, each compiled for the smallest row capacity (1, 2, 4, 8, 16)
that holds them (fewer registers for plain decoding's one row); the tensor-core and simdgroup-matrix
qmms take any number of rows in one launch (8 to 64 a warp; 8 or 16 a simdgroup). Every row's result
is the same whatever the launch's row count and capacity. These cannot run on the Linux CPU machines
where mlxspec is developed: the registry runs the same self-check as for the CPU kernel on the
user's device before any layer uses them.
"""

from __future__ import annotations

import functools
from typing import Callable

import mlx.core as mx

from .build import KernelUnavailable
from .cuda_cache import cuda_kernel
from .gpu_source import (COLS, CUDA_BODY, CUDA_DENSE_BODY, CUDA_GATHER_BODY, CUDA_GROUPED_BODY, CUDA_HEADER,
                         DENSE_INPUTS, DENSE_NAME, GATHER_INPUTS, GATHER_NAME, GROUPED_NAME, INPUTS, MAX_ROWS,
                         METAL_BODY, METAL_DENSE_BODY, METAL_GATHER_BODY, METAL_GROUPED_BODY, METAL_HEADER, MODES,
                         NAME, OUTPUTS, THREADGROUP, dense_template_args, template_args)
from . import gpu_mma_source as mma
from . import gpu_simdgroup_source as simdgroup
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


def cuda_qmm_function(make: Callable | None = None) -> Callable[..., mx.array]:
    """make: mx.fast.cuda_kernel's stand-in (default: cuda_cache's, on a CUDA device; benchmarks/prebuild_store.py
    passes one that only compiles, to fill the kernel store without a GPU)."""
    kernel = cuda_maker(make)(name=NAME, input_names=INPUTS, output_names=OUTPUTS, source=CUDA_BODY, header=CUDA_HEADER)
    return _qmm_function(kernel)


def metal_gather_qmm_function() -> Callable[..., mx.array]:
    require_metal()
    kernels = [mx.fast.metal_kernel(name=name, input_names=GATHER_INPUTS, output_names=OUTPUTS, source=body,
                                    header=METAL_HEADER)
               for name, body in ((GATHER_NAME, METAL_GATHER_BODY), (GROUPED_NAME, METAL_GROUPED_BODY))]
    return _gather_function(*kernels)


def cuda_gather_qmm_function(make: Callable | None = None) -> Callable[..., mx.array]:
    make = cuda_maker(make)
    kernels = [make(name=name, input_names=GATHER_INPUTS, output_names=OUTPUTS, source=body, header=CUDA_HEADER)
               for name, body in ((GATHER_NAME, CUDA_GATHER_BODY), (GROUPED_NAME, CUDA_GROUPED_BODY))]
    return _gather_function(*kernels)


def metal_dense_function() -> Callable[..., mx.array]:
    require_metal()
    kernel = mx.fast.metal_kernel(name=DENSE_NAME, input_names=DENSE_INPUTS, output_names=OUTPUTS,
                                  source=METAL_DENSE_BODY, header=METAL_HEADER)
    return _dense_function(kernel)


def cuda_dense_function(make: Callable | None = None) -> Callable[..., mx.array]:
    kernel = cuda_maker(make)(name=DENSE_NAME, input_names=DENSE_INPUTS, output_names=OUTPUTS,
                               source=CUDA_DENSE_BODY, header=CUDA_HEADER)
    return _dense_function(kernel)


def cuda_mma_qmm_function(fallback: Callable[..., mx.array] | None = None, tiles: int | None = None,
                          ksplit: int = mma.KSPLIT, make: Callable | None = None) -> Callable[..., mx.array]:
    """The tensor-core qmm (gpu_mma_source.py): float16 / bfloat16 x, 2-6 or 8-bit affine layers, any
    number of rows in one launch. Other calls (float32 x) go to `fallback` (the FMA kernel), so a
    layer's dtype always meets one kernel. `tiles` (16-column tiles per threadgroup) trades
    parallelism for x's reuse; it does not change the bits, so by default it follows the row count
    (mma.tiles_for). `ksplit` (warps splitting K) does: a layer keeps the default."""
    kernel = cuda_maker(make)(name=mma.NAME, input_names=mma.INPUTS, output_names=mma.OUTPUTS, source=mma.BODY,
                               header=mma.HEADER)
    return _matrix_qmm(kernel, mma, fallback, tiles, ksplit,
                       lambda other: cuda_mma_qmm_function(fallback, tiles, other, make))


def cuda_maker(make: Callable | None) -> Callable:
    """The kernel maker: `make` where given, else cuda_cache's, on a CUDA device only."""
    if make is not None:
        return make
    require_cuda()
    return cuda_kernel


def metal_mma_qmm_function(fallback: Callable[..., mx.array] | None = None, tiles: int | None = None,
                           ksplit: int = simdgroup.KSPLIT) -> Callable[..., mx.array]:
    """The simdgroup-matrix qmm (gpu_simdgroup_source.py): 2-6 or 8-bit affine layers, any x dtype, any
    number of rows in one launch; other layouts (mxfp4) go to `fallback` (the FMA kernel), as on CUDA."""
    require_metal()
    kernel = mx.fast.metal_kernel(name=simdgroup.NAME, input_names=simdgroup.INPUTS, output_names=simdgroup.OUTPUTS,
                                  source=simdgroup.BODY, header=simdgroup.HEADER)
    return _matrix_qmm(kernel, simdgroup, fallback, tiles, ksplit,
                       lambda other: metal_mma_qmm_function(fallback, tiles, other))


def _matrix_qmm(kernel, source, fallback, tiles: int | None, ksplit: int, make: Callable[[int], Callable]):
    """The Python side of a matrix-unit qmm (`source`: gpu_mma_source or gpu_simdgroup_source): one launch
    for any row count; what the source does not support goes to `fallback`; make(k): the build with k
    warps / simdgroups splitting K."""
    kind = "tensor-core" if source is mma else "simdgroup"

    def qmm(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array | None, group_size: int, bits: int,
            mode: str = "affine") -> mx.array:
        lead, k, n = x.shape[:-1], x.shape[-1], w.shape[0]
        m = x.size // k if k else 0
        plan = _mma_plan(source, x.dtype, scales.dtype, group_size, bits, mode, tiles or source.tiles_for(m), ksplit,
                         m, n, k)
        if plan is None:
            if fallback is None:
                raise ValueError(f"{kind} qmm: x {x.dtype}, group size {group_size}, {bits} bits, {mode} unsupported")
            return fallback(x, w, scales, biases, group_size, bits, **({} if mode == "affine" else {"mode": mode}))
        targs, launch, out_type = plan
        if m == 0:
            return mx.zeros((*lead, n), out_type)
        rows = x if x.ndim == 2 else x.reshape(m, k)  # y is written row-major: it takes x's leading shape as is
        return kernel(inputs=[rows, w, scales, biases], template=targs, output_shapes=[(*lead, n)],
                      output_dtypes=[out_type], **launch)[0]

    def prepare(x_dtypes, scale_dtype, group_size: int, bits: int, mode: str = "affine",
                rows: tuple[int, ...] = (*range(1, MAX_ROWS + 1), 72)) -> None:
        """As the FMA qmm's prepare: the builds of 1 to 16 rows and a 72-row self-check (tiles, row tiles);
        `rows`: only those (the timing of another K split: timing.prefer_tensor_cores)."""
        own = [d for d in x_dtypes if source.supports(d, group_size, bits, mode)]
        if fallback is not None and hasattr(fallback, "prepare"):
            fallback.prepare([d for d in x_dtypes if d not in own], scale_dtype, group_size, bits, mode)
        if hasattr(kernel, "prebuild"):
            out = {d: output_dtype(d, scale_dtype) for d in own}
            kernel.prebuild([([d, mx.uint32, scale_dtype, scale_dtype], [2, 2, 2, 2], [out[d]],
                              source.template_args(d, scale_dtype, out[d], group_size, bits,
                                                   tiles or source.tiles_for(m), m, ksplit))
                             for d in own for m in rows])

    variants: dict[int, Callable[..., mx.array]] = {ksplit: qmm}

    def with_ksplit(other: int) -> Callable[..., mx.array]:
        """This qmm with `other` warps splitting K: other bits, so a layer shape keeps one (timing.py)."""
        if other not in variants:
            variants[other] = make(other)
        return variants[other]

    qmm.prepare, qmm.ksplit, qmm.with_ksplit = prepare, ksplit, with_ksplit
    return qmm


@functools.lru_cache(maxsize=4096)
def _mma_plan(source, x_dtype, scale_dtype, group_size: int, bits: int, mode: str, tiles: int, ksplit: int, m: int,
              n: int, k: int):
    """(template args, launch grid, output dtype) of a matrix-unit launch, None where it cannot run:
    once per shape, not per call (building them cost ~2 us of a call's ~6 us of Python)."""
    if not source.supports(x_dtype, group_size, bits, mode) or k % group_size:
        return None
    out_type = output_dtype(x_dtype, scale_dtype)
    return (source.template_args(x_dtype, scale_dtype, out_type, group_size, bits, tiles, max(m, 1), ksplit),
            source.launch(max(m, 1), n, tiles, ksplit), out_type)


def _rows(kernel, x: mx.array, weights: list[mx.array], n: int, plan: Callable[[int], tuple]) -> mx.array:
    """Launch over x's rows (leading dims flattened), MAX_ROWS rows a launch (COLS output columns per
    warp); plan(rows) -> (template args, output dtype), cached per shape."""
    lead, k = x.shape[:-1], x.shape[-1]
    m = x.size // k if k else 0
    launch = dict(grid=(32, (n + COLS - 1) // COLS, 1), threadgroup=THREADGROUP)
    if 0 < m <= MAX_ROWS:  # one launch; y is written row-major, so it takes x's leading shape as is
        targs, out_type = plan(m)
        rows = x if x.ndim == 2 else x.reshape(m, k)
        return kernel(inputs=[rows, *weights], template=targs, output_shapes=[(*lead, n)], output_dtypes=[out_type],
                      **launch)[0]
    rows, parts = x.reshape(-1, k), []
    for r in range(0, m, MAX_ROWS):
        chunk = rows[r : r + MAX_ROWS]
        targs, out_type = plan(chunk.shape[0])
        parts += kernel(inputs=[chunk, *weights], template=targs, output_shapes=[(chunk.shape[0], n)],
                        output_dtypes=[out_type], **launch)
    return mx.concatenate(parts).reshape(*lead, n) if parts else mx.zeros((*lead, n), plan(1)[1])


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
        # 8 elements: MLX puts a Metal input of fewer in constant space, and the kernels' `MODE == 0 ? biases[g] :
        # scales[g]` would then mix address spaces (unknown to Apple's compiler; the emulator cannot tell)
        UNUSED_BIASES[mode] = mx.zeros((8,), scales.dtype)
    return UNUSED_BIASES[mode]


@functools.lru_cache(maxsize=4096)
def _qmm_plan(x_dtype, scale_dtype, group_size: int, bits: int, mode: str, k: int, rows: int) -> tuple:
    """(template args, output dtype) of a qmm launch of `rows` rows, once per shape (ValueError: unsupported)."""
    _check_layout(k, group_size, bits, mode)
    out_type = output_dtype(x_dtype, scale_dtype)
    return template_args(x_dtype, scale_dtype, out_type, group_size, bits, mode, rows), out_type


@functools.lru_cache(maxsize=1024)
def _dense_plan(x_dtype, w_dtype, rows: int) -> tuple:
    out_type = output_dtype(x_dtype, w_dtype)
    return dense_template_args(x_dtype, w_dtype, out_type, rows), out_type


def _qmm_function(kernel) -> Callable[..., mx.array]:
    def qmm(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array | None, group_size: int, bits: int,
            mode: str = "affine") -> mx.array:
        plan = functools.partial(_qmm_plan, x.dtype, scales.dtype, group_size, bits, mode, x.shape[-1])  # checks it
        return _rows(kernel, x, [w, scales, _biases(biases, scales, mode)], w.shape[0], plan)

    def prepare(x_dtypes, scale_dtype, group_size: int, bits: int, mode: str = "affine") -> None:
        """Compile every row capacity's launch for this layout at once, where the kernel can (a stored CUDA
        kernel: cuda_cache.py, on threads); MLX's JIT compiles each at its first launch instead."""
        if hasattr(kernel, "prebuild"):
            launches = []
            for x_dtype in x_dtypes:
                for rows in (1, 2, 4, 8, MAX_ROWS):
                    try:
                        targs, out_type = _qmm_plan(x_dtype, scale_dtype, group_size, bits, mode, group_size, rows)
                    except ValueError:  # a layout this kernel does not take: its check says so
                        break
                    biases_ndim = 2 if MODES[mode] == 0 else 1  # mxfp4's stand-in (_biases)
                    launches.append(([x_dtype, mx.uint32, scale_dtype, scale_dtype], [2, 2, 2, biases_ndim], [out_type],
                                     targs))
            kernel.prebuild(launches)

    qmm.prepare = prepare
    return qmm


def _gather_function(kernel, grouped=None) -> Callable[..., mx.array]:
    def gather_qmm(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array | None, indices: mx.array,
                   group_size: int, bits: int, mode: str = "affine", per_expert: int = 1) -> mx.array:
        """x (P, K), w (E, N, .), indices (P,) -> (P, N): row p times expert indices[p], as qmm's one row.
        per_expert > 1 (at most that many rows on one expert: a verify pass's tokens): the grouped kernel
        reads each chosen expert once for all its rows, with the same bits per row."""
        grouping = grouped is not None and per_expert > 1
        targs, out_type = _qmm_plan(x.dtype, scales.dtype, group_size, bits, mode, x.shape[-1],
                                    min(per_expert, MAX_ROWS) if grouping else 1)  # one row per z, ungrouped
        rows, n = x.shape[0], w.shape[1]
        if rows == 0:
            return mx.zeros((0, n), out_type)
        inputs = [x, w, scales, _biases(biases, scales, mode), indices.astype(mx.uint32)]
        if grouping:  # grid z: the experts; more rows than ROWS: more passes
            return grouped(inputs=inputs, template=targs, grid=(32, (n + COLS - 1) // COLS, w.shape[0]),
                           threadgroup=THREADGROUP, output_shapes=[(rows, n)], output_dtypes=[out_type])[0]
        return kernel(inputs=inputs, template=targs, grid=(32, (n + COLS - 1) // COLS, rows), threadgroup=THREADGROUP,
                      output_shapes=[(rows, n)], output_dtypes=[out_type])[0]

    def prepare(x_dtypes, scale_dtype, group_size: int, bits: int, mode: str = "affine") -> None:
        """As the qmm's prepare: the gather's one-row build and the grouped one's row capacities (2, 4, 8, 16:
        the rows an expert gets in a verify pass) for each activation dtype, compiled at once where they can."""
        for k_, capacities in ((kernel, (1,)), (grouped, (2, 4, 8, MAX_ROWS))):
            if not hasattr(k_, "prebuild"):
                continue
            biases_ndim = 3 if MODES[mode] == 0 else 1  # mxfp4's stand-in (_biases)
            launches = []
            for x_dtype in x_dtypes:
                for rows in capacities:
                    try:
                        targs, out_type = _qmm_plan(x_dtype, scale_dtype, group_size, bits, mode, group_size, rows)
                    except ValueError:  # a layout this kernel does not take: its check says so
                        break
                    launches.append(([x_dtype, mx.uint32, scale_dtype, scale_dtype, mx.uint32], [2, 3, 3, biases_ndim, 1],
                                     [out_type], targs))
            k_.prebuild(launches)

    gather_qmm.groups_experts = grouped is not None
    gather_qmm.prepare = prepare
    return gather_qmm


def _dense_function(kernel) -> Callable[..., mx.array]:
    def dense(x: mx.array, w: mx.array) -> mx.array:
        return _rows(kernel, x, [w], w.shape[0], functools.partial(_dense_plan, x.dtype, w.dtype))

    def prepare(dtype) -> None:
        """Compile every row capacity's launch for `dtype` rows over `dtype` weights at once, where it can."""
        if hasattr(kernel, "prebuild"):
            kernel.prebuild([([dtype, dtype], [2, 2], [plan[1]], plan[0])
                             for plan in (_dense_plan(dtype, dtype, rows) for rows in (1, 2, 4, 8, MAX_ROWS))])

    dense.prepare = prepare
    return dense
