"""Which kernel runs on which device, and whether it has proven itself there.

    qmm, why_not = kernel_for_layer(n=1536, k=576, group_size=32, bits=4, scale_dtype=mx.float16)

A kernel is used for a layer shape only after a self-check on this device: random weights of that
shape, random inputs, the result within `reference.within_tolerance` of MLX's own op, and each row
of a 4-row call bit-identical to the 1-row call (what greedy speculative decoding relies on).
Results are cached per process; a failure logs one warning and the caller keeps MLX's op.
`status()` says what is active and why, for `mlxspec doctor`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx

from .build import KernelUnavailable
from .reference import random_quantized, within_tolerance

log = logging.getLogger("mlxspec.kernels")

CHECK_ROWS = 4  # rows of the self-check call; rows 0 and 3 are also run alone


@dataclass
class Backend:
    name: str  # "cpu", "metal", "cuda"
    qmm: Callable[..., mx.array] | None = None
    detail: str = ""  # e.g. "avx512, 2 threads"
    error: str | None = None  # why it is unavailable
    checks: dict = field(default_factory=dict)  # signature -> None (passed) or the failure


_backends: dict[str, Backend] = {}
_warned: set[str] = set()


def disabled() -> str | None:
    """MLXSPEC_KERNELS=0 turns every custom kernel off."""
    return "disabled by MLXSPEC_KERNELS=0" if os.environ.get("MLXSPEC_KERNELS", "1") == "0" else None


def warn_once(message: str, fallback: str = "MLX's quantized_matmul") -> None:
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


def backend(name: str) -> Backend:
    """Load (build, compile) a backend once per process; its `error` says why it is unusable."""
    if name in _backends:
        return _backends[name]
    b = Backend(name)
    try:
        b.qmm, b.detail = _load(name)
    except KernelUnavailable as e:
        b.error = str(e)
    except Exception as e:  # a broken toolchain must not break model loading
        b.error = f"{type(e).__name__}: {e}"
    _backends[name] = b
    return b


def _load(name: str):
    if name == "cpu":
        from .build import load_cpu_extension
        from .cpu import cpu_qmm_function

        fn = cpu_qmm_function()
        return fn, f"{fn.isa}, {load_cpu_extension().threads()} threads"
    if name == "metal":
        from .gpu import metal_qmm_function

        return metal_qmm_function(), "mx.fast.metal_kernel"
    if name == "cuda":
        from .gpu import cuda_qmm_function

        return cuda_qmm_function(), "mx.fast.cuda_kernel"
    raise KernelUnavailable(f"no kernel backend {name!r}")


def kernel_for_layer(
    n: int, k: int, group_size: int, bits: int, scale_dtype: mx.Dtype, device: mx.Device | None = None
) -> tuple[Callable[..., mx.array] | None, str]:
    """(qmm, description) if the device's kernel passed its self-check for this shape, else (None, why)."""
    if disabled():
        return None, disabled()
    b = backend(device_backend_name(device))
    if b.error:
        warn_once(f"mlxspec {b.name} kernel unavailable: {b.error.splitlines()[0]}")
        return None, f"{b.name} kernel unavailable: {b.error}"
    signature = (n, k, group_size, bits, str(scale_dtype))
    if signature not in b.checks:
        b.checks[signature] = self_check(b.qmm, n, k, group_size, bits, scale_dtype)
    failure = b.checks[signature]
    if failure:
        warn_once(f"mlxspec {b.name} kernel failed its self-check on {signature}: {failure}")
        return None, f"{b.name} kernel failed its self-check: {failure}"
    return b.qmm, f"{b.name} ({b.detail})"


def self_check(qmm, n: int, k: int, group_size: int, bits: int, scale_dtype: mx.Dtype) -> str | None:
    """None if `qmm` matches the reference on random inputs of this shape, else what went wrong."""
    try:
        key = mx.random.key(n * 7919 + k)
        w, s, b = random_quantized(n, k, group_size, bits, scale_dtype, key=key)
        for x_dtype in dict.fromkeys([scale_dtype, mx.float32]):
            x = mx.random.normal((CHECK_ROWS, k), key=mx.random.split(key)[1]).astype(x_dtype)
            y = qmm(x, w, s, b, group_size, bits)
            ok, ratio = within_tolerance(y, x, w, s, b, group_size, bits)
            if not ok:
                return f"x {x_dtype}: error {ratio:.3g}x the tolerance"
            for i in (0, CHECK_ROWS - 1):
                if not mx.array_equal(qmm(x[i : i + 1], w, s, b, group_size, bits)[0], y[i]).item():
                    return f"x {x_dtype}: row {i} of a {CHECK_ROWS}-row call differs from the 1-row call"
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def status() -> list[dict]:
    """One entry per backend tried in this process: active or not, and why (for `mlxspec doctor`)."""
    out = []
    for b in _backends.values():
        passed = [s for s, f in b.checks.items() if f is None]
        failed = {str(s): f for s, f in b.checks.items() if f}
        out.append({
            "kernel": f"{b.name}-qmm",
            "active": b.error is None and bool(passed),
            "detail": b.detail,
            "reason": b.error or (f"self-check passed on {len(passed)} shape(s)" if passed else "not used yet"),
            "failed_checks": failed,
        })
    return out


def reset() -> None:
    """Forget loaded backends and checks (tests)."""
    _backends.clear()
    _warned.clear()
