"""A GPU's kernels run first in a child process (kernels/first_run.py): the child's workload runs here for real on
the CPU's kernels; children that die, hang, meet a device fault or cannot start are stood in by small scripts; the
verdict turns the right families off in the registry, is kept per device and version, and read back."""

from __future__ import annotations

import json
import sys

import pytest

from mlxspec.kernels import first_run, registry


def events(*items) -> list[str]:
    return [json.dumps(item) for item in items]


SDPA_CHECK = ["sdpa", "(4, 2, 64, 64, 'mlx.core.float16')"]


def test_the_child_runs_every_self_check_and_decoding_passes_and_reports_them():
    """The real child on this CPU: each self-check announced as it begins and ends, the install, passes and
    acceptance steps, then done; nothing turned off."""
    verdict = first_run.run_child("cpu", 120, [sys.executable, "-m", "mlxspec.kernels.first_run", "--device", "cpu"])
    assert verdict["excluded"] == {} and verdict["keep"] and verdict["detail"] == "the first run passed", verdict


def test_the_child_s_event_lines_name_each_check_as_it_runs():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "mlxspec.kernels.first_run", "--device", "cpu"], capture_output=True,
                         text=True, timeout=120).stdout.splitlines()
    parsed = [json.loads(line) for line in out]
    begun = [e["begin"][0] for e in parsed if "begin" in e]
    assert {"qmm", "sdpa", "pointwise"} <= set(begun) and begun.count("forward") == 5  # 2 models x 2, acceptance
    assert sum("end" in e for e in parsed) == len(begun) and parsed[-1] == {"done": True}


@pytest.mark.parametrize("lines, code, timed_out, want", [
    (events({"begin": ["forward", "install"]}, {"begin": SDPA_CHECK}), -11, False,
     {"sdpa": "its first run here died (SIGSEGV) (during its self-check on (4, 2, 64, 64, 'mlx.core.float16'))"}),
    (events({"begin": ["forward", "passes"]}, {"begin": SDPA_CHECK}, {"end": SDPA_CHECK + [None]}), None, True,
     {"*": "the kernels' first run here timed out after 600 s outside any self-check"}),
    (events({"begin": SDPA_CHECK}, {"end": SDPA_CHECK + ["RuntimeError: [METAL] Command buffer execution failed"]},
            {"done": True}), 0, False,
     {"sdpa": "a device fault in its first run here ((4, 2, 64, 64, 'mlx.core.float16'): RuntimeError: [METAL] "
              "Command buffer execution failed)"}),
    (events({"begin": SDPA_CHECK}, {"end": SDPA_CHECK + ["row 3 differs from the one-row call"]}, {"done": True}), 0,
     False, {}),  # a wrong result: the in-process self-check turns that signature off, as it would have anyway
    (["not json", "[1, 2]"] + events({"begin": ["qmm", "(1,)"]}), 134, False,
     {"qmm": "its first run here exited with 134 (during its self-check on (1,))"}),
])
def test_a_verdict_turns_off_the_family_a_death_hang_or_device_fault_interrupted(lines, code, timed_out, want):
    verdict = first_run.interpret(lines, code, timed_out)
    assert verdict["excluded"] == want and verdict["keep"]


def test_a_child_that_cannot_start_teaches_nothing_and_is_not_kept():
    verdict = first_run.interpret([], 1, False, "Traceback ...\nModuleNotFoundError: No module named 'mlx_lm'")
    assert verdict == {"excluded": {}, "detail": "the child exited with 1 before any kernel ran", "keep": False}


@pytest.mark.parametrize("script, timeout, want", [
    ("import json, os, signal; print(json.dumps({'begin': ['qmm', '(1,)']}), flush=True); "
     "os.kill(os.getpid(), signal.SIGSEGV)", 60, "its first run here died (SIGSEGV) (during its self-check on (1,))"),
    ("import json, time; print(json.dumps({'begin': ['qmm', '(1,)']}), flush=True); time.sleep(60)", 2,
     "its first run here timed out after 2 s (during its self-check on (1,))"),
])
def test_run_child_reads_what_a_dying_or_hanging_child_printed(script, timeout, want):
    verdict = first_run.run_child("metal", timeout, [sys.executable, "-c", script])
    assert verdict["excluded"] == {"qmm": want} and verdict["seconds"] < 30


@pytest.fixture
def on_a_gpu(monkeypatch, tmp_path):
    """settle() as on a GPU machine, its cache under tmp_path, nothing settled yet in this process."""
    monkeypatch.setattr(first_run, "_on_gpu", lambda backend: True)
    monkeypatch.setattr(first_run, "_settled", {})
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path))
    registry.reset()
    yield tmp_path
    registry.reset()


def test_settle_turns_off_what_the_child_s_run_excluded_and_keeps_the_verdict(on_a_gpu, monkeypatch):
    runs = []

    def child(backend, timeout):
        runs.append(backend)
        return {"excluded": {"sdpa": "its first run here died (SIGSEGV)"}, "detail": "died (SIGSEGV)", "keep": True}

    verdict = first_run.settle("metal", run=child)
    assert runs == ["metal"] and verdict["excluded"] == {"sdpa": "its first run here died (SIGSEGV)"}
    assert registry.kernel("sdpa", "metal").error == "its first run here died (SIGSEGV)"
    assert registry.kernel("qmm", "metal").error != verdict["excluded"]["sdpa"]  # another family: its own load
    kept = json.loads((on_a_gpu / "kernels" / "first_run.json").read_text())
    assert list(kept) == [first_run.cache_key("metal")] and kept[first_run.cache_key("metal")]["excluded"]
    entry = next(e for e in registry.status() if e["kernel"] == "metal-first-run")
    assert not entry["active"] and entry["excluded"] == verdict["excluded"]

    monkeypatch.setattr(first_run, "_settled", {})  # another process on this device: the kept verdict, no child
    registry.reset()
    assert first_run.settle("metal", run=lambda *a: pytest.fail("ran the child again"))["excluded"] == verdict["excluded"]
    assert registry.kernel("sdpa", "metal").error.startswith("its first run here died")


def test_registry_records_of_a_gpu_backend_settle_first_and_a_death_outside_checks_turns_all_off(on_a_gpu, monkeypatch):
    monkeypatch.setattr(first_run, "run_child", lambda backend, timeout: {
        "excluded": {"*": "the kernels' first run here died (SIGABRT) outside any self-check"}, "detail": "died",
        "keep": True})
    for family in ("qmm", "sdpa", "accept"):
        assert "outside any self-check" in registry.kernel(family, "cuda").error


def test_an_unlearned_verdict_is_not_kept_and_the_cpu_and_stand_in_gpus_never_run_a_child(on_a_gpu, monkeypatch):
    verdict = first_run.settle("cuda", run=lambda *a: {"excluded": {}, "detail": "could not start", "keep": False})
    assert verdict["excluded"] == {} and not (on_a_gpu / "kernels" / "first_run.json").exists()
    assert first_run.settle("cpu", run=lambda *a: pytest.fail("a child for the CPU")) is None
    monkeypatch.setattr(first_run, "_on_gpu", lambda backend: False)  # the tests' stand-in GPUs run on this CPU
    monkeypatch.setattr(first_run, "_settled", {})
    assert first_run.settle("cuda", run=lambda *a: pytest.fail("a child without a GPU")) is None


def test_watchers_hear_of_each_check_and_timing_as_it_begins_and_ends(monkeypatch):
    """A timing launches builds no check has run yet (other chunks, K splits): announced as a check is, so a death
    there is the family's; a check ran once is not announced again."""
    heard = []
    monkeypatch.setattr(registry, "_watchers", [lambda *event: heard.append(event)])
    rec = registry.KernelRecord("sdpa-mma", "metal")
    rec.check(("sig",), lambda: None)
    rec.check(("sig",), lambda: pytest.fail("checked twice"))
    with rec.spending("timing"):
        heard.append("timed")
    assert heard == [("begin", "sdpa-mma", ("sig",)), ("end", "sdpa-mma", ("sig",), None),
                     ("begin", "sdpa-mma", "timing"), "timed", ("end", "sdpa-mma", "timing", None)]


def test_a_backend_that_is_not_this_process_s_gpu_runs_no_child():
    """This CPU has no GPU: neither backend is this process's (on a CUDA machine, "metal" would not be either)."""
    assert not first_run._on_gpu("metal") and not first_run._on_gpu("cuda")
