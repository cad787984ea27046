"""What speculation can reach on this device at most, and whether it stays exact: drafts that are always right.

    report = speculation_ceiling(model, prompt, steps, tokens=64, lengths=(1, 3, 7, 15))

`steps`: the decoding passes to run (a step_graph.StepGraphs, as GPUs decode, made after the kernels are
installed; or None: eager).
Plain greedy decoding runs first; then the Oracle drafter proposes exactly the tokens it gave, k at a time.
Where the verify rows equal one-row steps (the invariant kernels), every draft is kept: a pass of k + 1 rows
yields k + 1 tokens, so tokens/s over plain decoding is the verify path's whole gain, with no drafter's cost or
misses in it; and the tokens are plain decoding's. Where they are not (MLX's GPU ops), drafts are refused that
plain decoding chose, or the tokens differ: both are reported. A random model serves (nothing here reads
the tokens' meaning), so the 8B shape can be measured without its weights.
"""

from __future__ import annotations

import statistics

import mlx.core as mx
import mlx.nn as nn

from ..decode import Decoder
from ..drafters.base import Draft, Drafter, NoDrafter
from ..options import GenerateOptions
from ..stats import Stats


class Oracle(Drafter):
    """Proposes the next k of `future` (plain decoding's tokens after the prompt); a benchmark's drafter."""

    name = "oracle"

    def __init__(self, future: list[int]):
        self.future, self.offset = list(future), 0

    def start(self, prompt: list[int], hidden: mx.array | None = None) -> None:
        self.offset = len(prompt)

    def propose(self, context: list[int], k: int, sampling, key, width: int = 1) -> Draft:
        done = len(context) - self.offset  # tokens generated so far
        ahead = self.future[done : done + k]
        return Draft(mx.array(ahead, dtype=mx.uint32), None, len(ahead)) if ahead else Draft.empty()


def decode(model: nn.Module, drafter: Drafter, prompt: list[int], tokens: int, k: int, steps) -> tuple[list[int], Stats]:
    """Greedy decoding of `tokens` tokens (no end token), k drafts a round (fixed), through `steps`."""
    stats = Stats(drafter=drafter.name, draft_length=k)
    decoder = Decoder(model, drafter, prompt, GenerateOptions(max_tokens=tokens, temperature=0), draft_length=k,
                      eos_ids=set(), context_length=len(prompt) + tokens + 64, stats=stats, adaptive=False,
                      steps=steps)
    out = [t for event in decoder for t in event.tokens]
    return out, stats


def speculation_ceiling(model: nn.Module, prompt: list[int], steps, tokens: int = 64,
                        lengths: tuple[int, ...] = (1, 3, 7, 15), repeats: int = 3) -> dict:
    """{"plain_tok_s", "k=K": {"tok_s", "speedup", "kept", "same_tokens", "passes"}}: medians over `repeats`
    runs (after one warm-up of each, which traces its passes); `kept` the share of drafts the target kept."""
    plain, _ = decode(model, NoDrafter(), prompt, tokens, 0, steps)  # the warm-up, and the oracle's answers
    runs = {0: []} | {k: [] for k in lengths}
    last: dict[int, tuple[list[int], Stats]] = {}
    for rep in range(repeats + 1):
        for k in runs:
            drafter = NoDrafter() if k == 0 else Oracle(plain)
            out, stats = decode(model, drafter, prompt, tokens, k, steps)
            if rep:  # the first round warms up (traces each row count)
                runs[k].append(stats.generated_tokens / stats.decode_time)
            last[k] = (out, stats)
    plain_tok_s = statistics.median(runs[0])
    report = {"tokens": tokens, "plain_tok_s": round(plain_tok_s, 1), "plain_same_tokens": last[0][0] == plain}
    for k in lengths:
        out, stats = last[k]
        tok_s = statistics.median(runs[k])
        report[f"k={k}"] = {"tok_s": round(tok_s, 1), "speedup": round(tok_s / plain_tok_s, 2),
                            "kept": round(stats.acceptance_rate, 3), "same_tokens": out == plain,
                            "passes": stats.rounds}
    return report
