"""Is speculation exact for this model on this device? Measured, not assumed.

Greedy speculative output equals plain decoding only if the target gives row i of an M-row verify
forward exactly the bits of a one-row decoding step at that position. On MLX's CPU ops (and with
mlxspec's kernels) that holds; on GPUs MLX's matmul and attention change their arithmetic with the
row count. So the engine checks the model itself, once per row count:

    check = RowInvariance(model)
    check.holds(5)      # True if M-row forwards equal one-row steps bit for bit for every M in 2..5
    check.holds(5, tree_rows=(4, 7))   # and (RowInvariance(..., trees=...)) tree passes of 4 and 7 nodes

Random tokens after a random prefix (fixed seed), one fresh KV cache: the one-row steps run once,
each M-row forward starts from the same prefix (the cache rewound in between).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .cache import new_cache, restore, rewind, snapshot
from .features import vocabulary_size

PREFIX = 24  # tokens of context before the checked rows (so attention reads a real cache)


TREE_PASS = " (a tree pass, as tree rounds build it)"  # how a tree pass's failure reads


class RowInvariance:
    """`forward(x, cache)`: how decoding passes run the model (the engine's step_graph.StepGraphs);
    default the model itself. `trees(x, cache)`, where tree rounds may run: a tree pass over a chain, built
    as tree rounds build theirs (tree.chain_pass), whose rows must equal the one-row steps too."""

    def __init__(self, model: nn.Module, seed: int = 0, forward=None, trees=None):
        self.model, self.vocab_size, self.seed = model, vocabulary_size(model), seed
        self.forward = forward or (lambda x, cache: model(x, cache=cache))
        self.passes = {"": self.forward} | ({TREE_PASS: trees} if trees else {})
        self.results: dict[tuple[str, int], str | None] = {}  # (pass, M) -> None (identical) or how it differed

    def holds(self, rows: int, tree_rows=()) -> bool:
        """Do M-row forwards equal one-row steps for every M in 2..rows, and (where tree rounds may run) tree
        passes of each size in `tree_rows`? (checks what is new)"""
        wanted = [("", m) for m in range(2, rows + 1)]
        wanted += [(TREE_PASS, m) for m in sorted(set(tree_rows)) if m >= 2 and TREE_PASS in self.passes]
        todo = [w for w in wanted if w not in self.results]
        if todo:
            self.results.update(self._check(todo))
        return all(self.results[w] is None for w in wanted)

    def failures(self) -> dict[int, str]:
        """M -> how its first failing pass differed."""
        out: dict[int, str] = {}
        for (label, m), why in sorted(self.results.items(), key=lambda item: (item[0][1], item[0][0])):
            if why and m not in out:
                out[m] = why
        return out

    def _check(self, todo: list[tuple[str, int]]) -> dict[tuple[str, int], str | None]:
        rng = np.random.default_rng(self.seed)
        tokens = rng.integers(0, self.vocab_size, size=PREFIX + max(m for _, m in todo)).tolist()
        cache = new_cache(self.model)
        self.model(mx.array(tokens[:PREFIX])[None], cache=cache)
        saved = snapshot(cache)  # recurrent layers go back by restoring their state
        steps = []  # one-row decoding steps: logits (V,) for each checked position
        for t in tokens[PREFIX:]:
            steps.append(self.forward(mx.array([[t]]), cache)[0, -1])
        mx.eval(steps)
        rewind(cache, len(steps))
        restore(saved)
        out = {}
        for label, m in todo:
            rows = self.passes[label](mx.array(tokens[PREFIX : PREFIX + m])[None], cache)[0]  # (m, V)
            mx.eval(rows)
            rewind(cache, m)
            restore(saved)
            why = _compare(rows, steps[:m])
            out[(label, m)] = why + label if why else None
        return out


def _compare(rows: mx.array, steps: list[mx.array]) -> str | None:
    for i, step in enumerate(steps):
        if not mx.array_equal(rows[i], step).item():
            diff = mx.abs(rows[i].astype(mx.float32) - step.astype(mx.float32)).max().item()
            return f"row {i} of a {len(steps)}-row forward differs from the one-row step (max |diff| {diff:.3g})"
    return None
