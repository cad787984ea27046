"""The few-row attention kernels through MLX's JIT (source: gpu_attention_source.py).

    sdpa = metal_sdpa_function()   # or cuda_sdpa_function(); KernelUnavailable where there is no such GPU
    o = sdpa(q, k, v, scale, causal)   # q (1, H, M, D), k (1, HKV, L, D), v (1, HKV, L, DV) -> (1, H, M, DV)
    o = sdpa(q, k, v, scale, True, window=W, sinks=s)   # a sliding-window layer; s (H,): gpt-oss's sinks
    o = sdpa(q, k, v, scale, True, tree=tree_rows(parents, start))   # a draft tree's pass (tree_mask.py)

Row i of an M-row causal call is bit-identical to a 1-row call over keys [: L - M + i + 1], masked or
not (the mask is a runtime value: one compiled kernel), whether its block serves one query head or
several, whatever its warps; with a window, to a 1-row call over the last W
of them, wherever they sit in the cache. Keys and values share a dtype; float32 queries may read a
float16 cache (each value is read as float32 either way). `length=` (an array): only keys [0, length)
count, bit for bit as a call over k[:, :, :length] (a compiled step passes its cache buffer). With `tree`
(a draft tree whose nodes are keys start.. of the cache), row m sees the keys before the tree and its own
path's nodes, bit for bit as a one-row call over those keys laid out in order (tree.py's passes on GPUs). q, k and
v are read in place through their strides (ensure_row_contiguous=False): a KV cache view costs no copy. On CUDA
calls with a `length` (a compiled step's whole, row-contiguous buffers) launch row-contiguous twins of the same
bodies, compiled once per machine (cuda_cache), not by MLX's JIT in every process.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from . import gpu_attention_mma_source as mma_source
from . import gpu_attention_simdgroup_source as simdgroup_source
from .gpu import cuda_maker, require_metal
from .gpu_attention_source import (BODIES, CHUNK, COMBINE_INPUTS, COMBINE_NAME, COMBINE_OUTPUTS, DIRECT_CHUNKS, DIRECT_NAME,
                                   DIRECT_OUTPUTS, HEADERS, HEADS, MAX_VALUE_DIM, PARTIAL_INPUTS, PARTIAL_NAME,
                                   PARTIAL_OUTPUTS, THREADGROUP, WARPS,
                                   combine_template, dims_per_lane, partial_blocks, partial_template,
                                   partial_threadgroup, tree_heads)
from .tree_mask import TREE_ROW


# From this many key chunks (2,048 keys) on, a partial block serves HEADS query heads of its kv head,
# reading each key and value once for them (GQA: H / HKV heads share them). Below it, one head a
# block keeps more blocks in flight for a short cache. A guess, unmeasured on a device.
SHARED_READS_FROM = 8

# A launch with fewer (block, chunk) pairs than this runs blocks of WARPS warps, each taking one 32-key step of a
# chunk, else blocks of one warp walking the steps in turn (the same bits: the fold is in key order either way). On an
# H200 (2026-11-28, H=32, HKV=8, D=128, fp16) 8 warps won with 64 pairs (300 keys, one row: 38 vs 52 us a call),
# one warp from 256 (8,192 keys: 61 vs 88 us at one row, 319 vs 527 at 16 rows; 300 keys at 8 rows: 44 vs 74).
FEW_PAIRS = 256


def launch_warps(blocks: int, nch: int) -> int:
    """The warps a partial or direct block of this launch runs (WARPS where the grid is small, else 1)."""
    return WARPS if blocks * nch < FEW_PAIRS else 1


def _validate(q, k, v, causal: bool, window: int, sinks, length, softcap: float, tree, chunk: int, backend: str,
              mixed_ok: bool) -> tuple[int, bool]:
    """(key chunks, by_rows) of a call both families take, or ValueError for one they cannot compute."""
    b, h, m, d = q.shape
    hkv, keys, dv = k.shape[1], k.shape[2], v.shape[3]
    kv_dtype_ok = k.dtype == v.dtype and (q.dtype == k.dtype or mixed_ok)
    # the kernels read k's rows over q's D dims and v over k's heads and keys (fewer: reads out of bounds), and
    # launch grids of h * m and hkv blocks (0: an invalid launch)
    shapes_ok = min(h, m, hkv, d, dv) > 0 and k.shape[::3] == (1, d) and v.shape[:3] == (1, hkv, keys)
    if (b != 1 or not shapes_ok or h % hkv or max(d, dv) > MAX_VALUE_DIM or not kv_dtype_ok or keys == 0
            or (causal and m > keys)
            or window < 0 or (window and not causal) or (sinks is not None and sinks.shape != (h,))
            or (length is not None and length.size != 1) or softcap < 0):
        raise ValueError(f"sdpa kernel: q {q.shape} {q.dtype}, k {k.shape} {k.dtype}, v {v.shape}, window {window}, "
                         f"sinks {None if sinks is None else sinks.shape}, length {length} unsupported")
    if tree is not None and not (causal and not window and tree.dtype == mx.int32 and tree.size == 1 + m * TREE_ROW):
        raise ValueError(f"sdpa kernel: a tree of {tree.size} int32s over {m} rows, causal={causal}, window {window} "
                         "unsupported")
    nch = (min(keys, window or keys) + chunk - 1) // chunk  # a row sees at most `window` keys
    if backend == "cuda" and max(h * m, nch) > 65535:  # grid y (H*M blocks at most) and z: CUDA's limit
        raise ValueError(f"sdpa kernel: {h} heads x {m} rows or {nch} key chunks: past CUDA's 65535 blocks a grid dimension")
    return nch, tree is None and (window == 0 or keys <= window)  # by_rows: every row starts at key 0


class _Inputs:
    """A launch's inputs after q, k, v: params (a layer's constants, made once each), length and tree, arrays made
    once, not per call (a new array starts in host memory that the GPU must then read: on CUDA plausibly a page
    migration each, two per layer and step of an eager forward; unmeasured)."""

    def __init__(self):
        self.every_key = mx.array([2**31 - 1], mx.int32)  # length: L = min(length, keys) = keys, the buffer's
        self.no_tree = mx.array([-1], mx.int32)  # tree: not a tree pass
        self.params_of: dict[tuple, mx.array] = {}  # [scale, causal, window, by_rows, softcap]

    def __call__(self, q, k, v, scale: float, causal: bool, window: int, by_rows: bool, softcap: float, length,
                 tree) -> list[mx.array]:
        constants = (float(scale), float(causal), float(window), float(by_rows), float(softcap))
        params = self.params_of.get(constants)
        if params is None:
            params = self.params_of[constants] = mx.array(constants, mx.float32)
            mx.eval(params)
        if length is None:
            length = self.every_key
        else:  # a compiled step's cache length, a value of its graph, read in place: (1,) int32 (a 0-d
            length = length.reshape(1).astype(mx.int32)  # input would be a reference in MLX's Metal signature)
        return [q, k, v, params, length, self.no_tree if tree is None else tree]


def metal_sdpa_function(warps: int | None = None, direct_chunks: int = DIRECT_CHUNKS) -> Callable[..., mx.array]:
    """warps: a partial block's (1, 2, 4 or 8: the same bits, another schedule; bench_gpu.py times them); None: each
    launch's own (launch_warps).
    direct_chunks: launches over at most this many key chunks (<= DIRECT_CHUNKS) are one kernel (0: always two)."""
    require_metal()
    return _sdpa_function(mx.fast.metal_kernel, "metal", warps, direct_chunks=direct_chunks)


def cuda_sdpa_function(warps: int | None = None, pack: int = 1, direct_chunks: int = DIRECT_CHUNKS,
                       make: Callable | None = None) -> Callable[..., mx.array]:
    """pack: a lane's value dims of a row in one load where the cache allows, with up to 64 registers of rows in
    flight (1) or 32 (2), or one by one (0): the same bits. make: as gpu.cuda_maker's."""
    return _sdpa_function(cuda_maker(make), "cuda", warps, pack, direct_chunks)


def _sdpa_function(make, backend: str, warps: int | None = None, pack: int = 1,
                   direct_chunks: int = DIRECT_CHUNKS) -> Callable[..., mx.array]:
    if not 0 <= direct_chunks <= DIRECT_CHUNKS:  # the direct build keeps at most DIRECT_CHUNKS chunks' states
        raise ValueError(f"direct_chunks {direct_chunks}: 0 .. {DIRECT_CHUNKS}")
    specs = {"partial": (PARTIAL_NAME, PARTIAL_INPUTS, PARTIAL_OUTPUTS), "direct": (DIRECT_NAME, PARTIAL_INPUTS, DIRECT_OUTPUTS)}
    views = {kind: make(name=name, input_names=inputs, output_names=outputs, source=BODIES[(backend, kind)],
                        header=HEADERS[backend], ensure_row_contiguous=False)
             for kind, (name, inputs, outputs) in specs.items()}
    buffers = _buffer_twins(make, backend, {kind: spec + (BODIES[(backend, kind)], HEADERS[backend])
                                            for kind, spec in specs.items()})
    combine = make(name=COMBINE_NAME, input_names=COMBINE_INPUTS, output_names=COMBINE_OUTPUTS,
                   source=BODIES[(backend, "combine")], header=HEADERS[backend])

    unused = mx.zeros((1,), mx.float32)  # the sinks input of a model without sinks (never read)
    inputs_of = _Inputs()

    def sdpa(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool, window: int = 0,
             sinks: mx.array | None = None, length: mx.array | None = None, softcap: float = 0.0,
             tree: mx.array | None = None) -> mx.array:
        _, h, m, _ = q.shape
        hkv, dv = k.shape[1], v.shape[3]  # k's keys: the buffer's; `length` of them count if given
        mixed_ok = q.dtype == mx.float32 and k.dtype == mx.float16
        nch, by_rows = _validate(q, k, v, causal, window, sinks, length, softcap, tree, CHUNK, backend, mixed_ok)
        inputs = inputs_of(q, k, v, scale, causal, window, by_rows, softcap, length, tree)
        slots = h // hkv * (m if by_rows else 1)  # (query head, row) slots a block may serve: the same bits (tested)
        heads = 1 if nch < SHARED_READS_FROM else min(HEADS, 1 << (slots - 1).bit_length())
        dpl = dims_per_lane(q.shape[3], dv)
        heads = heads if tree is None else tree_heads(heads, dpl)
        blocks = partial_blocks(h, hkv, m, heads, by_rows)
        w = warps or launch_warps(blocks, nch)
        targs = partial_template(q.dtype, heads=heads, dims_per_lane=dpl, tree=tree is not None, warps=w, pack=pack)
        grid, threadgroup = (32, w * blocks, nch), partial_threadgroup(w)
        kernels = buffers if length is not None and sdpa.stored_buffers else views
        if nch <= direct_chunks and sinks is None:  # one block walks every chunk and writes the output
            return kernels["direct"](inputs=inputs, template=targs, grid=grid[:2] + (1,), threadgroup=threadgroup,
                                    output_shapes=[(1, h, m, dv)], output_dtypes=[q.dtype])[0]
        return _partial_and_combine(kernels["partial"], combine, inputs, targs, grid, threadgroup, sinks, unused)

    # takes `window` and `sinks` (attention.py routes such layers here), and float32 queries over a
    # float16 cache (`mixed`: every value is read as float32, exactly; the output is in q's dtype)
    sdpa.windows = sdpa.sinks = sdpa.mixed = True
    sdpa.lengths = True  # takes `length`: keys [0, length) of a longer buffer count (a compiled step's cache)
    sdpa.softcaps = True  # takes `softcap`: scores capped as cap * tanh(score / cap) (Gemma 2)
    sdpa.trees = True  # takes `tree` (tree_mask.tree_rows): a draft tree's verify pass (tree.py)
    sdpa.stored_buffers = bool(buffers)  # calls with a `length` take the twins (attention.self_check may say no)
    return sdpa


def _buffer_twins(make, backend: str, specs: dict[str, tuple]) -> dict:
    """kind -> a row-contiguous build of that stride-reading kernel, for calls over a compiled step's whole cache
    buffers (row-contiguous already: no copy; q, M rows, is copied if need be). On CUDA's cached path such a build
    compiles once per machine (cuda_cache: the strides its shapes imply), where the in-place one goes through MLX's
    JIT in every process. Empty elsewhere (Metal; MLX's JIT): nothing to gain. specs: kind -> (name, inputs,
    outputs, body, header)."""
    if backend != "cuda":
        return {}
    twins = {kind: make(name=name, input_names=inputs, output_names=outputs, source=body, header=header,
                        ensure_row_contiguous=True) for kind, (name, inputs, outputs, body, header) in specs.items()}
    return twins if all(getattr(t, "stored", False) for t in twins.values()) else {}


def _partial_and_combine(partial, combine, inputs: list, targs: list, grid: tuple, threadgroup: tuple, sinks,
                         unused: mx.array) -> mx.array:
    """The partial launch (each chunk's softmax state, float32), then the combine's (one warp a row)."""
    q, v = inputs[0], inputs[2]
    _, h, m, _ = q.shape
    nch, dv, f32 = grid[2], v.shape[3], mx.float32
    pmax, psum, pacc = partial(inputs=inputs, template=targs, grid=grid, threadgroup=threadgroup,
                               output_shapes=[(h * m, nch), (h * m, nch), (h * m, nch, dv)], output_dtypes=[f32] * 3)
    per_row = unused if sinks is None else mx.repeat(sinks.astype(f32), m)  # (H*M,): row hm's head's sink
    return combine(inputs=[pmax, psum, pacc, per_row], template=combine_template(q.dtype, sinks is not None),
                   grid=(32, h * m, 1), threadgroup=THREADGROUP, output_shapes=[(1, h, m, dv)],
                   output_dtypes=[q.dtype])[0]


def cuda_sdpa_mma_function(chunk: int = mma_source.CHUNK, make: Callable | None = None) -> Callable[..., mx.array]:
    """The tensor-core family (gpu_attention_mma_source.py): 16 (query head, row) slots a warp, float16 or
    bfloat16 queries, keys and values, head dims multiples of 16 up to 128 (mma_source.supports); other
    calls raise ValueError. Its bits are its own, not the FMA family's: a layer takes one family for all
    its launches (attention.py). chunk: keys a warp walks (a multiple of 16). make: as gpu.cuda_maker's."""
    return _matrix_sdpa_function(cuda_maker(make), "cuda", mma_source, chunk)


def metal_sdpa_simdgroup_function(chunk: int = simdgroup_source.CHUNK) -> Callable[..., mx.array]:
    """The simdgroup-matrix family (gpu_attention_simdgroup_source.py), Metal's twin of the tensor cores': 8 slots a
    simdgroup, float32 matrices (any float dtype; float32 queries over a float16 cache), head dims multiples of 8 up
    to 256. chunk: keys a simdgroup walks (a multiple of 16)."""
    require_metal()
    return _matrix_sdpa_function(mx.fast.metal_kernel, "metal", simdgroup_source, chunk)


def _matrix_sdpa_function(make, backend: str, source, chunk: int) -> Callable[..., mx.array]:
    if chunk <= 0 or chunk % 16:
        raise ValueError(f"chunk {chunk}: a positive multiple of 16")
    f16 = mx.float16  # (the kernels' names and inputs: the dtypes are template arguments at each launch)
    specs = {kind: (name, inputs, outputs, source.BODIES[kind], source.HEADER)
             for kind, ((name, inputs, outputs, _), _) in source.kernels(f16, f16).items()}
    launch = {kind: make(name=name, input_names=inputs, output_names=outputs, source=body, header=header,
                         ensure_row_contiguous=kind == "combine") for kind, (name, inputs, outputs, body, header) in specs.items()}
    buffers = _buffer_twins(make, backend, {kind: specs[kind] for kind in ("partial", "direct")})
    unused, inputs_of = mx.zeros((1,), mx.float32), _Inputs()

    def sdpa(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool, window: int = 0,
             sinks: mx.array | None = None, length: mx.array | None = None, softcap: float = 0.0,
             tree: mx.array | None = None) -> mx.array:
        _, h, m, d = q.shape
        hkv, dv = k.shape[1], v.shape[3]
        if not source.supports(q.dtype, k.dtype, d, dv):
            raise ValueError(f"sdpa {backend} matrix kernel: q {q.dtype} over k {k.dtype}, head dims {d} / {dv} unsupported")
        nch, by_rows = _validate(q, k, v, causal, window, sinks, length, softcap, tree, chunk, backend, True)
        inputs = inputs_of(q, k, v, scale, causal, window, by_rows, softcap, length, tree)
        targs = source.template(q.dtype, k.dtype, d, dv, chunk, tree is not None)
        grid, threadgroup = (32, source.tiles(h, hkv, m, by_rows), nch), (32, 1, 1)
        if backend == "cuda" and grid[1] > 65535:
            raise ValueError(f"sdpa tensor-core kernel: {grid[1]} tiles: past CUDA's 65535 blocks a grid dimension")
        kernels = buffers if length is not None and sdpa.stored_buffers else launch
        if nch == 1 and sinks is None:  # one chunk: the warp writes the output (the combine's arithmetic)
            return kernels["direct"](inputs=inputs, template=targs, grid=grid, threadgroup=threadgroup,
                                    output_shapes=[(1, h, m, dv)], output_dtypes=[q.dtype])[0]
        return _partial_and_combine(kernels["partial"], launch["combine"], inputs, targs, grid, threadgroup, sinks, unused)

    sdpa.windows = sdpa.sinks = sdpa.lengths = sdpa.softcaps = sdpa.trees = True
    sdpa.stored_buffers = bool(buffers)
    sdpa.mixed = backend == "metal"  # float32 queries over a float16 cache (Metal's float32 matrices take them)
    sdpa.family, sdpa.chunk, sdpa.supports = "sdpa-mma", chunk, source.supports
    builds = {chunk: sdpa}

    def with_chunk(other: int) -> Callable[..., mx.array]:
        """The build walking `other` keys a warp (its own bits; made once)."""
        if other not in builds:
            builds[other] = _matrix_sdpa_function(make, backend, source, other)
        return builds[other]

    sdpa.with_chunk = with_chunk
    return sdpa
