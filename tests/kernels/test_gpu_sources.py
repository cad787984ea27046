"""The Metal and CUDA kernels, checked as far as a Linux CPU allows.

No GPU here, so the full program MLX would generate (signature, template, body; gpu_source.py) is
compiled with g++ under stand-ins for the GPU builtins (emulator/gpu_emulator.h) and run with one
thread per lane. That checks the syntax we share with C++ and the kernel's arithmetic: results
within the reference tolerance, and each row of an M-row launch bit-identical to a 1-row launch.
On a real device the registry's self-check repeats the comparison before any layer uses the kernel.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.kernels import gpu_source
from mlxspec.kernels.reference import output_dtype, within_tolerance

EMULATOR = Path(__file__).parent / "emulator"
CXX = shutil.which("g++") or shutil.which("clang++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

CASES = [  # (backend, x dtype, scales dtype, group size, bits)
    ("metal", mx.float32, mx.float16, 32, 4),
    ("metal", mx.float16, mx.float16, 64, 8),
    ("cuda", mx.bfloat16, mx.bfloat16, 32, 4),
    ("cuda", mx.float32, mx.float32, 64, 4),
]
C_TYPES = {mx.float32: "float", mx.float16: "_Float16", mx.bfloat16: "emu::bf16"}
NP_TYPES = {mx.float32: np.float32, mx.float16: np.float16, mx.bfloat16: np.uint16, mx.uint32: np.uint32}

HARNESS = """
#include <cstdio>
#include <fstream>
{source}
using T = {T}; using S = {S}; using O = {O};
template <typename V> std::vector<V> load(const char* path, size_t n) {{
  std::vector<V> v(n); std::ifstream(path, std::ios::binary).read((char*)v.data(), n * sizeof(V)); return v;
}}
// y (M, N) for x rows [r0, r0 + M)
std::vector<O> launch(const T* x, int M, const uint32_t* w, const S* s, const S* b, int N, int K) {{
  std::vector<O> y(size_t(M) * N);
  emu::run_columns(N, [&](int lane, int n) {{ {call} }});
  return y;
}}
int main(int argc, char** argv) {{
  int M = std::atoi(argv[2]), N = std::atoi(argv[3]), K = std::atoi(argv[4]), G = {G}, BITS_ = {BITS};
  std::string d = argv[1];
  auto x = load<T>((d + "/x").c_str(), size_t(M) * K);
  auto w = load<uint32_t>((d + "/w").c_str(), size_t(N) * K * BITS_ / 32);
  auto s = load<S>((d + "/s").c_str(), size_t(N) * K / G);
  auto b = load<S>((d + "/b").c_str(), size_t(N) * K / G);
  std::ofstream out(d + "/y", std::ios::binary);
  auto all = launch(x.data(), M, w.data(), s.data(), b.data(), N, K);
  out.write((const char*)all.data(), all.size() * sizeof(O));
  for (int r = 0; r < M; ++r) {{  // each row alone
    auto one = launch(x.data() + size_t(r) * K, 1, w.data(), s.data(), b.data(), N, K);
    out.write((const char*)one.data(), one.size() * sizeof(O));
  }}
}}
"""
METAL_CALL = """int xs[2] = {{M, K}}, ws[2] = {{N, K * {BITS} / 32}};
  {name}<T, S, O, {G}, {BITS}>(x, xs, w, ws, s, b, y.data(), uint3{{unsigned(lane), unsigned(n), 0}});"""
CUDA_CALL = """Shape xs{{M, K}}, ws{{N, K * {BITS} / 32}};
  threadIdx = dim3{{unsigned(lane), unsigned(n % 8), 0}};
  blockIdx = dim3{{0, unsigned(n / 8), 0}}; blockDim = dim3{{32, 8, 1}};
  mlx::core::cu::{name}(x, xs, w, ws, s, b, y.data());"""


def build_harness(tmp: Path, backend: str, x_dtype, s_dtype, group_size: int, bits: int) -> Path:
    out_dtype = output_dtype(x_dtype, s_dtype)
    if backend == "metal":
        name, source = gpu_source.metal_source(x_dtype, s_dtype, out_dtype, group_size, bits,
                                               dict.fromkeys(gpu_source.INPUTS, 1 << 20))
        call = METAL_CALL.format(name=name, G=group_size, BITS=bits)
    else:
        name, source = gpu_source.cuda_source(x_dtype, s_dtype, out_dtype, group_size, bits)
        call = CUDA_CALL.format(name=name, BITS=bits)
    code = HARNESS.format(source=source, T=C_TYPES[x_dtype], S=C_TYPES[s_dtype], O=C_TYPES[out_dtype],
                          G=group_size, BITS=bits, call=call)
    (tmp / "harness.cpp").write_text(code)
    exe = tmp / "harness"
    cmd = [CXX, "-std=c++20", "-O1", "-Wall", "-Werror", "-Wno-attributes", "-Wno-unknown-pragmas",
           "-Wno-unused-local-typedefs", "-pthread",  # MLX declares every template argument; we use some
           "-include", str(EMULATOR / "gpu_emulator.h"), "-I", str(EMULATOR / "include"),
           str(tmp / "harness.cpp"), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"generated {backend} source does not compile:\n{proc.stderr[-3000:]}"
    return exe


def to_np(a: mx.array) -> np.ndarray:
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a)


def from_np(raw: bytes, dtype, shape) -> mx.array:
    a = mx.array(np.frombuffer(raw, dtype=NP_TYPES[dtype]).reshape(shape))
    return a.view(mx.bfloat16) if dtype == mx.bfloat16 else a


@pytest.mark.parametrize("backend, x_dtype, s_dtype, group_size, bits", CASES,
                         ids=[f"{c[0]}-{c[1]}-g{c[3]}-{c[4]}bit".replace("mlx.core.", "") for c in CASES])
def test_generated_source_compiles_and_matches_reference(tmp_path, backend, x_dtype, s_dtype, group_size, bits):
    m, n, k = 5, 11, 8 * group_size  # 8 groups: every lane gets words, some several
    exe = build_harness(tmp_path, backend, x_dtype, s_dtype, group_size, bits)
    w, s, b = mx.quantize(mx.random.normal((n, k), key=mx.random.key(0)).astype(s_dtype), group_size=group_size, bits=bits)
    x = mx.random.normal((m, k), key=mx.random.key(1)).astype(x_dtype)
    for name, a in (("x", x), ("w", w), ("s", s), ("b", b)):
        to_np(a).tofile(tmp_path / name)
    subprocess.run([str(exe), str(tmp_path), str(m), str(n), str(k)], check=True, timeout=60)
    out_dtype = output_dtype(x_dtype, s_dtype)
    raw = (tmp_path / "y").read_bytes()
    half = len(raw) // 2
    y, rows = from_np(raw[:half], out_dtype, (m, n)), from_np(raw[half:], out_dtype, (m, n))
    ok, ratio = within_tolerance(y, x, w, s, b, group_size, bits)
    assert ok, f"{backend}: error {ratio:.3g}x the tolerance"
    assert mx.array_equal(y, rows).item(), f"{backend}: rows of a {m}-row launch differ from 1-row launches"


def test_sources_name_only_builtins_their_backend_has():
    """MLX passes builtins it finds by name in the body: each body must use its own backend's."""
    assert "thread_position_in_grid" in gpu_source.METAL_BODY and "threadIdx" not in gpu_source.METAL_BODY
    assert "threadIdx" in gpu_source.CUDA_BODY and "thread_position_in_grid" not in gpu_source.CUDA_BODY
    for body in (gpu_source.METAL_BODY, gpu_source.CUDA_BODY):
        assert "x_shape" in body and "w_shape" in body and "scales_shape" not in body


@pytest.mark.skipif(not mx.metal.is_available(), reason="no Metal device")
def test_metal_kernel_on_device():
    from mlxspec.kernels.gpu import metal_qmm_function
    from mlxspec.kernels.registry import self_check

    assert self_check(metal_qmm_function(), 300, 256, 64, 4, mx.float16) is None
