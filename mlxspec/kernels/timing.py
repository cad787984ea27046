"""Self-timing next to the self-check: our kernel against MLX's op, on the user's device.

    us = time_call(lambda: qmm(x, w, s, b, 32, 4))            # median microseconds of an evaluated call
    us = latency_us(lambda x: qmm(x, w, s, b, 32, 4), x)       # ... of a call that waits for the one before
    record_timing(rec, signature, kernel_us, mlx_us)           # kept in the record and on disk
    slower = forward_cost_ratio(model, install, remove)        # one-row forward: kernels / MLX's ops

Timings are cached on disk per device and MLX version (cache_root()/timings.json), so a kernel is
timed once per machine, not per process; `mlxspec doctor` shows them. On GPUs the engine keeps
the kernels (exact mode) only when a one-row forward with them costs at most EXACT_BUDGET times
MLX's own (see install.py).
"""

from __future__ import annotations

import platform
import statistics
import time
from typing import Callable

import mlx.core as mx

from .build import read_cached_json, write_cached_json
from .registry import KernelRecord, device_backend_name

EXACT_BUDGET = 1.10  # exact mode is the default when it costs plain decoding at most 10% more
OP_BATCH = 16  # calls per evaluation when one op is timed on a GPU (time_call's batch, latency_us's chain)


def op_batch() -> int:
    """time_call's batch (latency_us's chain) for one op on the default device: the CPU has no per-evaluation
    sync to hide."""
    return 1 if device_backend_name() == "cpu" else OP_BATCH


def device_key() -> str:
    """What a timing depends on: the device, its backend and the MLX version."""
    backend = device_backend_name()
    try:
        name = mx.device_info().get("device_name", "") if backend != "cpu" else platform.processor()
    except Exception:  # device_info is missing on some builds
        name = ""
    return f"{backend}|{name or platform.machine()}|mlx {mx.__version__}|chain{op_batch()}"


def load_timings() -> dict:
    return read_cached_json("timings.json")


def _save(all_timings: dict) -> None:
    write_cached_json("timings.json", all_timings)  # a read-only cache only costs a re-timing


def cached_timing(rec: KernelRecord, signature: str) -> dict | None:
    entry = load_timings().get(device_key(), {}).get(f"{rec.name} {signature}")
    if entry is not None:
        rec.timings[signature] = entry
    return entry


def record_timing(rec: KernelRecord, signature: str, kernel_us: float, mlx_us: float) -> dict:
    entry = {"kernel_us": round(kernel_us, 2), "mlx_us": round(mlx_us, 2), "ratio": round(kernel_us / mlx_us, 3)}
    rec.timings[signature] = entry
    all_timings = load_timings()
    all_timings.setdefault(device_key(), {})[f"{rec.name} {signature}"] = entry
    _save(all_timings)
    return entry


def time_call(fn: Callable[[], object], repeats: int = 7, warmup: int = 2, batch: int = 1) -> float:
    """Median wall microseconds of fn() evaluated (its result forced with mx.eval); batch > 1 evaluates
    that many independent calls at once and divides, so a GPU's per-eval sync (~60-100 us on MLX's
    CUDA backend, measured on an H100) does not swamp a kernel of a few microseconds."""
    for _ in range(warmup):
        mx.eval([fn() for _ in range(batch)])
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        mx.eval([fn() for _ in range(batch)])
        times.append((time.perf_counter() - t) / batch)
    return statistics.median(times) * 1e6


def latency_us(fn: Callable[[mx.array], mx.array], x: mx.array, repeats: int = 7) -> float:
    """Microseconds a call of fn(x) costs when it waits for the call before it, as a forward's layers do:
    op_batch() calls each fed the previous one's output (its first K columns, or it tiled up to K: a copy
    each call, for every kernel alike), evaluated at once. Independent calls (time_call's batch) may overlap
    on a GPU and hide a kernel's latency: on an H100 (2026-11-28) the tensor-core qmm with 2 warps on K took
    25.0 us a call batched and 47.6 chained on 4096 x 4096, with 8 warps 24.1 and 35.5. On the CPU (one
    call at a time anyway): time_call of one call."""
    calls, k = op_batch(), x.shape[-1]
    if calls == 1:
        return time_call(lambda: fn(x), repeats=repeats)

    def chain():
        y = x
        for _ in range(calls):
            y = fn(y)
            n = y.shape[-1]
            y = y[..., :k] if n >= k else mx.tile(y, (1,) * (y.ndim - 1) + (-(-k // n),))[..., :k]
        return y

    return time_call(chain, repeats=repeats) / calls


def forward_cost_ratio(model, install: Callable[[], object], remove: Callable[[], object], context: int = 64,
                       steps: Callable | None = None) -> dict:
    """Median one-row forward time with kernels installed vs MLX's ops (interleaved), same cache.
    `steps(model)`: the forward decoding runs, `forward(x, cache)`, made after each install (the
    engine's compiled step graphs, which take the Python of building a step out of both); default
    model(x, cache=cache)."""
    from ..cache import new_cache, rewind

    cache = new_cache(model)
    model(mx.zeros((1, context), dtype=mx.uint32), cache=cache)
    token = mx.array([[1]])

    def timed() -> float:
        forward = steps(model) if steps else (lambda x, c: model(x, cache=c))

        def step():
            out = forward(token, cache)
            mx.eval(out)
            rewind(cache, 1)
            return out

        return time_call(step, repeats=5)  # its warm-up calls trace a compiled step

    ours, theirs = [], []
    for _ in range(3):  # interleaved, so drift in clocks or load hits both alike
        install()
        ours.append(timed())
        remove()
        theirs.append(timed())
    kernel_us, mlx_us = statistics.median(ours), statistics.median(theirs)
    return {"kernels_us": round(kernel_us, 1), "mlx_us": round(mlx_us, 1), "ratio": round(kernel_us / mlx_us, 3)}


def time_qmm(n: int, k: int, group_size: int, bits: int, scale_dtype, rows: tuple[int, ...] = (1, 8)) -> dict:
    """Time the device's qmm kernel against MLX's quantized_matmul on this shape, per row count;
    cached on disk (a second call, or a later process, reads the cache). {} if the kernel is unusable."""
    from .reference import random_quantized
    from .registry import kernel, kernel_for_layer

    qmm, _ = kernel_for_layer(n, k, group_size, bits, scale_dtype)
    if qmm is None:
        return {}
    rec, out = kernel("qmm"), {}
    w, s, b = random_quantized(n, k, group_size, bits, scale_dtype, key=mx.random.key(n + k))
    for m in rows:
        signature = f"{n}x{k} q{bits} g{group_size} {str(scale_dtype).split('.')[-1]} M={m}"
        entry = cached_timing(rec, signature)
        if entry is None:
            x = mx.random.normal((m, k), key=mx.random.key(m)).astype(scale_dtype)
            ours = latency_us(lambda x_: qmm(x_, w, s, b, group_size, bits), x)
            theirs = latency_us(lambda x_: mx.quantized_matmul(x_, w, s, b, transpose=True, group_size=group_size,
                                                               bits=bits), x)
            entry = record_timing(rec, signature, ours, theirs)
        out[m] = entry
    return out


TENSOR_CORE_ROWS = (1, 8)  # a decoding step and a typical verify pass (k = 7)
TENSOR_CORE_STEP_BUDGET = EXACT_BUDGET  # the tensor-core qmm may cost a decoding step this much for a faster round
# Other K splits of the tensor-core qmm timed beside its default (gpu_mma_source.KSPLIT): each sums in
# another order, so a layer shape keeps the one chosen for every row count. On an H200 (2026-11-27, one
# run) 4096 x 14336 took 46.8 / 34.9 / 35.8 us at one row with 4 / 2 / 8 warps on K.
OTHER_KSPLITS = (2, 8)


def prefer_tensor_cores(fma, mma, n: int, k: int, group_size: int, bits: int, scale_dtype, backend: str = "cuda") -> int:
    """Time the FMA qmm and the matrix-unit qmm (CUDA's tensor cores, Metal's simdgroup matrices: its default
    K split and OTHER_KSPLITS, where it has them) on this layer shape at 1 and 8 rows (cached on disk per
    device and MLX version, shown by doctor).
    Returns the K split of the tensor-core build that serves the layer, 0 for the FMA kernel: of the
    builds that win against FMA (tensor_cores_win), the cheapest decoding step + 8-row verify round, each
    call timed as a forward makes it: after the one before (latency_us).
    On an H100 (2026-11-26) the vocabulary head took 257 / 290 us at 1 / 8 rows with tensor cores, 247 /
    570 with FMA: a 4% dearer step for a verify pass at half the cost; the FMA kernel's cost grows with
    M, the tensor cores' does not."""
    from .reference import random_quantized
    from .registry import kernel

    w, s, b = random_quantized(n, k, group_size, bits, scale_dtype, key=mx.random.key(n + k))
    default = getattr(mma, "ksplit", True)  # (True: a qmm that says nothing of its split)
    builds = {default: mma} | {ks: mma.with_ksplit(ks) for ks in OTHER_KSPLITS if hasattr(mma, "with_ksplit")}
    _prepare([f for ks, f in builds.items() if ks != default], scale_dtype, group_size, bits)
    times = {"fma": {}, "mlx": {}} | {ks: {} for ks in builds}  # kernel (or MLX's op) -> rows -> microseconds
    for name, family, fn in [("fma", "qmm", fma)] + [(ks, "qmm-mma", f) for ks, f in builds.items()]:
        rec = kernel(family, backend)
        for m in TENSOR_CORE_ROWS:
            signature = f"{n}x{k} q{bits} g{group_size} {str(scale_dtype).split('.')[-1]} M={m}"
            signature += f" k{name}" if name not in ("fma", default) else ""  # the default's as it always read
            entry = cached_timing(rec, signature)
            if entry is None:
                x = mx.random.normal((m, k), key=mx.random.key(m)).astype(scale_dtype)
                theirs = latency_us(lambda x_: mx.quantized_matmul(x_, w, s, b, transpose=True, group_size=group_size,
                                                                   bits=bits), x)
                ours = latency_us(lambda x_: fn(x_, w, s, b, group_size, bits), x)
                entry = record_timing(rec, signature, ours, theirs)
            times[name][m] = entry["kernel_us"]
            times["mlx"][m] = min(times["mlx"].get(m, entry["mlx_us"]), entry["mlx_us"])  # timed with each
    rounds = {ks: sum(times[ks].values()) for ks in builds if tensor_cores_win(times["fma"], times[ks], times["mlx"])}
    return min(rounds, key=lambda ks: (rounds[ks], ks != default)) if rounds else 0


def _prepare(builds: list, scale_dtype, group_size: int, bits: int) -> None:
    """Compile the timed launches (1 and 8 rows) of these builds at once, on threads (NVRTC runs outside the
    GIL: ~2 s a program, one after another at their first calls otherwise; once per machine: cuda_cache.py)."""
    from concurrent.futures import ThreadPoolExecutor

    prepares = [f.prepare for f in builds if hasattr(f, "prepare")]
    if prepares:
        with ThreadPoolExecutor(len(prepares)) as pool:
            list(pool.map(lambda p: p([scale_dtype], scale_dtype, group_size, bits, rows=TENSOR_CORE_ROWS), prepares))


def tensor_cores_win(fma_us: dict, mma_us: dict, mlx_us: dict | None = None) -> bool:
    """The rule on microseconds per row count (TENSOR_CORE_ROWS): a cheaper step + verify round, and a
    step within the budget of the FMA kernel's or of MLX's own op, whichever is dearer (exact mode
    promises plain decoding within EXACT_BUDGET of MLX's ops). On an H200 (2026-11-27) a 6-bit
    128256 x 4096 head took 264 / 299 us at 1 / 8 rows with tensor cores, 183 / 481 with FMA and 255 /
    542 with MLX's op: the tensor cores keep a step within 4% of MLX's and make the round 15% cheaper."""
    one, _ = TENSOR_CORE_ROWS
    step_bound = max(fma_us[one], (mlx_us or {}).get(one, 0.0))
    return (sum(mma_us[m] for m in TENSOR_CORE_ROWS) < sum(fma_us[m] for m in TENSOR_CORE_ROWS)
            and mma_us[one] <= TENSOR_CORE_STEP_BUDGET * step_bound)


# (rows, keys) the attention families are timed at: a decoding step and a verify pass (k = 7, 15) over a short and a
# long cache. The FMA family's cost grows with rows x keys; the matrix units' mostly with keys (16 slots a warp).
ATTENTION_TIMED = ((1, 1024), (8, 1024), (1, 8192), (16, 8192))
# Keys a warp walks, timed beside the matrix family's default (gpu_attention_mma_source.CHUNK): each orders the sums
# otherwise (its own bits), so a signature keeps the one chosen for every launch; smaller chunks keep more warps busy
# over a short cache, larger ones write fewer partial states. A guess at the range, unmeasured on a device.
OTHER_CHUNKS = (64, 256)


def prefer_tensor_core_attention(fma, mma, heads: int, kv_heads: int, dim: int, value_dim: int, dtype, kv_dtype=None,
                                 backend: str = "cuda") -> int:
    """Time the FMA attention and the matrix-unit one (CUDA's tensor cores: gpu_attention_mma_source.py; Metal's
    simdgroup matrices: gpu_attention_simdgroup_source.py; its default chunk and OTHER_CHUNKS) on this signature at
    ATTENTION_TIMED (cached on disk per device and MLX version, shown by doctor), each call chained as a forward
    makes it. Returns the chunk of the matrix build that serves the signature, 0 for the FMA family: of the builds
    that cost less than FMA in total and keep every one-row step within TENSOR_CORE_STEP_BUDGET of the dearer of
    the FMA kernel's and MLX's own op (as tensor_cores_win for qmm), the cheapest in total.
    Unmeasured on a device when written (2026-11-28): the rule's inputs are what the device measures."""
    from .registry import kernel

    kv_dtype = kv_dtype or dtype
    default = mma.chunk
    builds = {default: mma} | {c: mma.with_chunk(c) for c in OTHER_CHUNKS if c != default}
    times = {"fma": {}, "mlx": {}} | {c: {} for c in builds}
    for name, family, fn in [("fma", "sdpa", fma)] + [(c, "sdpa-mma", f) for c, f in builds.items()]:
        rec = kernel(family, backend)
        for m, keys in ATTENTION_TIMED:
            signature = f"{heads}x{kv_heads} d{dim}/{value_dim} {str(dtype).split('.')[-1]} M={m} L={keys}"
            signature += f" kv {str(kv_dtype).split('.')[-1]}" if kv_dtype != dtype else ""
            signature += f" c{name}" if name not in ("fma", default) else ""
            entry = cached_timing(rec, signature)
            if entry is None:
                entry = record_timing(rec, signature, *_attention_us(fn, heads, kv_heads, dim, value_dim, dtype, kv_dtype,
                                                                     m, keys))
            times[name][m, keys] = entry["kernel_us"]
            times["mlx"][m, keys] = min(times["mlx"].get((m, keys), entry["mlx_us"]), entry["mlx_us"])
    totals = {c: sum(times[c].values()) for c in builds if sum(times[c].values()) < sum(times["fma"].values())
              and all(times[c][m, keys] <= TENSOR_CORE_STEP_BUDGET * max(times["fma"][m, keys], times["mlx"][m, keys])
                      for m, keys in ATTENTION_TIMED if m == 1)}
    return min(totals, key=lambda c: (totals[c], c != default)) if totals else 0


def _attention_us(fn, heads: int, kv_heads: int, dim: int, value_dim: int, dtype, kv_dtype, m: int,
                  keys: int) -> tuple[float, float]:
    """(fn's, MLX's) chained microseconds a causal call of m rows over `keys` cached keys."""
    kq, kk, kv = mx.random.split(mx.random.key(keys + m), 3)
    q = mx.random.normal((1, heads, m, dim), key=kq).astype(dtype)
    k = mx.random.normal((1, kv_heads, keys, dim), key=kk).astype(kv_dtype)
    v = mx.random.normal((1, kv_heads, keys, value_dim), key=kv).astype(kv_dtype)
    kx, vx = k.astype(dtype), v.astype(dtype)  # MLX's op: one dtype (a float16 cache read as float32)
    mx.eval(q, k, v, kx, vx)
    scale = dim**-0.5
    ours = latency_us(lambda q_: fn(q_, k, v, scale, True), q)
    theirs = latency_us(lambda q_: mx.fast.scaled_dot_product_attention(q_, kx, vx, scale=scale, mask="causal"), q)
    return ours, theirs
