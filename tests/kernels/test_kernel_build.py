"""Build-on-first-use: where the cache lives, what invalidates it, and a clear reason when it cannot build."""

from __future__ import annotations

import shutil

import pytest

from mlxspec.kernels import build


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path))
    assert build.cache_root() == tmp_path / "kernels"
    assert build.built_module_path() is None  # nothing built in an empty cache


def test_key_changes_with_the_source(tmp_path, monkeypatch):
    copy = tmp_path / "cpu"
    shutil.copytree(build.SOURCE_DIR, copy)
    monkeypatch.setattr(build, "SOURCE_DIR", copy)
    before = build.build_key()
    (copy / "qmm_kernel.h").write_text((copy / "qmm_kernel.h").read_text() + "\n// changed\n")
    assert build.build_key() != before


def test_missing_tools_are_named(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "_find_cmake", lambda: None)
    monkeypatch.setattr(build, "_nanobind_version", lambda: None)
    with pytest.raises(build.KernelUnavailable, match="cmake, nanobind not found"):
        build.ensure_built()
    assert not list((tmp_path / "kernels").glob(".tmp-*"))  # no half-built directory left behind


def test_a_failing_compile_reports_the_compiler_output(tmp_path, monkeypatch, caplog):
    copy = tmp_path / "cpu"
    shutil.copytree(build.SOURCE_DIR, copy)
    (copy / "ext.cpp").write_text("#error deliberately broken\n")
    monkeypatch.setattr(build, "SOURCE_DIR", copy)
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path / "cache"))
    if build._find_cmake() is None or build._nanobind_version() is None:
        pytest.skip("no cmake or nanobind here")
    with pytest.raises(build.KernelUnavailable, match="deliberately broken"):
        build.ensure_built()
    assert build.built_module_path() is None
    assert "first use only" in caplog.text  # the wait is announced before the compiler runs
