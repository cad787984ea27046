"""The click commands through CliRunner: a tiny run end to end, and one-line errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlxspec.frontend.bench import bench, doctor
from mlxspec.bench.results import chart_available


def invoke(command, args):
    return CliRunner().invoke(command, args, catch_exceptions=False)


def test_bench_writes_table_json_and_png(tiny_llama, tmp_path):
    out = tmp_path / "r.json"
    result = invoke(bench, [str(tiny_llama), "--drafters", "lookup", "--draft-lengths", "2", "--max-tokens", "4",
                            "--repeats", "1", "--no-peers", "--bandwidth-mib", "4", "--prompts", "prose",
                            "--json", str(out), "--note", "a test"])
    assert result.exit_code == 0, result.output
    assert "lookup k=2" in result.stdout and "wrote" in result.stdout
    assert "[" in result.stderr and "measuring memory bandwidth" in result.stderr  # progress on stderr
    data = json.loads(out.read_text())
    assert data["notes"] == ["a test"] and data["command"].startswith("mlxspec bench ")
    assert out.with_suffix(".png").exists() == chart_available()


def test_hardware_reports_the_roofline(tiny_llama):
    result = invoke(bench, ["--hardware", str(tiny_llama), "--bandwidth-mib", "4"])
    assert result.exit_code == 0, result.output
    assert "memory bandwidth:" in result.stdout and "roofline:" in result.stdout and "MLX:" in result.stdout


@pytest.mark.parametrize("args,message", [
    (["--draft-lengths", "1,x"], "--draft-lengths"),
    (["--drafters", "medusa"], "needs its file"),
    (["--drafters", "magic"], "unknown drafter"),
    (["--drafters", "none"], "plain row"),
    (["--drafters", "draft-model"], "needs a draft model"),
    (["--prompts", "no-such-set"], "prompt set"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["/no/such/model"], "not found"),
])
def test_bad_input_is_one_clean_line(args, message):
    result = CliRunner().invoke(bench, args)
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith(("Error", "Usage", "Try"))]
    assert any(message in line for line in lines), result.stderr
    assert "Traceback" not in result.output + result.stderr
    assert sum(line.startswith("Error") for line in result.stderr.splitlines()) == 1


def test_doctor_json():
    result = invoke(doctor, ["--json", "--no-measure", "--no-kernels"])
    assert result.exit_code == 0, result.output
    assert {"backend", "blas", "kernels"} <= set(json.loads(result.stdout))


def test_the_cli_reaches_the_commands_lazily():
    import click

    from mlxspec.frontend.cli import cli

    ctx = click.Context(cli)
    assert cli.get_command(ctx, "bench") is bench and cli.get_command(ctx, "doctor") is doctor


def test_bench_takes_a_model_name_as_generate_does(tiny_llama, tmp_path, monkeypatch):
    """`mlxspec bench NAME [--draft NAME]`: a stored model's name stands for its target, as in `generate`."""
    from mlxspec.store import Manifest, Store

    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    Store().save("tiny", Manifest(target=str(tiny_llama)))
    seen = {}

    def run_bench(spec, progress):
        seen.update(target=spec.target, draft=spec.draft)
        raise SystemExit(0)

    monkeypatch.setattr("mlxspec.bench.harness.run_bench", run_bench)
    result = CliRunner().invoke(bench, ["tiny", "--draft", "tiny", "--max-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert seen == {"target": str(tiny_llama), "draft": str(tiny_llama)}
    hardware = invoke(bench, ["--hardware", "tiny", "--bandwidth-mib", "4"])
    assert hardware.exit_code == 0, hardware.output
    assert "roofline:" in hardware.stdout
