"""Which BLAS MLX's CPU backend calls, whether it is the slow reference one, and its fp32 GEMM speed.

The Linux `mlx[cpu]` wheel bundles the reference (netlib) BLAS: fp32 GEMM runs at a few GFLOP/s
where OpenBLAS reaches hundreds (../shared/reference/findings.md). MLX calls `cblas_sgemm`; the
dynamic linker resolves it in the global scope first (the executable and LD_PRELOAD libraries),
then in MLX's own dependencies. So the library MLX uses is the global provider of `cblas_sgemm`
when there is one, else the BLAS bundled beside MLX. We read that from the process's own mappings
(/proc/self/maps) and `dladdr`, not from file names alone: Debian's OpenBLAS also ships a
`libblas.so.3`.

    python -m mlxspec.bench.blas            # JSON: this process's BLAS and GEMM GFLOP/s
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

BLAS_NAME = re.compile(r"(blas|mkl_rt|mkl_core|blis|flexiblas|armpl|nvpl|accelerate)", re.I)
# A symbol each optimized library exports and the reference BLAS does not.
SIGNATURES = {
    "openblas": "openblas_get_config",
    "mkl": "mkl_get_version",
    "blis": "bli_info_get_version_str",
    "flexiblas": "flexiblas_current_backend",
}


def mapped_libraries(maps: str | None = None) -> list[str]:
    """Shared objects mapped into this process, in load order (Linux; [] elsewhere)."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    seen: dict[str, None] = {}
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and ".so" in parts[5]:
            seen.setdefault(parts[5].strip(), None)
    return list(seen)


def blas_candidates(libraries: list[str]) -> list[str]:
    return [p for p in libraries if BLAS_NAME.search(Path(p).name) and "lapack" not in Path(p).name]


def _loaded(path: str):
    """The already-loaded library at `path` (never loads a new one), or None."""
    try:
        return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None


def exports(path: str, symbol: str) -> bool:
    lib = _loaded(path)
    return lib is not None and hasattr(lib, symbol)


def classify(path: str) -> str:
    """'openblas', 'mkl', 'blis', 'flexiblas', 'accelerate', 'reference' or 'unknown'."""
    name = Path(path).name.lower()
    for kind, symbol in SIGNATURES.items():
        if kind in name or exports(path, symbol):
            return kind
    if "accelerate" in name or "veclib" in name:
        return "accelerate"
    if name.startswith("libblas") or name.startswith("libcblas"):
        return "reference"  # netlib's name, and none of the optimized libraries' signatures
    return "unknown"


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def global_provider(symbol: str = "cblas_sgemm") -> str | None:
    """The file that serves `symbol` from the global scope (e.g. an LD_PRELOAD library), if any."""
    try:
        process = ctypes.CDLL(None)
        address = ctypes.cast(getattr(process, symbol), ctypes.c_void_p)
    except (AttributeError, OSError):
        return None
    info = _DlInfo()
    dladdr = process.dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    if not dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.realpath(info.dli_fname.decode())


def mlx_blas(libraries: list[str]) -> str | None:
    """The BLAS library MLX's `cblas_sgemm` calls land in (import mlx.core first)."""
    provider = global_provider()
    if provider:
        return provider
    import mlx

    roots = [str(Path(p).parent) for p in mlx.__path__]
    for path in blas_candidates(libraries):
        # mlx's own lib dir, or the wheel's vendored libs beside it (mlx_cpu.libs/)
        if any(path.startswith(r) or path.startswith(str(Path(r) / "mlx_cpu.libs")) for r in roots):
            if exports(path, "cblas_sgemm"):
                return path
    return next((p for p in blas_candidates(libraries) if exports(p, "cblas_sgemm")), None)


def blas_report() -> dict:
    import mlx.core  # noqa: F401  (maps MLX's libraries into this process)

    from .blas_preload import PRELOADED_ENV, find_optimized_blas

    if sys.platform == "darwin":
        return {"library": "Accelerate.framework", "kind": "accelerate", "reference": False,
                "preloaded_by_mlxspec": False, "optimized_installed": None, "advice": None, "mapped": []}
    libraries = mapped_libraries()
    library = mlx_blas(libraries)
    kind = classify(library) if library else "unknown"
    preloaded = os.environ.get(PRELOADED_ENV)
    installed = find_optimized_blas()
    return {
        "library": library,
        "kind": kind,
        "reference": kind == "reference",
        "preloaded_by_mlxspec": bool(preloaded) and library is not None
        and os.path.realpath(preloaded) == os.path.realpath(library),
        "ld_preload": os.environ.get("LD_PRELOAD"),
        "optimized_installed": installed,
        "mapped": blas_candidates(libraries),
        "advice": advice(kind, installed, os.environ.get("MLXSPEC_BLAS", "auto")),
    }


def advice(kind: str, installed: str | None, mode: str = "auto") -> str | None:
    if kind != "reference":
        return None
    if installed and mode.lower() in ("off", "0", "no", "none", "false"):
        return (f"MLX uses the slow reference BLAS because MLXSPEC_BLAS={mode}: unset it to let the `mlxspec` "
                f"command preload {installed}")
    if installed:
        return (f"MLX's wheel links the slow reference BLAS; an optimized one is installed ({installed}): "
                f"the `mlxspec` command preloads it at start-up (MLXSPEC_BLAS=auto, the default), or run "
                f"LD_PRELOAD={installed} python ...")
    return ("MLX's wheel links the slow reference BLAS (fp32 GEMM a few GFLOP/s): install OpenBLAS "
            "(Debian/Ubuntu: apt-get install libopenblas0-pthread; Fedora: dnf install openblas-threads) "
            "and the `mlxspec` command preloads it at start-up, or set "
            "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0")


def gemm_gflops(n: int = 1024, seconds: float = 0.5, min_repeats: int = 2) -> float:
    """fp32 n x n GEMM through MLX: 2 n^3 flops per product, repeated for about `seconds`."""
    import mlx.core as mx

    a, b = mx.random.normal((n, n)), mx.random.normal((n, n))
    mx.eval(a @ b)  # warm-up
    count, start = 0, time.perf_counter()
    while count < min_repeats or time.perf_counter() - start < seconds:
        mx.eval(a @ b)
        count += 1
    return round(2 * n**3 * count / (time.perf_counter() - start) / 1e9, 2)


def gemm_check(n: int = 96) -> bool:
    """Does MLX's matmul (through this BLAS) agree with a float64 numpy product?"""
    import mlx.core as mx
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n + 7), dtype=np.float32), rng.standard_normal((n + 7, n - 5), dtype=np.float32)
    got = np.array(mx.array(a) @ mx.array(b))
    want = a.astype(np.float64) @ b.astype(np.float64)
    return bool(np.allclose(got, want, rtol=1e-4, atol=1e-3))


def measure_in_subprocess(env: dict, args: list[str] = (), timeout: float = 60) -> dict | None:
    """Run `python -m mlxspec.bench.blas [args]` under `env`; its JSON, or None if it failed."""
    try:
        out = subprocess.run([sys.executable, "-m", "mlxspec.bench.blas", *args], env=env, capture_output=True,
                             text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def _main() -> None:
    import mlx.core  # noqa: F401

    library = mlx_blas(mapped_libraries())
    print(json.dumps({
        "library": library, "kind": classify(library) if library else "unknown",
        "check": gemm_check(), "gflops": gemm_gflops() if "--no-gemm" not in sys.argv else None,
    }))


if __name__ == "__main__":
    _main()
