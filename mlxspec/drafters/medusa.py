"""Medusa drafting: learned heads guess tokens 2, 3, ... ahead from the target's last hidden state.

No draft model runs: one proposal costs `count` small D x D blocks and the target's head on one
row. Head i's guess does not depend on the other drafts, so its distribution q_i is exactly what
its token was drawn from and rejection sampling stays exact. Heads are trained per target
(`mlxspec train-drafter MODEL --kind medusa`) and refuse any other target.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import MlxspecError
from ..heads.medusa import check_target, logits, read
from ..home import default_home
from ..sampling import Sampling, probabilities, sample
from .base import Draft, Drafter


def drafter_path(name_or_path: str) -> Path:
    """A file path as given, else a name in MLXSPEC_HOME/drafters/NAME.safetensors."""
    given = Path(name_or_path).expanduser()
    if given.is_file() or "/" in name_or_path or name_or_path.endswith(".safetensors"):
        return given
    return default_home() / "drafters" / f"{name_or_path}.safetensors"


class MedusaDrafter(Drafter):
    wants_hidden = True

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

    def start(self, prompt: list[int]) -> None:
        self.last = None  # the prompt's features are not passed: the first round drafts nothing

    def propose(self, context: list[int], k: int, sampling: Sampling, key: mx.array) -> Draft:
        if self.last is None or k <= 0:
            return Draft.empty()
        count = min(k, self.heads.count)
        rows = logits(self.heads, self.target, self.last, count)  # (count, V)
        if sampling.greedy:
            return Draft(mx.argmax(rows, axis=-1).astype(mx.uint32), None, count)
        q = probabilities(rows, sampling)  # (count, V): each head's draft distribution
        return Draft(sample(q, key).astype(mx.uint32), q, count)

    def accept(self, n: int, hidden: mx.array | None = None) -> None:
        if hidden is not None:  # (n+1, D): row n predicts the token the target just added
            self.last = hidden[-1]

    def finish(self) -> None:
        self.last = None
