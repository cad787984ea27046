"""Medusa heads: head i maps the target's final hidden state h_t to logits of token t+i+2.

Each head is a residual SiLU block, h + SiLU(W_i h + b_i), then the target's own frozen output
head, so only D x D weights per head are learned. W_i starts at zero: an untrained head repeats
the target's next-token guess one position later (a baseline training must beat).

File format: one safetensors file whose metadata holds the JSON config (kind, heads, dims, the
target's identity, training facts), written atomically, so a file either loads whole or not at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..errors import MlxspecError
from ..features import head as target_head

KIND = "medusa"
FORMAT_VERSION = 1


class MedusaHeads(nn.Module):
    def __init__(self, dims: int, heads: int):
        super().__init__()
        self.blocks = [nn.Linear(dims, dims) for _ in range(heads)]
        for b in self.blocks:  # zero start: each head begins as the identity on h
            b.weight = mx.zeros_like(b.weight)
            b.bias = mx.zeros_like(b.bias)

    @property
    def count(self) -> int:
        return len(self.blocks)

    def __call__(self, h: mx.array, count: int | None = None) -> mx.array:
        """(..., D) hidden -> (count, ..., D) features of the first `count` heads (default all)."""
        return mx.stack([h + nn.silu(b(h)) for b in self.blocks[:count]])


def identity(model: nn.Module) -> str:
    """sha256 over the target's weight tensors (names, shapes, dtypes and bytes), in name order."""
    digest = hashlib.sha256()
    for name, value in sorted(tree_flatten(model.parameters()), key=lambda kv: kv[0]):
        flat = value.reshape(-1)
        digest.update(f"{name}:{value.shape}:{value.dtype};".encode())
        digest.update(memoryview(flat.view(mx.uint8)))
    return digest.hexdigest()


def save(path: Path, heads: MedusaHeads, config: dict) -> Path:
    """Write heads + config to `path` (.safetensors) atomically: a temp file, then a rename."""
    path = Path(path)
    if path.suffix != ".safetensors":
        path = path.with_name(path.name + ".safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"mlxspec": json.dumps({**config, "kind": KIND, "heads": heads.count, "format": FORMAT_VERSION})}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp.safetensors")
    os.close(fd)
    try:
        mx.save_safetensors(tmp, dict(tree_flatten(heads.parameters())), metadata=meta)
        os.replace(tmp, path)  # the only moment `path` appears: complete or absent
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read(path: Path) -> tuple[MedusaHeads, dict]:
    """(heads, config) from a file `save` wrote; anything else is refused with an MlxspecError."""
    path = Path(path)
    try:
        weights, meta = mx.load(str(path), return_metadata=True)
        config = json.loads(meta["mlxspec"])
        heads = MedusaHeads(int(config["dims"]), int(config["heads"]))
        heads.load_weights(list(weights.items()))  # strict: every weight present, shapes checked
    except (OSError, RuntimeError, ValueError, KeyError, TypeError) as e:
        raise MlxspecError(f"{path} is not a medusa heads file mlxspec wrote: {e}") from None
    if config.get("kind") != KIND:
        raise MlxspecError(f"{path} holds a {config.get('kind')!r} drafter, not medusa heads")
    return heads, config


def check_target(config: dict, model: nn.Module, path: Path | str) -> None:
    """Heads fit only the target they were trained on: refuse any other (different weights)."""
    want, have = config.get("target_sha256"), identity(model)
    if want != have:
        raise MlxspecError(
            f"medusa heads {path} were trained for target {config.get('target', '?')} "
            f"(sha256 {str(want)[:12]}), not this target (sha256 {have[:12]}): train heads for it with "
            "`mlxspec train-drafter MODEL --kind medusa`"
        )


def logits(heads: MedusaHeads, model: nn.Module, h: mx.array, count: int | None = None) -> mx.array:
    """(..., D) hidden -> (count, ..., V) logits through the target's own output head."""
    return target_head(model)(heads(h.astype(heads.blocks[0].weight.dtype), count))
