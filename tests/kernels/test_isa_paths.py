"""Every instruction-set path of the CPU kernels computes the same bits, here and on arm64.

cpu/isa_check.cpp runs the quantized matmul and the attention through each ISA compiled for its
target and compares them with the portable path bit for bit, then prints a digest of the portable
results. The digest is a property of the arithmetic, not of the machine: the arm64 (NEON) build,
run under qemu where it is installed, must print the same one. The arm64/macOS compile (Apple
Silicon's CPU path, with clang) uses Zig's bundled clang from the `ziglang` dev dependency.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).parents[2] / "mlxspec" / "kernels" / "cpu" / "isa_check.cpp"
FLAGS = ["-O2", "-std=c++17", "-ffp-contract=off"]
LINE = re.compile(r"best=(\w+) checked=(\d+) mismatches=(\d+) digest=([0-9a-f]+)")


def run(cmd, timeout=600) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd[0]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def zig() -> list[str] | None:
    return [sys.executable, "-m", "ziglang"] if importlib.util.find_spec("ziglang") else None


@pytest.fixture(scope="module")
def host_result(tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("isa") / "isa_check"
    native = ["-march=native"] if platform.machine().lower() in ("x86_64", "amd64") else []
    run([cxx, *FLAGS, *native, str(SOURCE), "-o", str(exe)])
    return LINE.search(run([str(exe)])).groups()


def test_every_compiled_isa_equals_the_portable_path(host_result):
    best, checked, mismatches, _ = host_result
    assert int(mismatches) == 0
    if best != "generic":  # an accelerated path was compiled in and compared on every case
        assert int(checked) >= 50


def test_arm64_neon_path_compiles_for_apple_silicon(tmp_path):
    if zig() is None:
        pytest.skip("ziglang (a dev dependency) is not installed")
    run([*zig(), "c++", "-target", "aarch64-macos", *FLAGS, "-c", str(SOURCE), "-o", str(tmp_path / "isa.o")])
    assert (tmp_path / "isa.o").stat().st_size > 0


def test_arm64_neon_path_computes_the_same_bits(host_result, tmp_path):
    qemu = shutil.which("qemu-aarch64")
    cross = shutil.which("aarch64-linux-gnu-g++")
    if qemu is None or (cross is None and zig() is None):
        pytest.skip("needs qemu-aarch64 and an arm64 compiler (aarch64-linux-gnu-g++ or ziglang)")
    exe = tmp_path / "isa_check_arm64"
    compiler = [cross, "-static"] if cross else [*zig(), "c++", "-target", "aarch64-linux-musl"]
    run([*compiler, *FLAGS, str(SOURCE), "-o", str(exe)])
    best, checked, mismatches, digest = LINE.search(run([qemu, str(exe)])).groups()
    assert best == "neon" and int(checked) >= 50 and int(mismatches) == 0
    assert digest == host_result[3], "arm64 results differ from this machine's"
