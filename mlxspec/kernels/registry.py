"""One registry for every kernel family: which kernel runs on which device, and what it proved there.

    rec = kernel("qmm")                    # the KernelRecord of this family on the default device
    if rec.check(signature, run) is None:  # self-check once per signature and process (None: passed)
        y = rec.fn(...)
    status()                               # one list for `mlxspec doctor`: every family tried, why (not)

A record is loaded once per process (build, JIT); `error` says why it is unusable (no such device,
a failed build). A signature is used only after its self-check on this device: the result within
tolerance of MLX's op, and each row of a many-row call bit-identical to the one-row call (what greedy
speculative decoding relies on). A failure logs one warning and the caller keeps MLX's op.
`timings` holds what timing.py measured for a signature (kernel vs MLX's op, microseconds).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import mlx.core as mx

from .build import KernelUnavailable

log = logging.getLogger("mlxspec.kernels")

CHECK_ROWS = 4  # rows of the qmm self-check call; its first and last rows are also run alone
MMA_CHECK_ROWS = 72  # the tensor-core qmm's: 8 row tiles a warp, two row blocks (a prompt chunk's launch)


@dataclass
class KernelRecord:
    family: str  # "qmm", "sdpa", "pointwise", "accept", ...
    backend: str  # "cpu", "metal", "cuda"
    fn: Any = None  # what the family's loader returned: a function, an extension module, a pair...
    detail: str = ""  # e.g. "avx512, 2 threads"
    error: str | None = None  # why it is unusable here
    checks: dict = field(default_factory=dict)  # signature -> None (passed) or the failure
    timings: dict = field(default_factory=dict)  # signature -> {"kernel_us": .., "mlx_us": ..}
    chosen: dict = field(default_factory=dict)  # signature -> did the timings pick this kernel (qmm-mma)
    seconds: dict = field(default_factory=dict)  # "load" / "checks" / "timing" -> wall seconds first use cost here

    @property
    def name(self) -> str:
        return f"{self.backend}-{self.family}"

    def check(self, signature: tuple, run: Callable[[], str | None]) -> str | None:
        """Run `run` (the self-check of `signature`) once per process; None if it passed, else why not."""
        if self.error:
            return self.error
        if signature not in self.checks:
            for watcher in _watchers:
                watcher("begin", self.family, signature)
            with self.spending("checks"):  # a GPU kernel's first call compiles it (NVRTC, Metal)
                try:
                    failure = run()
                except Exception as e:  # a kernel that throws is a kernel that failed
                    failure = one_line(e)
            for watcher in _watchers:
                watcher("end", self.family, signature, failure)
            self.checks[signature] = failure
            if failure:
                warn_once(f"mlxspec {self.name} kernel failed its self-check on {signature}: {failure}")
        return self.checks[signature]

    @contextmanager
    def spending(self, what: str):
        """Add the wall time of the block to seconds[what] (status shows it: where a first load goes). A timing
        launches builds of its own (other chunks, K splits): watchers hear of it as of a check."""
        announced = _watchers if what == "timing" else []
        for watcher in announced:
            watcher("begin", self.family, what)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[what] = self.seconds.get(what, 0.0) + time.perf_counter() - start
            for watcher in announced:
                watcher("end", self.family, what, None)

    def status(self) -> dict:
        passed = [str(s) for s, f in self.checks.items() if f is None]
        failed = {str(s): f for s, f in self.checks.items() if f}
        reason = self.error or (f"self-check passed on {len(passed)} signature(s)" if passed else "not used yet")
        return {"kernel": self.name, "active": self.error is None and bool(passed), "detail": self.detail,
                "reason": reason, "passed": passed, "failed": failed,
                "timings": {str(s): t for s, t in self.timings.items()},
                "seconds": {what: round(t, 3) for what, t in self.seconds.items()},
                **({"chosen": {str(s): c for s, c in self.chosen.items()}} if self.chosen else {}),
                **({"groups_experts": self.fn.groups_experts} if hasattr(self.fn, "groups_experts") else {}),
                **({"trees": self.fn.trees} if hasattr(self.fn, "trees") else {}),
                # attention over a compiled step's cache buffers: builds stored once per machine (CUDA), or the JIT's
                **({"stored_buffers": self.fn.stored_buffers} if hasattr(self.fn, "stored_buffers") else {})}


# family -> loader(backend) -> (fn, detail); raises KernelUnavailable where the family has no such kernel
_loaders: dict[str, Callable[[str], tuple[Any, str]]] = {}
_records: dict[tuple[str, str], KernelRecord] = {}
_warned: set[str] = set()
EVERY = "*"  # an excluded family name: every family of the backend
_excluded: dict[tuple[str, str], str] = {}  # (family or EVERY, backend) -> why it is off on this device (first_run.py)
_watchers: list[Callable] = []  # called as each self-check begins and ends (first_run.py's child reports them)


def register(family: str, loader: Callable[[str], tuple[Any, str]]) -> None:
    _loaders[family] = loader


def kernel(family: str, backend: str | None = None) -> KernelRecord:
    """The family's record on `backend` (default: the default device's), loaded on first use."""
    backend = backend or device_backend_name()
    key = (family, backend)
    if key not in _records:
        if backend != "cpu":  # a GPU's kernels run first in a child process, once per device and version
            from .first_run import settle

            settle(backend)
        rec = KernelRecord(family, backend)
        rec.error = _excluded.get(key) or _excluded.get((EVERY, backend))
        try:
            if rec.error is None:
                with rec.spending("load"):  # the CPU extension's first build, a GPU program's source
                    rec.fn, rec.detail = _loaders[family](backend)
        except KernelUnavailable as e:
            rec.error = str(e)
        except Exception as e:  # a broken toolchain must not break model loading
            rec.error = f"{type(e).__name__}: {e}"
        _records[key] = rec
    return _records[key]


def exclude(family: str, backend: str, why: str) -> None:
    """Turn a family (EVERY: every family) off on this backend for the process: its record's error says why."""
    _excluded[(family, backend)] = why
    for (name, on), rec in _records.items():
        if on == backend and family in (name, EVERY):
            rec.error = why


def watch(watcher: Callable) -> None:
    """watcher("begin", family, signature) and watcher("end", family, signature, failure) around each self-check
    that runs (first_run.py's child prints them, so its parent knows which check a death interrupted)."""
    _watchers.append(watcher)


def status() -> list[dict]:
    """One entry per kernel family and backend tried in this process: active or not, and why."""
    from .first_run import status as first_runs

    return [r.status() for r in _records.values()] + first_runs()


def reset() -> None:
    """Forget loaded kernels, checks and timings (tests)."""
    _records.clear()
    _warned.clear()
    _excluded.clear()


def one_line(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}"


def warn_once(message: str, fallback: str = "MLX's op") -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s; using %s", message, fallback)


def device_backend_name(device: mx.Device | None = None) -> str:
    """'cpu' on a CPU device; on a GPU, 'metal' or 'cuda' by what this MLX was built with."""
    device = device or mx.default_device()
    if isinstance(device, mx.DeviceType):  # mx.cpu / mx.gpu
        device = mx.Device(device)
    if device.type == mx.cpu:
        return "cpu"
    if mx.metal.is_available():
        return "metal"
    return "cuda"


# ---------------------------------------------------------------- the qmm family


def _load_qmm(backend: str):
    if backend == "cpu":
        from .build import load_cpu_extension
        from .cpu import cpu_qmm_function

        fn = cpu_qmm_function()
        return fn, f"{fn.isa}, {load_cpu_extension().threads()} threads"
    from . import gpu

    fn = gpu.metal_qmm_function() if backend == "metal" else gpu.cuda_qmm_function()
    return fn, f"mx.fast.{backend}_kernel" + _compiled(backend)


register("qmm", _load_qmm)


def _compiled(backend: str) -> str:
    """How CUDA programs are built here (cuda_cache.py: once per machine, or MLX's JIT in each process)."""
    if backend != "cuda":
        return ""
    from .cuda_cache import detail

    return f"; {detail()}"


def _load_qmm_q8(backend: str):
    """int8 activations (llama.cpp's arithmetic): the CPU kernel only."""
    if backend != "cpu":
        raise KernelUnavailable(f"int8 activations are a CPU kernel ({backend} keeps its own)")
    from .build import load_cpu_extension
    from .cpu import cpu_qmm_function, q8_path

    fn = cpu_qmm_function(activations="q8")
    how = {"avx512-vnni": "avx512-vnni int8 dot products", "avx2": "avx2 int8 dot products"}.get(
        q8_path(), "portable lane emulation (slow)")
    return fn, f"{how}, {load_cpu_extension().threads()} threads"


register("qmm-q8", _load_qmm_q8)


def _load_mlx_rows(backend: str):
    """Verify rows with the bits of MLX's own one-row qmm (mlx_rows.py): Metal only."""
    if backend != "metal":
        raise KernelUnavailable(f"MLX's one-row bits are mirrored from its Metal kernel (not on {backend})")
    from .mlx_rows import mlx_rows_function

    return mlx_rows_function(), f"MLX {mx.__version__}'s qmv_fast one row at a time, its rows in one launch"


register("qmm-mlx-rows", _load_mlx_rows)


def _load_qmm_mma(backend: str):
    """The matrix-unit qmm: tensor cores on CUDA, simdgroup matrices on Metal; what it does not take (float32
    x on CUDA, mxfp4 on both) goes to the FMA kernel of the "qmm" family."""
    from . import gpu

    if backend == "cuda":
        return gpu.cuda_mma_qmm_function(kernel("qmm", backend).fn), "mx.fast.cuda_kernel, mma.sync m16n8k16" + _compiled(backend)
    if backend == "metal":
        return gpu.metal_mma_qmm_function(kernel("qmm", backend).fn), "mx.fast.metal_kernel, simdgroup_matrix 8x8"
    raise KernelUnavailable(f"the matrix-unit qmm is a GPU kernel ({backend} keeps its own)")


register("qmm-mma", _load_qmm_mma)


def _load_gather_qmm(backend: str):
    """MoE experts on a GPU (the CPU gathers through its qmm tiles, checked with them: layers.py)."""
    if backend == "cpu":
        raise KernelUnavailable("on the CPU experts run the qmm kernel's tiles (cpu_gather_qmm_function)")
    from . import gpu

    fn = gpu.metal_gather_qmm_function() if backend == "metal" else gpu.cuda_gather_qmm_function()
    return fn, f"mx.fast.{backend}_kernel" + _compiled(backend)


register("gather-qmm", _load_gather_qmm)


def kernel_for_layer(
    n: int, k: int, group_size: int, bits: int, scale_dtype: mx.Dtype, device: mx.Device | None = None,
    activations: str = "f32", mode: str = "affine",
) -> tuple[Callable[..., mx.array] | None, str]:
    """(qmm, description) if the device's kernel passed its self-check for this shape, else (None, why).
    activations='q8': the int8-activation kernel (CPU), checked against its own definition.
    mode='mxfp4': gpt-oss's layout (the GPU kernels take it; the CPU one does not)."""
    rec = kernel("qmm-q8" if activations == "q8" else "qmm", device_backend_name(device))
    signature = (n, k, group_size, bits, str(scale_dtype)) + _mode_tag(mode)
    if rec.backend == "metal" and activations == "f32" and mode == "affine":  # MLX's own one-row bits (qmv)
        rows, rows_why = _mlx_rows_or(signature, n, k, group_size, bits, scale_dtype)
        if rows is not None:
            return rows, rows_why
    fma, why = _checked(rec, signature, lambda: self_check(rec.fn, n, k, group_size, bits, scale_dtype, activations, mode))
    if rec.backend not in ("cuda", "metal") or activations != "f32":
        return fma, why
    return _tensor_cores_or(fma, why, signature, n, k, group_size, bits, scale_dtype, mode, rec.backend)


def _mlx_rows_or(signature: tuple, n: int, k: int, group_size: int, bits: int, scale_dtype: mx.Dtype):
    """(qmm, why) of the "qmm-mlx-rows" family (mlx_rows.py: one row through MLX's op, verify rows with its bits) where
    it takes the layer and passed its self-check here; else (None, why not)."""
    from . import mlx_rows

    if not mlx_rows.supports(n, k, group_size, bits, scale_dtype):
        return None, "not a layer MLX's qmv_fast or qmv serves over whole tiles"
    rec = kernel("qmm-mlx-rows", "metal")
    return _checked(rec, signature, lambda: mlx_rows.self_check(rec.fn, n, k, group_size, bits, scale_dtype))


def _tensor_cores_or(fma, why: str, signature: tuple, n: int, k: int, group_size: int, bits: int,
                     scale_dtype: mx.Dtype, mode: str, backend: str = "cuda"):
    """On a GPU, the matrix-unit qmm (CUDA's tensor cores, Metal's simdgroup matrices) instead of the FMA one
    where it handles the layer, passed its self-check and timed faster here (timing.prefer_tensor_cores).
    Both are row-invariant; the choice is made once per layer shape, so a layer's one-row steps and verify
    rows always meet one kernel."""
    from . import gpu_mma_source, gpu_simdgroup_source

    source = gpu_mma_source if backend == "cuda" else gpu_simdgroup_source
    if not source.supports(scale_dtype, group_size, bits, mode):
        return fma, why
    rec = kernel("qmm-mma", backend)
    mma, mma_why = _checked(rec, signature, lambda: self_check(rec.fn, n, k, group_size, bits, scale_dtype,
                                                               rows=MMA_CHECK_ROWS))
    if mma is None or fma is None:
        return (fma, why) if mma is None else (mma, mma_why)
    if signature not in rec.chosen:  # timed once per shape and process (and the timings once per device)
        from .timing import prefer_tensor_cores

        with rec.spending("timing"):
            rec.chosen[signature] = prefer_tensor_cores(fma, mma, n, k, group_size, bits, scale_dtype, backend)
    split = rec.chosen[signature]  # 0 / False: FMA; True or the default: mma; another: that K split's build
    if not split:
        return fma, why
    if split is True or split == getattr(mma, "ksplit", split):
        return mma, mma_why
    other = mma.with_ksplit(split)
    failure = rec.check(signature + (f"k{split}",), lambda: self_check(other, n, k, group_size, bits, scale_dtype,
                                                                        rows=MMA_CHECK_ROWS))
    return (fma, why) if failure else (other, f"{mma_why}, {split} warps on K")  # failed: the baseline


def gather_for_layer(n: int, k: int, group_size: int, bits: int, scale_dtype: mx.Dtype,
                     device: mx.Device | None = None, mode: str = "affine") -> tuple[Callable[..., mx.array] | None, str]:
    """(gather_qmm, description) for MoE experts on a GPU, if its self-check passed here, else (None, why).
    (The CPU gathers through its qmm tiles: layers.py takes cpu_gather_qmm_function after kernel_for_layer.)"""
    rec = kernel("gather-qmm", device_backend_name(device))
    return _checked(rec, (n, k, group_size, bits, str(scale_dtype)) + _mode_tag(mode),
                    lambda: gather_self_check(rec.fn, n, k, group_size, bits, scale_dtype, mode))


def _mode_tag(mode: str) -> tuple:
    return () if mode == "affine" else (mode,)  # affine signatures read as they always have


def _checked(rec: KernelRecord, signature: tuple, run: Callable[[], str | None]):
    if rec.error:
        warn_once(f"mlxspec {rec.name} kernel unavailable: {rec.error.splitlines()[0]}")
        return None, f"{rec.name} kernel unavailable: {rec.error}"
    failure = rec.check(signature, run)
    if failure:
        return None, f"{rec.name} kernel failed its self-check: {failure}"
    return rec.fn, f"{rec.backend} ({rec.detail})"


def _x_dtypes(scale_dtype: mx.Dtype, mode: str) -> list:
    """The activations a self-check multiplies: the model's (its scales' dtype; bfloat16 for mxfp4) and float32."""
    return list(dict.fromkeys([scale_dtype if mode == "affine" else mx.bfloat16, mx.float32]))


def self_check(qmm, n: int, k: int, group_size: int, bits: int, scale_dtype: mx.Dtype,
               activations: str = "f32", mode: str = "affine", rows: int = CHECK_ROWS) -> str | None:
    """None if `qmm` matches the reference (q8_reference for activations='q8') on random inputs of
    this shape (`rows` rows; the first and last also alone), else what went wrong."""
    from .packing import PACK, pack_codes
    from .reference import random_quantized, within_tolerance

    key = mx.random.key(n * 7919 + k)
    w, s, b = random_quantized(n, k, group_size, bits, scale_dtype, key=key, mode=mode)
    extra = {} if mode == "affine" else {"mode": mode}  # the CPU kernels take no mode
    if hasattr(qmm, "prepare"):  # a GPU kernel's programs for this layout, compiled at once (cuda_cache.py)
        qmm.prepare(_x_dtypes(scale_dtype, mode), scale_dtype, group_size, bits, mode)
    for x_dtype in _x_dtypes(scale_dtype, mode):
        x = mx.random.normal((rows, k), key=mx.random.split(key)[1]).astype(x_dtype)
        y = qmm(x, w, s, b, group_size, bits, **extra)
        ok, ratio = within_tolerance(y, x, w, s, b, group_size, bits, activations, mode)
        if not ok:
            return f"x {x_dtype}: error {ratio:.3g}x the tolerance"
        for i in (0, rows - 1):
            if not mx.array_equal(qmm(x[i : i + 1], w, s, b, group_size, bits, **extra)[0], y[i]).item():
                return f"x {x_dtype}: row {i} of a {rows}-row call differs from the 1-row call"
        if activations == "q8" and n % PACK == 0:  # layers.py packs these layers' codes: the same bits
            if not mx.array_equal(qmm(x, pack_codes(w, bits), s, b, group_size, bits, pack=PACK, **extra), y).item():
                return f"x {x_dtype}: packed codes give other results"
        if activations == "q8" and mode == "affine":  # and biases implied by the scales (GGUF Q4_0 / Q8_0)
            c = -(2.0 ** (bits - 1))
            want = qmm(x, w, s, s * c, group_size, bits)  # zeros passed as biases: the kernel must not read them
            if not mx.array_equal(qmm(x, w, s, mx.zeros_like(s), group_size, bits, bias_of_scale=c), want).item():
                return f"x {x_dtype}: biases implied by the scales give other results"
    return None


def gather_self_check(gather, n: int, k: int, group_size: int, bits: int, scale_dtype: mx.Dtype,
                      mode: str = "affine") -> str | None:
    """None if each row of a gather call (3 experts, 5 rows, two pairs sharing an expert) is within
    tolerance of its expert's reference and equals the same row gathered alone (MoE verify rows =
    one-token steps), else what went wrong. The arithmetic does not depend on the number of experts."""
    from .reference import random_quantized, within_tolerance

    keys = mx.random.split(mx.random.key(n * 7919 + k), 4)
    mats = [random_quantized(n, k, group_size, bits, scale_dtype, key=keys[e], mode=mode) for e in range(3)]
    w, s, b = (None if mats[0][i] is None else mx.stack([m[i] for m in mats]) for i in range(3))
    ids = [1, 0, 1, 2, 0]
    indices = mx.array(ids, mx.uint32)
    if hasattr(gather, "prepare"):  # its programs for this layout, compiled at once (cuda_cache.py)
        gather.prepare(_x_dtypes(scale_dtype, mode), scale_dtype, group_size, bits, mode)
    for x_dtype in _x_dtypes(scale_dtype, mode):
        x = mx.random.normal((len(ids), k), key=keys[3]).astype(x_dtype)
        y = gather(x, w, s, b, indices, group_size, bits, mode=mode)
        for r, e in enumerate(ids):
            ok, ratio = within_tolerance(y[r : r + 1], x[r : r + 1], *mats[e], group_size, bits, mode=mode)
            if not ok:
                return f"x {x_dtype}: row {r} (expert {e}): error {ratio:.3g}x the tolerance"
            alone = gather(x[r : r + 1], w, s, b, indices[r : r + 1], group_size, bits, mode=mode)
            if not mx.array_equal(alone[0], y[r]).item():
                return f"x {x_dtype}: row {r} of a {len(ids)}-row call differs from the row gathered alone"
        if getattr(gather, "groups_experts", False) and (why := _grouping_fails(gather, x, w, s, b, indices, y,
                                                                                group_size, bits, mode)):
            gather.groups_experts = False  # the plain gather still serves every row, one expert read per row
            warn_once(f"mlxspec grouped gather: {why}", "the gather, one expert read per row")
    return None


def _grouping_fails(gather, x, w, s, b, indices, y, group_size: int, bits: int, mode: str) -> str | None:
    """Why the grouped gather (two passes on an expert, or one) does not give the gather's rows y, or None."""
    for most in (2, 4):
        try:
            grouped = gather(x, w, s, b, indices, group_size, bits, mode=mode, per_expert=most)
            if not mx.array_equal(grouped, y).item():
                return f"per_expert={most} gives other bits than the gather"
        except Exception as e:  # a compile error on this device, say
            return f"per_expert={most} failed: {one_line(e)}"
    return None
