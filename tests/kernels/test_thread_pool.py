"""The kernels' thread pool under stress: every chunk runs once, none after run() returns.

cpu/pool_check.cpp issues two million short jobs with changing chunk counts (as a forward pass
issues ~200 matmuls). The pool once let a worker pair a finished job's claim with the next job's
chunk count: a chunk ran twice and run() returned while a worker still used its frame (a crash
every few dozen forward passes). That version fails this check in most runs.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).parents[2] / "mlxspec" / "kernels" / "cpu" / "pool_check.cpp"


def test_every_chunk_runs_exactly_once_and_never_late(tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path / "pool_check"
    subprocess.run([cxx, "-O2", "-std=c++17", "-pthread", str(SOURCE), "-o", str(exe)], check=True, timeout=300)
    done = subprocess.run([str(exe), "2000000"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "errors=0" in done.stdout, (done.returncode, done.stdout, done.stderr)
