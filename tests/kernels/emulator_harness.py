"""Compile and run generated GPU programs on the CPU (tests/kernels/emulator/gpu_emulator.h).

Shared by the qmm / dense and attention emulator tests: g++ builds are cached per test session by
their code, and run in parallel (each is ~1-2 s). Builds run under UBSan's alignment check, the edge tests' also
under AddressSanitizer; `EMULATOR_ASAN=all` puts every build under it, `EMULATOR_UBSAN=full` adds UBSan's shift,
bounds and signed-overflow checks.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
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


# AddressSanitizer: a kernel that reads past an input (a prefetch past the last group, a clamp missed) may
# fault on a GPU or read another allocation; here every input is a vector of exactly its size. It runs on the
# adversarial edge tests (test_gpu_qmm_edges.py, test_gpu_attention_edges.py: buffers ending where a launch's
# reads end, offsets off alignment), which ask for it (build_all(asan=True)), and on every build where
# EMULATOR_ASAN=all (an audit after a kernel change): on the regular cases it cost ~70 s of the suite's wall time
# (tests/kernels 4:15 -> 3:05 without, 2026-11-28). UBSan: alignment (GPUs fault on misaligned vector loads) always;
# shift (x86 takes a shift count mod 32 where a GPU's shl/shr clamp it: the emulator and the device would part),
# bounds (local arrays' indices) and signed overflow (index arithmetic) where EMULATOR_UBSAN=full (~70 s more;
# all passed on 2026-11-27).
UBSAN = "alignment,shift,bounds,signed-integer-overflow" if os.environ.get("EMULATOR_UBSAN") == "full" else "alignment"
ASAN_EVERYWHERE = os.environ.get("EMULATOR_ASAN") == "all"


def flags(asan: bool) -> list[str]:
    sanitizers = [f"-fsanitize=address,{UBSAN}" if asan or ASAN_EVERYWHERE else f"-fsanitize={UBSAN}",
                  f"-fno-sanitize-recover={UBSAN}"]
    return [CXX, "-std=c++20", "-O1", "-Wall", "-Werror", "-Wno-attributes", "-Wno-unknown-pragmas",
            "-Wno-unused-local-typedefs", "-Wno-unused-variable", "-pthread", *sanitizers,  # MLX declares every template arg
            "-I", str(EMULATOR / "include")]


_HEADER_LOCK = threading.Lock()


def emulator_header(asan: bool = False) -> Path:
    """The emulator's header, precompiled once per test process and sanitizer set where the compiler can (a build
    ~3.3 -> ~2.1 s: its parse was a third of each build). Where it cannot, the header itself (parsed each time)."""
    with _HEADER_LOCK:
        folder = _DIR / ("asan" if asan or ASAN_EVERYWHERE else "plain")
        copy = folder / "gpu_emulator.h"  # without `#pragma once` (an error in a header compiled as the main file)
        if not copy.exists():
            folder.mkdir(exist_ok=True)
            text = (EMULATOR / "gpu_emulator.h").read_text().replace("#pragma once\n", "", 1)
            (folder / "gpu_emulator.tmp").write_text(text)
            subprocess.run([*flags(asan), "-x", "c++-header", str(folder / "gpu_emulator.tmp"), "-o", str(copy) + ".gch"],
                           capture_output=True)  # g++ takes the .gch beside the header when flags match; else the text
            (folder / "gpu_emulator.tmp").rename(copy)
        return copy


def compile_program(cpp: Path, exe: Path, asan: bool = False) -> None:
    """g++ (or clang++) with the emulator's header and the sanitizers; fails with the compiler's error."""
    cmd = [*flags(asan), "-include", str(emulator_header(asan)), str(cpp), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"generated source {cpp.name} does not compile:\n{proc.stderr[-3000:]}"


def _build(code: str, asan: bool = False) -> Path:
    key = hashlib.sha1(code.encode()).hexdigest()[:16] + ("-asan" if asan else "")
    if key not in _BUILT:
        cpp, exe = _DIR / f"{key}.cpp", _DIR / key
        cpp.write_text(PRELUDE + code)
        compile_program(cpp, exe, asan)
        _BUILT[key] = exe
    return _BUILT[key]


def build_all(codes: list[str], asan: bool = False) -> list[Path]:
    """Compile every program (2 at a time), cached for the session; asan: under AddressSanitizer too."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda code: _build(code, asan), codes))


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


# A matrix-unit qmm's harness: every build over M rows, each row alone, rows [r0, r0 + odd) as one launch, then
# {extra} (more launches' code). The backend fills in `shapes` (x's and w's shape arguments), `cols` (columns
# a tile), `ids` (a lane's builtins from lane, part, by, bz) and the `cases` of `switch (build)`.
MATRIX_QMM_HARNESS = """
{source}
using T = {T}; using WT = {W}; using O = {O};
std::vector<O> launch(int build, const T* x, int M, const uint32_t* w, const WT* s, const WT* b, int N, int K) {{
  const int tiles[] = {{{tiles}}}, row_tiles[] = {{{row_tiles}}}, ksplit[] = {{{ksplit}}};
  std::vector<O> y(size_t(M) * N);
  {shapes}
  const int ys = (N + {cols} * tiles[build] - 1) / ({cols} * tiles[build]), zs = (M + 8 * row_tiles[build] - 1) / (8 * row_tiles[build]);
  emu::run_blocks(ys, zs, ksplit[build], [&](int lane, int part, int by, int bz) {{
    {ids}
    switch (build) {{
{cases}
    }}
  }});
  return y;
}}
int main(int argc, char** argv) {{
  const std::string d = argv[1];
  const int M = std::atoi(argv[2]), N = std::atoi(argv[3]), K = std::atoi(argv[4]);
  auto x = load<T>(d + "/x", size_t(M) * K);
  auto w = load<uint32_t>(d + "/w", size_t(N) * K * {BITS} / 32);
  auto s = load<WT>(d + "/s", size_t(N) * K / {G}); auto b = load<WT>(d + "/b", size_t(N) * K / {G});
  std::ofstream out(d + "/y", std::ios::binary);
  for (int build = 0; build < {builds}; ++build) save(out, launch(build, x.data(), M, w.data(), s.data(), b.data(), N, K));
  for (int r = 0; r < M; ++r) save(out, launch(0, x.data() + size_t(r) * K, 1, w.data(), s.data(), b.data(), N, K));
  save(out, launch(0, x.data() + size_t({r0}) * K, {odd}, w.data(), s.data(), b.data(), N, K));
{extra}
}}
"""


def matrix_qmm_harness(case: tuple, builds: list, odd: tuple[int, int], **parts: str) -> str:
    """MATRIX_QMM_HARNESS for `case` (x dtype, scales dtype, group size, bits) and `builds` (column tiles, row
    tiles, K split), with the backend's `parts` (source, shapes, cols, ids, cases, extra)."""
    from mlxspec.kernels.reference import output_dtype

    x_dtype, s_dtype, group_size, bits = case
    per_build = {name: ", ".join(str(b[i]) for b in builds) for i, name in enumerate(("tiles", "row_tiles", "ksplit"))}
    return MATRIX_QMM_HARNESS.format(T=C_TYPES[x_dtype], W=C_TYPES[s_dtype], O=C_TYPES[output_dtype(x_dtype, s_dtype)],
                                     BITS=bits, G=group_size, r0=odd[0], odd=odd[1], builds=len(builds),
                                     **per_build, **parts)


def case_id(case) -> str:
    return "-".join(str(v) for v in case).replace("mlx.core.", "")


def check_matrix_qmm(tmp_path: Path, exe: Path, case: tuple, builds: list, rows: int, n: int, k: int,
                     odd: tuple[int, int], extra: int = 0) -> tuple[mx.array, list[mx.array]]:
    """Run a matrix-unit qmm harness (tensor cores, simdgroup matrices) that saves every build over `rows`
    rows, each row alone, rows odd[0] .. odd[0] + odd[1] as one launch, then `extra` more launches of
    `rows` rows; hold each build to the reference tolerance and the rows to invariance (builds with the
    same K split, build[2], give the same bits; so do the lone rows and the odd launch). Returns (y, the
    extra launches' outputs)."""
    from mlxspec.kernels.reference import output_dtype, within_tolerance

    x_dtype, s_dtype, group_size, bits = case
    w, s, b = mx.quantize(mx.random.normal((n, k), key=mx.random.key(0)).astype(s_dtype), group_size=group_size,
                          bits=bits)
    x = mx.random.normal((rows, k), key=mx.random.key(1)).astype(x_dtype)
    save(tmp_path, x=x, w=w, s=s, b=b)
    run(exe, tmp_path, rows, n, k)
    out, raw = output_dtype(x_dtype, s_dtype), (tmp_path / "y").read_bytes()
    counts = [rows] * len(builds) + [1] * rows + [odd[1]] + [rows] * extra
    size, parts, start = len(raw) // sum(counts), [], 0  # bytes per output row
    for count in counts:
        parts.append(from_np(raw[start : start + count * size], out, (count, n)))
        start += count * size
    y, alone, odd_part = parts[0], mx.concatenate(parts[len(builds) : len(builds) + rows]), parts[len(builds) + rows]
    first = {}  # K split -> its first build's output: the others with that split must equal it
    for build, other in zip(builds, parts):
        ok, ratio = within_tolerance(other, x, w, s, b, group_size, bits)
        assert ok, f"{case} {build}: error {ratio:.3g}x the tolerance"
        assert mx.array_equal(other, first.setdefault(build[2], other)).item(), f"build {build} gives other bits"
    assert mx.array_equal(alone, y).item(), f"rows of a {rows}-row launch differ from 1-row launches"
    assert mx.array_equal(odd_part, y[odd[0] : sum(odd)]).item(), f"rows of a {odd[1]}-row launch differ"
    assert not mx.array_equal(y[0], y[1]).item()  # the rows are really different rows
    return y, parts[len(builds) + rows + 1 :]
