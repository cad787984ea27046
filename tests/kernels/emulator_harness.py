"""Compile and run generated GPU programs on the CPU (tests/kernels/emulator/gpu_emulator.h).

Shared by the qmm / dense and attention emulator tests: g++ builds are cached per test session by
their code, and run in parallel (each is ~1-2 s).
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlx.core as mx
import numpy as np

EMULATOR = Path(__file__).parent / "emulator"
CXX = shutil.which("g++") or shutil.which("clang++")
C_TYPES = {mx.float32: "float", mx.float16: "_Float16", mx.bfloat16: "emu::bf16", mx.uint8: "uint8_t"}
NP_TYPES = {mx.float32: np.float32, mx.float16: np.float16, mx.bfloat16: np.uint16, mx.uint32: np.uint32,
            mx.uint8: np.uint8}
_BUILT: dict[str, Path] = {}
_DIR = Path(tempfile.mkdtemp(prefix="mlxspec-emu-"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)  # one per test process; builds are not reused across runs

PRELUDE = """
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
template <typename V> std::vector<V> load(const std::string& path, size_t n) {
  std::vector<V> v(n); std::ifstream(path, std::ios::binary).read((char*)v.data(), n * sizeof(V)); return v;
}
template <typename V> void save(std::ofstream& out, const std::vector<V>& v) {
  out.write((const char*)v.data(), v.size() * sizeof(V));
}
"""


def _build(code: str) -> Path:
    key = hashlib.sha1(code.encode()).hexdigest()[:16]
    if key not in _BUILT:
        cpp, exe = _DIR / f"{key}.cpp", _DIR / key
        cpp.write_text(PRELUDE + code)
        cmd = [CXX, "-std=c++20", "-O1", "-Wall", "-Werror", "-Wno-attributes", "-Wno-unknown-pragmas",
               "-Wno-unused-local-typedefs", "-Wno-unused-variable", "-pthread",  # MLX declares every template arg
               "-fsanitize=alignment", "-fno-sanitize-recover=alignment",  # a GPU faults on misaligned vector loads
               "-include", str(EMULATOR / "gpu_emulator.h"), "-I", str(EMULATOR / "include"), str(cpp), "-o", str(exe)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, f"generated source does not compile:\n{proc.stderr[-3000:]}"
        _BUILT[key] = exe
    return _BUILT[key]


def build_all(codes: list[str]) -> list[Path]:
    """Compile every program (2 at a time), cached for the session."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(_build, codes))


def run(exe: Path, data: Path, *args) -> None:
    subprocess.run([str(exe), str(data), *map(str, args)], check=True, timeout=120)


def to_np(a: mx.array) -> np.ndarray:
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)


def save(directory: Path, **arrays: mx.array) -> None:
    for name, a in arrays.items():
        to_np(a).tofile(directory / name)


def from_np(raw: bytes, dtype, shape) -> mx.array:
    a = mx.array(np.frombuffer(raw, dtype=NP_TYPES[dtype]).reshape(shape))
    return a.view(mx.bfloat16) if dtype == mx.bfloat16 else a
