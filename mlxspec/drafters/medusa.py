"""Medusa drafting: learned heads guess tokens 2, 3, ... ahead from the target's last hidden state.

No draft model runs: one proposal costs `count` small D x D blocks and the target's head on one
row. Head i's guess does not depend on the other drafts, so its distribution q_i is exactly what
its token was drawn from and rejection sampling stays exact. Heads are trained per target
(`mlxspec train-drafter MODEL --kind medusa`) and refuse any other target.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ..errors import MlxspecError
from ..heads.files import drafter_path
from ..heads.medusa import check_target, logits, read
from ..sampling import Sampling, probabilities, sample
from .base import Draft, Drafter


class MedusaDrafter(Drafter):
    wants_hidden = True
    trees = True  # greedy: each head's top candidates, verified as one tree

    def __init__(self, target: nn.Module, name_or_path: str):
        path = drafter_path(name_or_path)
        if not path.is_file():
            raise MlxspecError(f"no medusa heads at {path}: "
                               "train them with `mlxspec train-drafter MODEL --kind medusa`")
        self.heads, self.config = read(path)
        check_target(self.config, target, path)
        self.target = target
        self.name = f"medusa:{name_or_path}"
        self.last: mx.array | None = None  # (D,) hidden state of the newest position the target read

    def start(self, prompt: list[int], hidden: mx.array | None = None) -> None:
        self.last = None if hidden is None or hidden.shape[0] == 0 else hidden[-1]  # h of prompt[-2]

    def propose(self, context: list[int], k: int, sampling: Sampling, key: mx.array, width: int = 1) -> Draft:
        if self.last is None or k <= 0:
            return Draft.empty()
        count = min(k, self.heads.count)
        rows = logits(self.heads, self.target, self.last, count)  # (count, V)
        if width > 1 and sampling.greedy:  # head i's top `width` at depth i, its favourite first
            return Draft.favourites_tree(top_candidates(rows, min(width, rows.shape[-1])))
        if sampling.greedy:
            return Draft(mx.argmax(rows, axis=-1).astype(mx.uint32), None, count)
        q = probabilities(rows, sampling)  # (count, V): each head's draft distribution
        return Draft(sample(q, key).astype(mx.uint32), q, count)

    def accept(self, n: int, hidden: mx.array | None = None) -> None:
        if hidden is not None:  # (n+1, D): row n predicts the token the target just added
            self.last = hidden[-1]

    def finish(self) -> None:
        self.last = None


def top_candidates(rows: mx.array, w: int) -> mx.array:
    """(k, V) logits -> (k, w) ids of each row's w largest, largest first (a partition, then a
    sort of the w: a full sort of a 49K vocabulary per head costs more than the heads)."""
    top = mx.argpartition(-rows, w - 1, axis=-1)[:, :w]  # (k, w), unordered
    order = mx.argsort(-mx.take_along_axis(rows, top, axis=-1), axis=-1)
    return mx.take_along_axis(top, order, axis=-1)
