"""Build the CPU extension on first use and cache it per source, MLX, Python and CPU.

    module = load_cpu_extension()   # raises KernelUnavailable with the reason when it cannot

The cache lives in $MLXSPEC_CACHE_DIR or ~/.cache/mlxspec/kernels/<key>/, where key hashes the
sources, the MLX and nanobind versions, the Python ABI and the CPU (we compile with -march=native).
Builds go to a temporary directory renamed into place, under a file lock, so two processes never
see half a build.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).parent / "cpu"
SOURCES = ("CMakeLists.txt", "ext.cpp", "pointwise.cpp", "fused_layer.cpp", "delta.cpp", "mlx_io.h", "parallel.h",
           "pointwise_kernel.h", "qmm_kernel.h", "qmm_q8_kernel.h", "scalar_math.h", "sdpa_kernel.h", "simd.h", "simd_neon.h",
           "thread_pool.h")
MODULE = "_mlxspec_cpu"


class KernelUnavailable(RuntimeError):
    """The kernel cannot be built or loaded here; the message says why (one line)."""


def load_once(state: dict, key: str, load):
    """state[key] = load() on first use; a KernelUnavailable is kept in state["error"] and not retried."""
    if state[key] is None and state["error"] is None:
        try:
            state[key] = load()
        except KernelUnavailable as e:
            state["error"] = str(e)
    return state[key]


def cache_root() -> Path:
    if os.environ.get("MLXSPEC_CACHE_DIR"):
        return Path(os.environ["MLXSPEC_CACHE_DIR"]) / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mlxspec" / "kernels"


def read_cached_json(name: str) -> dict:
    """A JSON file of the kernel cache folder ({} where it is missing or unreadable)."""
    import json

    try:
        return json.loads((cache_root() / name).read_text())
    except (OSError, ValueError):
        return {}


def write_cached_json(name: str, data: dict) -> bool:
    """Write it whole or not at all (a reader never sees half a file); False where the folder is read-only."""
    import json

    path = cache_root() / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
        return True
    except OSError:
        return False


def arch_flags() -> list[str]:
    """Tune for this CPU on x86 (AVX-512/AVX2 paths); arm64's NEON needs no flag."""
    return ["-march=native"] if platform.machine().lower() in ("x86_64", "amd64") else []


def _cpu_signature() -> str:
    """-march=native output differs per CPU model: its flags go into the key."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def build_key() -> str:
    import mlx.core as mx

    h = hashlib.sha256()
    for name in SOURCES:
        h.update((SOURCE_DIR / name).read_bytes())
    nb_version = _nanobind_version() or "none"
    parts = [mx.__version__, nb_version, sys.version, sysconfig.get_config_var("EXT_SUFFIX") or "",
             platform.machine(), " ".join(arch_flags()), _cpu_signature()]
    h.update("\n".join(parts).encode())
    return h.hexdigest()[:16]


def _nanobind_version() -> str | None:
    try:
        import nanobind
    except ImportError:
        return None
    return nanobind.__version__


def _find_cmake() -> str | None:
    try:  # the `cmake` PyPI package ships a binary
        import cmake

        candidate = Path(cmake.CMAKE_BIN_DIR) / "cmake"
        if candidate.exists():
            return str(candidate)
    except (ImportError, AttributeError):
        pass
    return shutil.which("cmake")


def _find_compiler() -> str | None:
    for name in filter(None, [os.environ.get("CXX"), "c++", "g++", "clang++"]):
        path = shutil.which(name)
        if path:
            return path
    return None


def built_module_path() -> Path | None:
    """The cached extension for this machine, if it was built already."""
    target = cache_root() / build_key()
    found = sorted(target.glob(f"{MODULE}*.so")) + sorted(target.glob(f"{MODULE}*.pyd"))
    return found[0] if found else None


def ensure_built(verbose: bool = False) -> Path:
    """Path of the extension, building it now if needed (about a minute on 2 cores)."""
    path = built_module_path()
    if path is not None:
        return path
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    key = build_key()
    with _file_lock(root / f"{key}.lock"):
        path = built_module_path()  # another process may have finished while we waited
        if path is None:
            _build(root, key, verbose)
            path = built_module_path()
    if path is None:
        raise KernelUnavailable(f"the build finished but left no {MODULE} module in {root / key}")
    return path


def _build(root: Path, key: str, verbose: bool) -> None:
    cmake, cxx, nb = _find_cmake(), _find_compiler(), _nanobind_version()
    missing = [n for n, ok in (("cmake", cmake), ("a C++ compiler", cxx), ("nanobind", nb)) if not ok]
    if missing:
        raise KernelUnavailable(f"cannot build the CPU kernel: {', '.join(missing)} not found")
    import mlx
    import nanobind

    mlx_dir = Path(list(mlx.__path__)[0]) / "share" / "cmake" / "MLX"
    # a warning so that it shows without logging set up: the first load waits this long, once per machine
    log.warning("building mlxspec's CPU kernels for this CPU (first use only: about a minute on 2 cores)")
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root))
    try:
        out = tmp / "out"
        out.mkdir()
        configure = [cmake, "-S", str(SOURCE_DIR), "-B", str(tmp / "build"), "-DCMAKE_BUILD_TYPE=Release",
                     f"-DCMAKE_CXX_COMPILER={cxx}", f"-DMLX_DIR={mlx_dir}", f"-Dnanobind_DIR={nanobind.cmake_dir()}",
                     f"-DPython_EXECUTABLE={sys.executable}", f"-DMLXSPEC_ARCH_FLAGS={';'.join(arch_flags())}",
                     f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out}"]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        _run(configure, tmp / "build.log", verbose)
        _run([cmake, "--build", str(tmp / "build"), "-j", "2"], tmp / "build.log", verbose)
        shutil.copy(tmp / "build.log", out / "build.log")
        os.replace(out, root / key)  # atomic: readers see nothing or the whole build
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(cmd: list[str], log: Path, verbose: bool) -> None:
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        f.write(proc.stdout)
    if verbose:
        print(proc.stdout)
    if proc.returncode != 0:
        tail = [ln for ln in proc.stdout.splitlines() if ln.strip()][-12:]
        raise KernelUnavailable(f"building the CPU kernel failed ({Path(cmd[0]).name}):\n" + "\n".join(tail))


@contextmanager
def _file_lock(path: Path):
    try:
        import fcntl
    except ImportError:  # no POSIX locks: the atomic rename still keeps builds whole
        yield
        return
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_cpu_extension(verbose: bool = False):
    """Import the built extension (building it first if needed)."""
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    import mlx.core  # noqa: F401  (registers mx.array with nanobind before our module loads)

    path = ensure_built(verbose)
    spec = importlib.util.spec_from_file_location(MODULE, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        raise KernelUnavailable(f"the built CPU kernel does not load: {e}") from e
    sys.modules[MODULE] = module
    return module
