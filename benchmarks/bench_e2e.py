"""End-to-end benchmarks behind the README's figures, one command each; results in results/.

    python benchmarks/bench_e2e.py smollm2       # SmolLM2-135M-Instruct Q4_1: lookup, early exit, mlx-lm
    python benchmarks/bench_e2e.py stories260k   # stories260K fp32 + its own q4g32 as draft, k = 1,2,4,8
    python benchmarks/bench_e2e.py hardware      # chip, MLX, backend, memory bandwidth, SmolLM2 roofline
    python benchmarks/bench_e2e.py blas          # fp32 GEMM GFLOP/s: MLX's bundled BLAS vs OpenBLAS
    mlxspec bench --json benchmarks/results/default.json --markdown   # the default run, as a user runs it
    python benchmarks/bench_e2e.py index         # re-render results/*.md and results/README.md from the JSON

Each writes results/<name>.json (machine, date, versions, every run) and, for the benchmarks, a PNG
chart and a Markdown table beside it. The script first makes the start-up call meant for the
`mlxspec` command, `ensure_fast_blas()`: it switches MLX to an installed OpenBLAS when MLX bundles
the reference BLAS (MLXSPEC_BLAS=off keeps the reference one; each result records which ran).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
STORIES = HERE.parents[1] / "shared" / "models" / "stories260K"
SHARED_MACHINE = ("Measured on a shared 2-core machine while other engineers' builds and tests ran: absolute "
                  "figures are noisy. Configurations run interleaved (repeat -> prompt -> configuration), so "
                  "ratios compare runs minutes apart at most.")


def presets():
    from mlxspec.bench.harness import BenchSpec

    return {
        "smollm2": BenchSpec(drafters=["lookup", "early-exit"], draft_lengths=[1, 2, 4], prompts="default",
                             max_tokens=32, repeats=2),
        "stories260k": BenchSpec(target=str(STORIES), draft=str(STORIES), draft_quantize="q4g32",
                                 drafters=["draft-model", "lookup", "early-exit"], draft_lengths=[1, 2, 4, 8],
                                 prompts="stories", max_tokens=128, repeats=3),
    }


def spread_note(result: dict) -> str:
    plain = [r["tokens_per_second"] for r in result["runs"] if r["config"] == "plain"]
    return (f"Plain decoding ranged {min(plain):.2f}-{max(plain):.2f} tok/s across its {len(plain)} runs "
            f"(median {statistics.median(plain):.2f}): the noise floor of these figures.")


def run_preset(name: str) -> None:
    from mlxspec.bench.harness import run_bench
    from mlxspec.bench.results import write_result
    from mlxspec.bench.table import render

    spec = presets()[name]
    if name == "stories260k" and not STORIES.exists():
        sys.exit(f"error: {STORIES} is missing (it comes with the project's shared/ folder)")
    result = run_bench(spec, lambda m: print(m, file=sys.stderr, flush=True))
    result["command"] = f"python benchmarks/bench_e2e.py {name}"
    result["notes"] = [SHARED_MACHINE, spread_note(result)]
    print(render(result))
    for path in write_result(result, RESULTS / f"{name}.json", markdown=True):
        print(f"wrote {path}")


def hardware() -> None:
    from mlxspec.frontend.bench import _roofline, render_hardware
    from mlxspec.bench.bandwidth import measure_bandwidth
    from mlxspec.bench.blas import blas_report
    from mlxspec.bench.harness import SMOLLM2
    from mlxspec.bench.hardware import machine_facts, mlx_facts

    facts = {"machine": machine_facts(), "versions": mlx_facts(),
             "blas": {k: blas_report()[k] for k in ("kind", "library")}, "bandwidth": measure_bandwidth().to_dict()}
    facts["roofline"] = _roofline(SMOLLM2, None, facts["bandwidth"]["roofline_gbs"])
    facts["command"] = "python benchmarks/bench_e2e.py hardware"
    print(render_hardware(facts))
    _write("hardware", facts)


def blas() -> None:
    """GEMM GFLOP/s with MLX's bundled BLAS and with the installed OpenBLAS, each in a child process."""
    from mlxspec.bench.blas import measure_in_subprocess
    from mlxspec.bench.blas_preload import find_optimized_blas, preload_env
    from mlxspec.bench.hardware import machine_facts, mlx_facts

    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MLXSPEC_BLAS_PRELOADED")}
    base["MLXSPEC_BLAS"] = "off"
    runs = {"bundled": measure_in_subprocess(base)}
    library = find_optimized_blas()
    if library:
        runs["openblas"] = measure_in_subprocess(preload_env(library, base))
    facts = {"machine": machine_facts(), "versions": mlx_facts(), "gemm_fp32_1024": runs,
             "command": "python benchmarks/bench_e2e.py blas"}
    for name, r in runs.items():
        print(f"{name:9} {r['gflops'] if r else 'failed'} GFLOP/s  ({r['library'] if r else ''})")
    _write("blas", facts)


def _write(name: str, facts: dict) -> None:
    import time

    facts["date"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(facts, indent=1) + "\n")
    print(f"wrote {path}")


def write_index() -> Path:
    """results/README.md: what each result file holds, with machine, date, versions and command."""
    from mlxspec.bench.table import CONFIG_HEADERS, config_rows, grid, header_lines

    parts = ["# Benchmark results (last run of each)\n",
             "Written by `benchmarks/bench_e2e.py`; each JSON holds every run, the machine, date and versions.\n"]
    for name in ("hardware", "blas", "default", "smollm2", "stories260k"):
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        parts.append(f"## {name}\n\nCommand: `{data.get('command')}`, {data.get('date')}\n")
        if "configs" in data:
            parts.append("\n".join(f"- {line}" for line in header_lines(data)) + "\n")
            keep = [0, 1, 2, 3, 4, 5, 8, 12]  # config, tok/s, speedup, TTFT, accept, tok/pass, same, x roofline
            rows = [[r[i] for i in keep] for r in config_rows(data)]
            parts.append(grid([CONFIG_HEADERS[i] for i in keep], rows, markdown=True) + "\n")
            parts.append("\n".join(f"- {n}" for n in data.get("notes", [])) + "\n")
            parts.append(f"Full tables: [{name}.md]({name}.md); chart: [{name}.png]({name}.png)\n")
        elif name == "hardware":
            from mlxspec.frontend.bench import render_hardware

            parts.append("```\n" + render_hardware(data) + "\n```\n")
        else:
            v = data["versions"]
            parts.append(f"MLX {v['mlx']} ({v['backend']}), {data['machine']['cpu']}, {data['machine']['cores']} cores\n")
            parts += [f"- fp32 GEMM 1024x1024 with the {label} BLAS: {r['gflops'] if r else 'failed'} GFLOP/s"
                      f" ({r['library'] if r else ''})" for label, r in data["gemm_fp32_1024"].items()]
            parts.append("")
    index = RESULTS / "README.md"
    index.write_text("\n".join(parts))
    return index


def rerender() -> None:
    """Markdown from the stored JSON (after a change of table format; no benchmark runs)."""
    from mlxspec.bench.results import markdown_report

    for name in ["default", *presets()]:
        path = RESULTS / f"{name}.json"
        if path.exists():
            path.with_suffix(".md").write_text(markdown_report(json.loads(path.read_text())))
            print(f"wrote {path.with_suffix('.md')}")
    print(f"wrote {write_index()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["smollm2", "stories260k", "hardware", "blas", "index"])
    args = ap.parse_args()
    if args.what == "index":
        return rerender()
    if args.what != "blas":  # the blas comparison sets its own environment per child
        from mlxspec.bench.blas_preload import ensure_fast_blas

        ensure_fast_blas()
    {"hardware": hardware, "blas": blas}.get(args.what, lambda: run_preset(args.what))()
    print(f"wrote {write_index()}")


if __name__ == "__main__":
    main()
