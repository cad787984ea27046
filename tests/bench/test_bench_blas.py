"""Which BLAS MLX calls, and the guarded preload of an optimized one."""

from __future__ import annotations

import sys

import pytest

from mlxspec.bench import blas, blas_preload

MAPS = """\
7f00-7f01 r-xp 00000000 08:01 1 /site-packages/mlx/lib/libmlx.so
7f01-7f02 r-xp 00000000 08:01 2 /site-packages/mlx_cpu.libs/libblas-bd8a282c.so.3.10.0
7f02-7f03 r--p 00000000 08:01 2 /site-packages/mlx_cpu.libs/libblas-bd8a282c.so.3.10.0
7f03-7f04 r-xp 00000000 08:01 3 /site-packages/mlx_cpu.libs/liblapack-86b2c207.so.3.10.0
7f04-7f05 rw-p 00000000 00:00 0
7f05-7f06 r-xp 00000000 08:01 4 /usr/lib/x86_64-linux-gnu/libc.so.6
"""


def test_mapped_libraries_parses_maps_once_each():
    libs = blas.mapped_libraries(MAPS)
    assert libs == ["/site-packages/mlx/lib/libmlx.so", "/site-packages/mlx_cpu.libs/libblas-bd8a282c.so.3.10.0",
                    "/site-packages/mlx_cpu.libs/liblapack-86b2c207.so.3.10.0", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
    assert blas.blas_candidates(libs) == ["/site-packages/mlx_cpu.libs/libblas-bd8a282c.so.3.10.0"]


@pytest.mark.parametrize("name,kind", [
    ("/x/libblas-bd8a282c.so.3.10.0", "reference"),
    ("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0", "openblas"),
    ("/opt/intel/libmkl_rt.so.2", "mkl"),
    ("/usr/lib/libblis.so.4", "blis"),
    ("/usr/lib/libfoo.so", "unknown"),
])
def test_classify_by_name_and_signature(name, kind):
    assert blas.classify(name) == kind


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_report_names_the_library_mlx_calls():
    report = blas.blas_report()
    assert report["library"] and "blas" in report["library"].lower()
    assert report["kind"] in ("reference", "openblas", "mkl", "blis", "flexiblas")
    assert report["reference"] == (report["kind"] == "reference")
    assert (report["advice"] is not None) == report["reference"]


def test_advice_says_how_to_fix_a_reference_blas():
    assert blas.advice("openblas", None) is None
    assert "apt-get install libopenblas0-pthread" in blas.advice("reference", None)
    assert "preloads it at start-up" in blas.advice("reference", "/x/libopenblas.so.0")
    assert "MLXSPEC_BLAS=off" in blas.advice("reference", "/x/libopenblas.so.0", "off")


def test_gemm_check_and_gflops():
    assert blas.gemm_check()
    assert blas.gemm_gflops(n=64, seconds=0.01) > 0


def test_plan_respects_its_guards(monkeypatch):
    assert blas_preload.plan({"MLXSPEC_BLAS": "off"}).action == "skip"
    assert blas_preload.plan({"MLXSPEC_BLAS_PRELOADED": "/x/libopenblas.so.0"}).action == "skip"
    assert blas_preload.plan({"LD_PRELOAD": "/x/libopenblas.so.0"}).action == "skip"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the preload is Linux-only")
def test_plan_preloads_only_an_existing_library(monkeypatch, tmp_path):
    monkeypatch.setattr(blas_preload, "bundled_reference_blas", lambda: "/x/libblas.so.3")
    monkeypatch.setattr(blas_preload, "find_optimized_blas", lambda: None)
    assert "no optimized BLAS" in blas_preload.plan({}).reason
    assert "no such file" in blas_preload.plan({"MLXSPEC_BLAS": "/no/such/libopenblas.so"}).reason
    lib = tmp_path / "libopenblas.so.0"
    lib.write_bytes(b"")
    monkeypatch.setattr(blas_preload, "find_optimized_blas", lambda: str(lib))
    assert blas_preload.plan({}) == blas_preload.Decision("preload", blas_preload.plan({}).reason, str(lib))
    monkeypatch.setattr(blas_preload, "bundled_reference_blas", lambda: None)
    assert blas_preload.plan({}).action == "skip"  # MLX does not bundle the reference BLAS


def test_preload_env_prepends_and_marks():
    env = blas_preload.preload_env("/lib/libopenblas.so.0", {"LD_PRELOAD": "/lib/other.so", "A": "1"})
    assert env["LD_PRELOAD"] == "/lib/libopenblas.so.0:/lib/other.so"
    assert env["MLXSPEC_BLAS_PRELOADED"] == "/lib/libopenblas.so.0" and env["A"] == "1"


@pytest.mark.skipif(blas_preload.find_optimized_blas() is None, reason="no OpenBLAS installed")
def test_self_check_passes_for_installed_openblas(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path))
    library = blas_preload.find_optimized_blas()
    assert blas_preload.self_check(library)
    assert (tmp_path / "blas-check.json").exists()  # the verdict is cached
    assert blas_preload.self_check(library)


def test_self_check_refuses_a_library_mlx_does_not_call(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path))
    assert not blas_preload.self_check(sys.executable, use_cache=False)  # not a shared library at all


def test_never_reexecutes_a_test_run():
    assert "test run" in blas_preload.plan({"PYTEST_CURRENT_TEST": "x"}).reason


@pytest.mark.skipif(blas_preload.find_optimized_blas() is None, reason="no OpenBLAS installed")
def test_ensure_fast_blas_reexecutes_with_openblas(tmp_path):
    """The CLI's start-up call: the same command comes back with OpenBLAS serving MLX's GEMM."""
    import os
    import subprocess

    code = ("from mlxspec.bench.blas_preload import ensure_fast_blas; ensure_fast_blas()\n"
            "from mlxspec.bench.blas import blas_report; r = blas_report()\n"
            "print(r['kind'], r['preloaded_by_mlxspec'])")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "LD_PRELOAD", "MLXSPEC_BLAS",
                                                            "MLXSPEC_BLAS_PRELOADED")}
    env["MLXSPEC_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["openblas", "True"], out.stderr
    env["MLXSPEC_BLAS"] = "off"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["reference", "False"], out.stderr
