"""The harness end to end on tiny random models: result shape, table, JSON, PNG, exactness check."""

from __future__ import annotations

import json

import mlx.core as mx

import pytest

from mlxspec.bench import harness
from mlxspec.bench.bandwidth import measure_bandwidth
from mlxspec.bench.harness import BenchSpec, run_bench
from mlxspec.bench.results import write_result
from mlxspec.bench.runners import Runners
from mlxspec.bench.summary import first_mismatch
from mlxspec.bench.table import render

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def small_bandwidth():
    return measure_bandwidth(mib=4, repeats=1, with_mlx=False)


@pytest.fixture(scope="module")
def result(tiny_llama, tiny_llama_other, small_bandwidth):
    spec = BenchSpec(target=str(tiny_llama), draft=str(tiny_llama_other), draft_lengths=[1, 2],
                     drafters=["lookup", "early-exit", "draft-model"], max_tokens=6, repeats=2)
    lines = []
    out = run_bench(spec, lines.append, bandwidth=small_bandwidth)
    out["progress"] = lines
    return out


def test_every_configuration_has_a_row(result):
    labels = [r["config"] for r in result["configs"]]
    assert labels[0] == "plain"
    for drafter in ("lookup", "early-exit", "draft-model"):
        assert {f"{drafter} k=1", f"{drafter} k=2", f"{drafter} adaptive"} <= set(labels)
    assert {"mlx-lm generate", "mlx-lm speculative k=1", "mlx-lm speculative k=2"} <= set(labels)
    # repeats x prompts x configurations timed runs, each announced on the progress callback
    assert len(result["runs"]) == 2 * 4 * len(labels)
    assert sum(line.startswith("[") for line in result["progress"]) == len(result["runs"])


def test_ttft_comes_from_cold_runs(result):
    engine_runs = [r for r in result["runs"] if r["config"] == "plain"]
    assert [r["cold"] for r in engine_runs] == [True] * 4 + [False] * 4  # repeat 1 cold, repeat 2 warm
    assert all(r["cold"] for r in result["runs"] if r["config"].startswith("mlx-lm"))
    assert all(r["stats"].get("cached_tokens", 0) == 0 for r in result["runs"] if r["cold"])


def test_greedy_outputs_equal_plain_decoding(result):
    bad = {r["config"]: r["mismatched_prompts"] for r in result["configs"] if not r["identical"]}
    assert bad == {}


def test_rows_are_consistent(result):
    plain = result["configs"][0]
    assert plain["speedup"] == pytest.approx(1.0, abs=1e-3)
    assert plain["drafted"] == 0 and plain["acceptance_rate"] is None
    for r in result["configs"]:
        assert r["tokens_per_second"] > 0 and r["peak_memory_bytes"] > 0
        assert r["rejected"] == pytest.approx(r["drafted"] - r["accepted"])
        assert r["tree_rounds"] == 0  # these drafters make chains (a GPU's trees: tests/kernels/test_row_positions.py)
        if r["drafted"]:
            assert 0 <= r["acceptance_rate"] <= 1
            assert len(r["acceptance_per_position"]) <= r["k"]
            assert r["mean_accepted_length"] == pytest.approx(r["generated"] / r["target_passes"], rel=1e-2)
    # the effective bandwidth is tokens/s times the bytes of one plain step
    step = result["roofline"]["plain_step_bytes"]
    assert plain["effective_bandwidth_gbs"] == pytest.approx(plain["tokens_per_second"] * step / 1e9, rel=1e-2)


def test_k_sweep_lists_each_fixed_draft_length(result):
    assert [p["k"] for p in result["k_sweep"]["lookup"]] == [1, 2]
    assert [p["k"] for p in result["k_sweep"]["mlx-lm speculative"]] == [1, 2]


def test_table_and_json(result, tmp_path):
    text = render(result)
    for r in result["configs"]:
        assert r["config"] in text
    assert "roofline" in text and "acceptance per draft position" in text
    written = write_result(result, tmp_path / "sub" / "bench.json", chart=False, markdown=True)
    assert [p.name for p in written] == ["bench.json", "bench.md"]
    data = json.loads(written[0].read_text())
    assert data["schema"] == harness.SCHEMA and data["configs"] == result["configs"]
    assert {"machine", "versions", "date", "bandwidth", "roofline", "definitions"} <= set(data)
    assert data["compiled_steps"] is (mx.default_device().type == mx.DeviceType.gpu)  # the default: on GPUs
    assert "| plain |" in written[1].read_text()


def test_png_chart_beside_the_json(result, tmp_path):
    pytest.importorskip("matplotlib")
    written = write_result(result, tmp_path / "bench.json")
    assert [p.name for p in written] == ["bench.json", "bench.png"]
    assert written[1].read_bytes()[:8] == PNG_MAGIC
    assert written[1].stat().st_size > 20_000  # three panels, not an empty canvas


def test_first_mismatch():
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 9, 3]) == 1
    assert first_mismatch([1, 2, 3], [1, 2]) == 2


def test_a_different_output_is_reported(tiny_llama, small_bandwidth, monkeypatch):
    """A configuration whose tokens differ from plain's is flagged in the row and the table."""
    real_run = Runners.run

    def tampered(self, config, ids, max_tokens, cold=True):
        run = real_run(self, config, ids, max_tokens, cold)
        if config.label == "lookup k=2" and run.tokens:
            run.tokens = run.tokens[:-1] + [run.tokens[-1] + 1]
        return run

    monkeypatch.setattr(Runners, "run", tampered)
    spec = BenchSpec(target=str(tiny_llama), drafters=["lookup"], draft_lengths=[2], max_tokens=4, repeats=1,
                     peers=False, adaptive=False, prompts="prose")
    out = run_bench(spec, bandwidth=small_bandwidth)
    rows = {r["config"]: r for r in out["configs"]}
    assert rows["plain"]["identical"] is True
    assert rows["lookup k=2"]["identical"] is False
    assert rows["lookup k=2"]["mismatched_prompts"] == ["autumn-poem", "fridge", "robot-story"]
    assert "NO: " in render(out)
    assert all(r["first_mismatch"] == 3 for r in out["runs"] if r["config"] == "lookup k=2")
