"""Few-row attention on the CPU, for mlx-lm models: the verify pass's other M-times cost.

MLX's CPU attention runs through the BLAS the wheel links (the reference one): with a context of
256, 8 query rows cost ~7x one row (benchmarks/bench_kernels.py --attention). The kernel in
cpu/sdpa_kernel.h reads each key and value row once for all query rows and computes every row the
same way whatever M, so verify rows equal one-token steps bit for bit.

    report = use_attention_kernel(model)   # this model's attention modules call few_row_attention
    restore_attention(model)               # undo

Routing is per model (hooks.py): mlx-lm's own modules and other models keep mlx-lm's function.
The routed function sends a call to the kernel only when it can answer it exactly as defined
(plain KV cache, mask None or "causal", or the array mask of mlxspec's WindowKVCache, which the
kernel reads as its sliding window, also where a KV-shared layer gets it without the cache, or a
compiled step's cache buffers with the length that counts (step_graph.py) under the mask their view made, which
kernels with `lengths` take; sinks (gpt-oss) and softcaps (Gemma 2, softcap_attention.py) where the kernel takes
them, as the CPU and GPU ones do; dtypes it handles, and this shape signature passed the
self-check; Llama 4's chunked layers as causal attention over each chunk's keys); anything else goes to
mlx-lm's own function (Gemma 2's written-out ops) unchanged. Keys and values share a dtype; float32 queries may
read a float16 cache (mlxspec's HalfKVCache).
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from mlx_lm.models.cache import ChunkedKVCache

from ..cache import mask_marks, marked_window
from . import registry
from .build import KernelUnavailable
from .tree_mask import TreeMask, tree_rows
from .hooks import route_functions, unroute_functions
from .passes import prompt_queries
from .reference import on_cpu

NAME = "scaled_dot_product_attention"  # the function mlx-lm's attention modules call

ATOL = 1e-5  # |kernel - reference| <= ATOL * max|v| + eps(dtype) * |reference| (a convex mix of v rows)
EPS = {mx.float32: 0.0, mx.float16: 2.0**-10, mx.bfloat16: 2.0**-7}


@on_cpu
def attention_reference(q, k, v, scale: float, causal: bool, window: int = 0, sinks=None, softcap: float = 0.0) -> mx.array:
    """The definition: MLX's fused attention in float32, in q's dtype (window: causal rows see
    their last `window` keys; sinks (H,): one extra logit per head with no value, as gpt-oss's;
    softcap > 0: scores s become softcap * tanh(s / softcap) first, as Gemma 2's, spelled out in float32)."""
    f32 = mx.float32
    mask = "causal" if causal else None
    if window or (softcap and causal):  # as an array: the spelled-out softcapped attention takes no "causal"
        qpos = (k.shape[2] - q.shape[2]) + mx.arange(q.shape[2])[:, None]
        kpos = mx.arange(k.shape[2])[None]
        mask = kpos <= qpos
        if window:
            mask = mask & (qpos - kpos < window)
    sinks = None if sinks is None else sinks.astype(f32)
    if softcap:
        return softcapped_attention(q.astype(f32), k.astype(f32), v.astype(f32), scale, mask, softcap).astype(q.dtype)
    y = mx.fast.scaled_dot_product_attention(q.astype(f32), k.astype(f32), v.astype(f32), scale=scale, mask=mask,
                                             sinks=sinks)
    return y.astype(q.dtype)


def softcapped_attention(q, k, v, scale: float, mask, softcap: float) -> mx.array:
    """Gemma 2's attention as mlx-lm writes it (models/gemma2.py): queries scaled, capped scores, a boolean
    or additive mask (or none), a precise softmax."""
    b, h, m, d = q.shape
    g = h // k.shape[1]  # query heads per kv head
    scores = (q * scale).reshape(b, k.shape[1], g, m, d) @ mx.expand_dims(k, 2).swapaxes(-1, -2)
    scores = mx.tanh(scores / softcap) * softcap
    if isinstance(mask, mx.array) and mask.dtype == mx.bool_:
        scores = mx.where(mask, scores, mx.array(mx.finfo(scores.dtype).min, scores.dtype))
    elif isinstance(mask, mx.array):
        scores = scores + mask
    out = mx.softmax(scores, axis=-1, precise=True) @ mx.expand_dims(v, 2)
    return out.reshape(b, h, m, v.shape[-1])


@on_cpu
def attention_within_tolerance(y, q, k, v, scale: float, causal: bool, window: int = 0,
                               sinks=None, softcap: float = 0.0) -> tuple[bool, float]:
    ref = attention_reference(q, k, v, scale, causal, window, sinks, softcap).astype(mx.float32)
    allowed = ATOL * mx.abs(v.astype(mx.float32)).max() + EPS[y.dtype] * mx.abs(ref) + 1e-30
    ratio = (mx.abs(y.astype(mx.float32) - ref) / allowed).max().item()
    return bool(mx.all(mx.isfinite(y)).item() and ratio <= 1.0), float(ratio)


def self_check(sdpa: Callable, heads: int, kv_heads: int, dim: int, value_dim: int, dtype,
               kv_dtype=None) -> str | None:
    """None if the kernel matches the reference on random inputs of this signature (queries in
    `dtype`, keys and values in `kv_dtype`, default the same), else why not."""
    kv_dtype = kv_dtype or dtype
    try:
        kq, kk, kv = mx.random.split(mx.random.key(heads * 131 + dim), 3)
        rows, keys = 4, 300  # past a 256-key chunk boundary of the GPU kernel
        q = mx.random.normal((1, heads, rows, dim), key=kq).astype(dtype)
        room = keys + 900  # a cache-like buffer: the view's keys, then more (a GPU launch over it: partial + combine)
        k_buffer = mx.random.normal((1, kv_heads, room, dim), key=kk).astype(kv_dtype)
        v_buffer = mx.random.normal((1, kv_heads, room, value_dim), key=kv).astype(kv_dtype)
        k, v = k_buffer[:, :, :keys], v_buffer[:, :, :keys]
        scale = dim**-0.5
        for causal in (False, True):
            y = sdpa(q, k, v, scale, causal)
            ok, ratio = attention_within_tolerance(y, q, k, v, scale, causal)
            if not ok:
                return f"causal={causal}: error {ratio:.3g}x the tolerance"
        for i in range(rows):  # row i of the causal call = a one-row call that sees keys[: keys - rows + i + 1]
            seen = keys - rows + i + 1
            one = sdpa(q[:, :, i : i + 1], k[:, :, :seen], v[:, :, :seen], scale, False)
            if not mx.array_equal(one[:, :, 0], y[:, :, i]).item():
                return f"row {i} of a {rows}-row causal call differs from the one-row call"
        if getattr(sdpa, "lengths", False) and (err := _check_buffer(sdpa, q, k_buffer, v_buffer, keys, scale, y)):
            return err
        if getattr(sdpa, "windows", False) and (err := _check_window(sdpa, q, k, v, scale)):
            return err
        if getattr(sdpa, "sinks", False) and (err := _check_sinks(sdpa, q, k, v, scale)):
            return err
        if getattr(sdpa, "softcaps", False) and (err := _check_softcap(sdpa, q, k, v, scale)):
            return err
        buffers = (k_buffer, v_buffer) if getattr(sdpa, "lengths", False) else None
        if getattr(sdpa, "trees", False) and _check_tree(sdpa, q, k, v, scale, buffers):
            sdpa.trees = False  # the kernel keeps its other passes; draft trees' passes stay off (tree.py)
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def _check_window(sdpa, q, k, v, scale: float) -> str | None:
    """Row i of a windowed causal call = a one-row call over exactly its window (wherever it sits);
    the longer window spans a 256-key chunk boundary of the GPU kernel."""
    rows, keys = q.shape[2], k.shape[2]
    for window in (37, 270):
        y = sdpa(q, k, v, scale, True, window=window)
        ok, ratio = attention_within_tolerance(y, q, k, v, scale, True, window)
        if not ok:
            return f"window {window}: error {ratio:.3g}x the tolerance"
        for i in range(rows):
            seen = keys - rows + i + 1
            one = sdpa(q[:, :, i : i + 1], k[:, :, seen - window : seen], v[:, :, seen - window : seen], scale, False)
            if not mx.array_equal(one[:, :, 0], y[:, :, i]).item():
                return f"row {i} of a {rows}-row call with window {window} differs from the one-row call over it"
    return None


def _check_sinks(sdpa, q, k, v, scale: float) -> str | None:
    """With sinks (a window too, as gpt-oss's sliding layers): within tolerance, rows = one-row calls."""
    rows, keys, heads = q.shape[2], k.shape[2], q.shape[1]
    sinks = mx.random.normal((heads,), key=mx.random.key(heads)) * 2
    for window in (0, 37):
        y = sdpa(q, k, v, scale, True, window=window, sinks=sinks)
        ok, ratio = attention_within_tolerance(y, q, k, v, scale, True, window, sinks)
        if not ok:
            return f"sinks, window {window}: error {ratio:.3g}x the tolerance"
        for i in range(rows):
            seen = keys - rows + i + 1
            lo = seen - window if window else 0
            one = sdpa(q[:, :, i : i + 1], k[:, :, lo:seen], v[:, :, lo:seen], scale, False, sinks=sinks)
            if not mx.array_equal(one[:, :, 0], y[:, :, i]).item():
                return f"sinks, window {window}: row {i} of a {rows}-row call differs from the one-row call"
    return None


CHECK_TREE = (-1, 0, 0, 1)  # a root, two children, a grandchild under the first: siblings and a path


def _check_tree(sdpa, q, k, v, scale: float, buffers: tuple | None = None) -> str | None:
    """A draft tree's pass over the last rows of the keys: within tolerance, and row m = a one-row call over
    the keys before the tree, then its path's nodes in order; buffers (k, v of which these keys are the first):
    a compiled pass's call over them, the same bits."""
    rows, keys = q.shape[2], k.shape[2]
    start, parents = keys - rows, CHECK_TREE[:rows]
    y = sdpa(q, k, v, scale, True, tree=tree_rows(parents, start))
    if buffers and not mx.array_equal(sdpa(q, *buffers, scale, True, tree=tree_rows(parents, start),
                                            length=mx.array([keys])), y).item():
        return "a tree's pass over a longer buffer with a length differs from the pass over those keys"
    for m in range(rows):
        seen = mx.array(list(range(start)) + [start + node for node in TreeMask(parents).path(m)])
        one = sdpa(q[:, :, m : m + 1], k[:, :, seen], v[:, :, seen], scale, False)
        ok, ratio = attention_within_tolerance(y[:, :, m : m + 1], q[:, :, m : m + 1], k[:, :, seen], v[:, :, seen],
                                               scale, False)
        if not ok:
            return f"tree row {m}: error {ratio:.3g}x the tolerance"
        if not mx.array_equal(one, y[:, :, m : m + 1]).item():
            return f"tree row {m} differs from the one-row call over its path"
    return None


def _check_softcap(sdpa, q, k, v, scale: float, softcap: float = 2.0) -> str | None:
    """With a softcap (Gemma 2's, low enough to bend most scores): within tolerance, rows = one-row calls."""
    rows, keys = q.shape[2], k.shape[2]
    y = sdpa(q * 3, k, v, scale, True, softcap=softcap)  # * 3: scores well into tanh's curve
    ok, ratio = attention_within_tolerance(y, q * 3, k, v, scale, True, softcap=softcap)
    if not ok:
        return f"softcap {softcap}: error {ratio:.3g}x the tolerance"
    for i in range(rows):
        seen = keys - rows + i + 1
        one = sdpa(q[:, :, i : i + 1] * 3, k[:, :, :seen], v[:, :, :seen], scale, False, softcap=softcap)
        if not mx.array_equal(one[:, :, 0], y[:, :, i]).item():
            return f"softcap: row {i} of a {rows}-row call differs from the one-row call"
    return None


def _record() -> registry.KernelRecord:
    return registry.kernel("sdpa")  # the default device's: a call on another device finds its own


def _load_sdpa(backend: str):
    if backend == "cpu":
        from .cpu import cpu_sdpa_function

        fn = cpu_sdpa_function()
        return fn, fn.isa
    from . import gpu_attention

    fn = gpu_attention.metal_sdpa_function() if backend == "metal" else gpu_attention.cuda_sdpa_function()
    return fn, f"mx.fast.{backend}_kernel, {gpu_attention.CHUNK}-key chunks"


registry.register("sdpa", _load_sdpa)


def _load_sdpa_mma(backend: str):
    """The matrix-unit family (CUDA's tensor cores, Metal's simdgroup matrices): a layer takes it instead of the FMA
    one where it computes the signature, passed its self-check and timed faster on this device (_serving)."""
    from . import gpu_attention

    if backend == "cuda":
        fn = gpu_attention.cuda_sdpa_mma_function()
        return fn, f"mx.fast.cuda_kernel, mma.sync m16n8k16, {fn.chunk}-key chunks"
    if backend == "metal":
        fn = gpu_attention.metal_sdpa_simdgroup_function()
        return fn, f"mx.fast.metal_kernel, simdgroup_matrix 8x8, {fn.chunk}-key chunks"
    raise KernelUnavailable(f"the matrix-unit attention is a GPU kernel ({backend} keeps its own)")


registry.register("sdpa-mma", _load_sdpa_mma)


def _usable(rec: registry.KernelRecord, queries, keys, values, cache, mask, sinks, softcap: float = 0.0):
    """The kernel function that answers this call exactly as defined (its signature passed), or None."""
    fn = rec.fn
    if softcap and not getattr(fn, "softcaps", False):
        return None
    if hasattr(cache, "bits") or not (mask is None or (isinstance(mask, str) and mask == "causal")):
        return None
    if sinks is not None and not (getattr(fn, "sinks", False) and sinks.shape == (queries.shape[1],)):
        return None
    if queries.ndim != 4 or keys.ndim != 4 or values.ndim != 4 or queries.shape[0] != 1 or keys.shape[2] == 0:
        return None  # the engine decodes one sequence; the GPU kernel takes batch 1 only
    if keys.shape[0] != 1 or keys.shape[3] != queries.shape[3] or values.shape[:3] != keys.shape[:3]:
        return None  # shapes the kernels would read past (the GPU wrapper refuses them): the model's own op decides
    if mask is not None and queries.shape[2] > keys.shape[2]:
        return None
    if queries.dtype not in EPS or values.dtype != keys.dtype:
        return None
    mixed = queries.dtype == mx.float32 and keys.dtype == mx.float16 and getattr(fn, "mixed", False)
    if keys.dtype != queries.dtype and not mixed:  # float32 queries over a float16 cache where the kernel reads it
        return None
    signature = (queries.shape[1], keys.shape[1], queries.shape[3], values.shape[3], queries.dtype, keys.dtype)
    return _serving(rec, *signature) if _check(rec, *signature) is None else None


def check_signature(heads: int, kv_heads: int, dim: int, value_dim: int, dtype=mx.float32, kv_dtype=None) -> str | None:
    """Self-check one signature on the default device's kernel, once per process; None if it passed."""
    return _check(_record(), heads, kv_heads, dim, value_dim, dtype, kv_dtype)


def serving_function(heads: int, kv_heads: int, dim: int, value_dim: int, dtype=mx.float32, kv_dtype=None):
    """The kernel function that serves this signature on the default device (its self-check passed; on a GPU the
    family and build its timing chose), or None: what a layer of it will call (row_positions asks it for trees)."""
    rec, kv_dtype = _record(), kv_dtype or dtype
    if rec.error or _check(rec, heads, kv_heads, dim, value_dim, dtype, kv_dtype) is not None:
        return None
    return _serving(rec, heads, kv_heads, dim, value_dim, dtype, kv_dtype)


def _serving(rec: registry.KernelRecord, heads: int, kv_heads: int, dim: int, value_dim: int, dtype, kv_dtype):
    """The family serving a signature, chosen once per process: on a GPU the matrix-unit one (CUDA's tensor cores,
    Metal's simdgroup matrices) where it computes the signature, passed its self-check and timed faster here
    (timing.prefer_tensor_core_attention, which also picks its chunk), else the record's own. Both are row-invariant
    with bits of their own, so every launch of a layer (one-row steps, verify rows, trees) meets the one build its
    signature chose."""
    if rec.backend not in ("cuda", "metal"):
        return rec.fn
    mma = registry.kernel("sdpa-mma", rec.backend)
    if mma.error or not mma.fn.supports(dtype, kv_dtype, dim, value_dim):
        return rec.fn
    signature = (heads, kv_heads, dim, value_dim, str(dtype)) + ((str(kv_dtype),) if kv_dtype != dtype else ())
    if signature not in mma.chosen:
        failure = mma.check(signature, lambda: self_check(mma.fn, heads, kv_heads, dim, value_dim, dtype, kv_dtype))
        if failure is None:
            from .timing import prefer_tensor_core_attention

            with mma.spending("timing"):
                mma.chosen[signature] = prefer_tensor_core_attention(rec.fn, mma.fn, heads, kv_heads, dim, value_dim,
                                                                     dtype, kv_dtype, rec.backend)
        else:
            mma.chosen[signature] = 0
    chunk = mma.chosen[signature]  # 0: the FMA family; else the matrix build walking that many keys a warp
    if not chunk:
        return rec.fn
    if chunk == mma.fn.chunk:
        return mma.fn
    other = mma.fn.with_chunk(chunk)
    failure = mma.check(signature + (f"c{chunk}",), lambda: self_check(other, heads, kv_heads, dim, value_dim, dtype,
                                                                         kv_dtype))
    return rec.fn if failure else other  # failed: the FMA family, as if never chosen (its first check passed)


def _check_buffer(sdpa: Callable, q, k_buffer, v_buffer, keys: int, scale: float, y) -> str | None:
    """A compiled step's call (the whole buffer, `keys` of them counting) must give the bits of the call over those
    keys. Where it launches its own builds (CUDA's row-contiguous twins, compiled once per machine) and they differ
    at the function's first check, before any layer has launched them, it keeps the in-place builds for every call."""
    length = mx.array([keys])
    same = mx.array_equal(sdpa(q, k_buffer, v_buffer, scale, True, length=length), y).item()
    if not same and getattr(sdpa, "stored_buffers", False) and not getattr(sdpa, "buffers_settled", False):
        sdpa.stored_buffers = False
        registry.warn_once("mlxspec: attention over cache buffers differs between its stored and JIT builds",
                           "the JIT's builds in every process")
        same = mx.array_equal(sdpa(q, k_buffer, v_buffer, scale, True, length=length), y).item()
    if not same:
        return "a call over a longer buffer with a length differs from the call over those keys"
    sdpa.buffers_settled = True
    return None


def _check(rec: registry.KernelRecord, heads: int, kv_heads: int, dim: int, value_dim: int, dtype,
           kv_dtype=None) -> str | None:
    kv_dtype = kv_dtype or dtype
    signature = (heads, kv_heads, dim, value_dim, str(dtype)) + ((str(kv_dtype),) if kv_dtype != dtype else ())
    return rec.check(signature, lambda: self_check(rec.fn, heads, kv_heads, dim, value_dim, dtype, kv_dtype))


def few_row_attention(queries, keys, values, cache, scale: float, mask, sinks=None, softcap: float = 0.0):
    """mlx-lm's scaled_dot_product_attention signature; the kernel where it applies, else mlx-lm's.
    softcap > 0: Gemma 2's capped scores (softcap_attention.py calls it so), else its written-out ops."""
    rec = _record()  # once per call: this runs for every attention layer of every step
    if rec.backend != "cpu" and prompt_queries(queries):  # a prompt chunk on a GPU: MLX's (passes.py)
        return _theirs(queries, keys, values, cache, scale, mask, sinks, softcap)
    if keys.dtype == mx.float32 and values.dtype in (mx.float16, mx.bfloat16):
        values = values.astype(mx.float32)  # StableLM casts its keys up, not its values: so do these (exact)
    extra = ({"sinks": sinks} if sinks is not None else {}) | ({"softcap": softcap} if softcap else {})
    if isinstance(mask, TreeMask):  # a draft tree's pass on a GPU (tree.py): only the kernel computes its mask
        fn = None if sinks is not None or softcap else _usable(rec, queries, keys, values, cache, "causal", None)
        if not getattr(fn, "trees", False):  # after _usable: its self-check may turn trees off
            raise RuntimeError("a draft tree's pass reached attention the kernel cannot run")
        length = getattr(cache, "key_length", None)  # a compiled pass's cache buffers: its graph made `rows`
        rows = mask.rows if mask.rows is not None else tree_rows(mask.parents, keys.shape[2] - queries.shape[2])
        return fn(queries, keys, values, scale, True, tree=rows, **({"length": length} if length is not None else {}))
    length, window = _in_buffer(cache, mask)
    if length is not None:  # a compiled step's cache buffers: `length` of their keys count
        fn = rec.fn
        if (getattr(fn, "lengths", False) and (not window or getattr(fn, "windows", False)) and _view_mask(mask)
                and (fn := _usable(rec, queries, keys, values, cache, "causal", sinks, softcap))):
            return fn(queries, keys, values, scale, True, length=length, **({"window": window} if window else {}), **extra)
        return _theirs(queries, keys, values, cache, scale, mask, sinks, softcap)
    if isinstance(cache, ChunkedKVCache) and isinstance(mask, mx.array):
        fn = _usable(rec, queries, keys, values, cache, "causal", sinks, softcap)
        if fn is not None and (y := _by_chunk(fn, queries, keys, values, cache, scale, extra)) is not None:
            return y
        return _theirs(queries, keys, values, cache, scale, mask, sinks, softcap)
    window = _window(cache, mask, rec.fn)
    if fn := _usable(rec, queries, keys, values, cache, "causal" if window else mask, sinks, softcap):
        if window:  # only kernels that take sinks (softcaps) get here with them
            return fn(queries, keys, values, scale, True, window=window, **extra)
        return fn(queries, keys, values, scale, mask is not None, **extra)
    return _theirs(queries, keys, values, cache, scale, mask, sinks, softcap)


def _by_chunk(fn, queries, keys, values, cache, scale: float, extra: dict) -> mx.array | None:
    """Llama 4's chunked layers (mlx-lm's ChunkedKVCache, the only one that makes them; the model's mask lets each
    query see its own chunk's keys up to itself): causal attention over each chunk's keys, one call per chunk the
    pass's rows fall in, so every row reads the keys its one-row step reads. None where the cache has already
    dropped a chunk's first keys (then the model's mask and MLX's op)."""
    size, kept, end = cache.chunk_size, cache.start_position, cache.offset
    first = end - queries.shape[2]  # the rows' positions: first .. end - 1
    if keys.shape[2] != end - kept or first // size * size < kept:
        return None
    parts, position = [], first
    while position < end:
        chunk = position // size * size
        stop = min(chunk + size, end)
        rows = (slice(None), slice(None), slice(position - first, stop - first))
        seen = (slice(None), slice(None), slice(chunk - kept, stop - kept))
        parts.append(fn(queries[rows], keys[seen], values[seen], scale, True, **extra))
        position = stop
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)


def _theirs(queries, keys, values, cache, scale: float, mask, sinks, softcap: float):
    """The model's own attention: mlx-lm's function, or Gemma 2's capped scores as mlx-lm writes them."""
    if softcap:
        return softcapped_attention(queries, keys, values, scale, mask, softcap)
    return _mlx_lm_attention()(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)


def _in_buffer(cache, mask) -> tuple[mx.array | None, int]:
    """(keys that count, window) of a compiled step's cache (cache.KVView) or, for a layer given another's
    keys without a cache (Gemma 4's KV-shared layers), of the mask that view made; (None, 0) otherwise."""
    if cache is None and isinstance(mask, mx.array):
        window, length = mask_marks(mask)
        return length, window if length is not None else 0
    return getattr(cache, "key_length", None), getattr(cache, "attention_window", 0)


def _view_mask(mask) -> bool:
    """Is `mask` none, causal, or the one a compiled step's cache view made (which the kernel reads as its length)?
    A model's own mask over the buffer (DeepSeek-V3's absorbed route passes its rotary scores as one) goes to
    mlx-lm's function with it."""
    return mask is None or isinstance(mask, str) or mask_marks(mask)[1] is not None


def _window(cache, mask, fn) -> int:
    """The sliding window an array mask stands for where the cache made it for exactly these keys
    (mlxspec's WindowKVCache: causal rows over their last `attention_window` keys) and the kernel
    `fn` takes windows; else 0. Without a cache (a KV-shared layer: Gemma 4's last layers read
    another layer's keys with that layer's mask), the window the mask was marked with."""
    if not isinstance(mask, mx.array) or not getattr(fn, "windows", False):
        return 0
    return getattr(cache, "attention_window", 0) if cache is not None else marked_window(mask)


def _mlx_lm_attention():
    import mlx_lm.models.base as base

    return base.scaled_dot_product_attention


def use_attention_kernel(model) -> dict:
    """Route this model's attention through the kernel (its modules only). Returns what was done and why."""
    report = {"kernel": "sdpa", "routed": 0, "error": None}
    rec = _record()
    if rec.error:
        report["error"] = rec.error
        registry.warn_once(f"mlxspec {rec.name} kernel unavailable: {rec.error.splitlines()[0]}", "MLX's attention")
        return report
    report["routed"] = route_functions(model, {NAME: (_mlx_lm_attention(), few_row_attention)})
    return report


def restore_attention(model) -> None:
    """Give this model's modules mlx-lm's own attention back."""
    unroute_functions(model, [NAME])


def attention_status() -> dict:
    return _record().status()
