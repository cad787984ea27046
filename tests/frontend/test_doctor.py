"""`mlxspec doctor` as a function: the keys it reports, the BLAS it names, the kernels it asks."""

from __future__ import annotations

import sys
import types

import pytest

from mlxspec import doctor as doctor_mod


@pytest.fixture(scope="module")
def report():
    return doctor_mod.doctor(measure=False, kernels=False)


def test_report_has_the_expected_keys(report):
    assert {"backend", "device", "versions", "machine", "memory", "kernels", "blas", "blas_preload",
            "problems"} <= set(report)
    assert report["backend"] in ("cpu", "metal", "cuda", "gpu")
    assert report["versions"]["mlx"] and report["versions"]["mlx_lm"]
    assert report["memory"]["total_bytes"] > 0
    assert "gemm" not in report  # measure=False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="BLAS detection reads /proc/self/maps")
def test_detects_the_blas_library_name(report):
    blas = report["blas"]
    assert "blas" in blas["library"].lower()
    if blas["kind"] == "reference":
        assert any("reference BLAS" in p for p in report["problems"])


def test_render_shows_every_section(report):
    text = doctor_mod.render(report)
    for label in ("backend:", "versions:", "memory:", "kernels:", "steps:", "BLAS:"):
        assert label in text


def test_says_whether_decoding_passes_are_compiled():
    from mlxspec.settings import DecodeSettings

    for on in (True, False):
        report = doctor_mod.doctor(measure=False, kernels=False, settings=DecodeSettings(compiled_steps=on))
        assert report["compiled_steps"] is on
        line = next(x for x in doctor_mod.render(report).splitlines() if x.startswith("steps:"))
        assert ("replay compiled step graphs" in line) is on


def test_gemm_is_measured_here_and_with_the_alternative(monkeypatch):
    monkeypatch.setattr(doctor_mod.blas_mod, "gemm_gflops", lambda: 5.0)
    monkeypatch.setattr(doctor_mod.blas_mod, "measure_in_subprocess", lambda env, args=(): {"gflops": 300.0,
                                                                                          "kind": "openblas"})
    comparison = doctor_mod.gemm_comparison({"library": "/x/libblas.so.3", "kind": "reference",
                                             "optimized_installed": "/x/libopenblas.so.0"})
    assert comparison["this_process"]["gflops"] == 5.0
    assert comparison["alternative"]["gflops"] == 300.0 and "preloaded" in comparison["alternative"]["label"]


def test_kernel_status_uses_the_packages_status_function(monkeypatch):
    fake = types.ModuleType("mlxspec.kernels")
    fake.status = lambda: [{"kernel": "cpu-qmm", "active": True, "detail": "avx512", "reason": "checked"}]
    monkeypatch.setitem(sys.modules, "mlxspec.kernels", fake)
    k = doctor_mod.kernel_status()
    assert k["available"] and k["source"] == "mlxspec.kernels.status()"
    assert doctor_mod._render_kernels(k) == "cpu-qmm active (avx512): checked"


def test_per_signature_kernels_say_how_many_checks_passed_or_why_not():
    line = doctor_mod._kernel_line({"kernel": "cpu-pointwise", "active": True, "error": None,
                                    "passed": ["a", "b"], "failed": {"c": "disagrees"}})
    assert line == "cpu-pointwise active: self-check passed on 2 signature(s), failed on 1"
    line = doctor_mod._kernel_line({"kernel": "cpu-sdpa", "active": False, "error": "no compiler\nmore",
                                    "passed": [], "failed": {}})
    assert line == "cpu-sdpa inactive: no compiler"


def test_the_moe_gather_says_whether_it_groups_verify_rows_by_expert():
    entry = {"kernel": "metal-gather-qmm", "active": True, "reason": "self-check passed on 1 signature(s)"}
    assert doctor_mod._kernel_line(entry | {"groups_experts": True}).endswith("; verify rows grouped by expert")
    assert doctor_mod._kernel_line(entry | {"groups_experts": False}).endswith("; grouping off (self-check)")


def test_the_gpu_attention_says_whether_it_takes_draft_trees():
    entry = {"kernel": "cuda-sdpa", "active": True, "reason": "self-check passed on 1 signature(s)"}
    assert doctor_mod._kernel_line(entry | {"trees": True}).endswith("; takes draft trees")
    assert doctor_mod._kernel_line(entry | {"trees": False}).endswith("; draft trees off (self-check)")


def test_a_kernels_first_use_costs_are_shown_where_they_count():
    entry = {"kernel": "cuda-qmm", "active": True, "reason": "self-check passed on 5 signature(s)"}
    line = doctor_mod._kernel_line(entry | {"seconds": {"load": 0.001, "checks": 41.27, "timing": 3.0}})
    assert line.endswith("; first use load 0.0 s, checks 41.3 s, timing 3.0 s")
    assert "first use" not in doctor_mod._kernel_line(entry | {"seconds": {"load": 0.01}})  # nothing to speak of


def test_kernel_status_without_a_status_function(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlxspec.kernels", types.ModuleType("mlxspec.kernels"))
    monkeypatch.setitem(sys.modules, "mlxspec.kernels.registry", types.ModuleType("mlxspec.kernels.registry"))
    k = doctor_mod.kernel_status()
    assert not k["available"] and k["detail"].startswith("not available")


def test_a_gpu_first_run_that_turned_kernels_off_is_named_under_problems(report):
    """kernels/first_run.py's verdict is a status entry; a failed one is a problem with what to do."""
    failed = {"kernel": "metal-first-run", "active": False, "reason": "died (SIGABRT) (in 2.1 s)",
              "excluded": {"sdpa": "its first run here died (SIGABRT)"}}
    passed = failed | {"active": True, "excluded": {}, "reason": "the first run passed"}
    with_entry = lambda entry: report | {"kernels": report["kernels"] | {"status": [entry]}}  # noqa: E731
    problems = doctor_mod.problems(with_entry(failed))
    assert any("failed their first run on this device (died (SIGABRT)" in p for p in problems), problems
    assert not any("first run" in p for p in doctor_mod.problems(with_entry(passed)))
