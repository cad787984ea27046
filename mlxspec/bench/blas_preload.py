"""Use an installed optimized BLAS instead of the reference one MLX's Linux wheel bundles.

The CLI calls `ensure_fast_blas()` first thing. On Linux, when MLX's bundled BLAS is the reference
one and an OpenBLAS is installed, it re-executes the same command with that OpenBLAS in
LD_PRELOAD (the only way to reach MLX's already-resolved `cblas_sgemm`), but only after a child
process with that preload has shown that MLX really calls it and that a GEMM agrees with numpy
(the verdict is cached per library, MLX version and Python). Guards:
  - MLXSPEC_BLAS=off disables it; MLXSPEC_BLAS=/path/lib.so picks the library;
  - MLXSPEC_BLAS_PRELOADED (set on the re-executed process) stops a second re-exec and tells
    `mlxspec doctor` that mlxspec did it;
  - an LD_PRELOAD that already names a BLAS is the user's choice and left alone;
  - never inside a pytest run (PYTEST_CURRENT_TEST): re-executing would replace the test runner.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import platform
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

MODE_ENV = "MLXSPEC_BLAS"
PRELOADED_ENV = "MLXSPEC_BLAS_PRELOADED"
SEARCH = (  # pthread builds first: MLX calls BLAS from its own threads, OpenMP builds dislike that
    "/usr/lib/{triplet}/openblas-pthread/libopenblas.so.0",
    "/usr/lib/{triplet}/libopenblas.so.0",
    "/usr/lib/{triplet}/openblas-openmp/libopenblas.so.0",
    "/usr/lib/{triplet}/openblas-serial/libopenblas.so.0",
    "/usr/lib64/libopenblasp.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/local/lib/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)


@dataclass
class Decision:
    action: str  # 'preload' (re-exec with LD_PRELOAD) or 'skip'
    reason: str
    library: str | None = None


def find_optimized_blas() -> str | None:
    """An installed OpenBLAS shared library (its stable soname path), or None."""
    if not sys.platform.startswith("linux"):
        return None
    triplet = f"{platform.machine()}-linux-gnu"
    for pattern in SEARCH:
        for path in glob.glob(pattern.format(triplet=triplet)):
            if os.path.isfile(path):
                return path
    return None


def bundled_reference_blas() -> str | None:
    """The reference BLAS vendored into MLX's Linux wheel (found without importing MLX)."""
    spec = importlib.util.find_spec("mlx")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:  # a namespace package: maybe several
        site = Path(location).parent
        for path in sorted(site.glob("mlx*.libs/libblas*.so*")) + sorted(site.glob("mlx/lib/libblas*.so*")):
            return str(path)
    return None


def plan(env: dict | None = None) -> Decision:
    env = os.environ if env is None else env
    mode = env.get(MODE_ENV, "auto").strip()
    if not sys.platform.startswith("linux"):
        return Decision("skip", "not Linux: MLX uses the platform's BLAS (Accelerate on macOS)")
    if mode.lower() in ("off", "0", "no", "none", "false"):
        return Decision("skip", f"{MODE_ENV}={mode}")
    if env.get("PYTEST_CURRENT_TEST"):
        return Decision("skip", "inside a test run: never re-execute the test runner")
    if env.get(PRELOADED_ENV):
        return Decision("skip", "already preloaded by mlxspec", env[PRELOADED_ENV])
    if "blas" in env.get("LD_PRELOAD", "").lower():
        return Decision("skip", "LD_PRELOAD already names a BLAS")
    if bundled_reference_blas() is None:
        return Decision("skip", "MLX does not bundle the reference BLAS here")
    library = mode if mode.lower() != "auto" else find_optimized_blas()
    if not library:
        return Decision("skip", "no optimized BLAS installed (apt-get install libopenblas0-pthread)")
    if not os.path.isfile(library):
        return Decision("skip", f"{MODE_ENV}={library}: no such file")
    return Decision("preload", "reference BLAS bundled, optimized one installed", library)


def preload_env(library: str, env: dict | None = None) -> dict:
    env = dict(os.environ if env is None else env)
    env["LD_PRELOAD"] = ":".join(p for p in (library, env.get("LD_PRELOAD", "")) if p)
    env[PRELOADED_ENV] = library
    return env


def self_check(library: str, use_cache: bool = True) -> bool:
    """In a child with `library` preloaded: does MLX call it, and does a GEMM come out right?"""
    key = _cache_key(library)
    cache = _cache_file()
    verdicts = _read_json(cache) if use_cache else {}
    if key in verdicts:
        return bool(verdicts[key])
    from .blas import measure_in_subprocess

    result = measure_in_subprocess(preload_env(library), ["--no-gemm"], timeout=120)
    ok = bool(result and result.get("check") and result.get("library")
              and os.path.realpath(result["library"]) == os.path.realpath(library))
    if use_cache:
        verdicts[key] = ok
        _write_json(cache, verdicts)
    return ok


def ensure_fast_blas() -> Decision:
    """Call first thing in the CLI: re-executes the process when it pays and is safe; else returns."""
    decision = plan()
    if decision.action != "preload":
        return decision
    if not self_check(decision.library):
        return Decision("skip", "self-check failed: MLX did not call it or a GEMM disagreed", decision.library)
    argv = [sys.executable] + list(getattr(sys, "orig_argv", sys.argv)[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, argv, preload_env(decision.library))
    except OSError as e:  # exec refused: carry on with the reference BLAS
        return Decision("skip", f"re-exec failed: {e}", decision.library)
    return decision  # not reached


def _cache_file() -> Path:
    if os.environ.get("MLXSPEC_CACHE_DIR"):
        return Path(os.environ["MLXSPEC_CACHE_DIR"]) / "blas-check.json"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mlxspec" / "blas-check.json"


def _cache_key(library: str) -> str:
    try:
        st = os.stat(library)
        stamp = f"{st.st_size}:{int(st.st_mtime)}"
    except OSError:
        stamp = "missing"
    try:
        mlx_version = version("mlx")
    except PackageNotFoundError:
        mlx_version = "none"
    return f"{os.path.realpath(library)}|{stamp}|mlx {mlx_version}|{sys.executable}"


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # no cache: the check runs again next time
