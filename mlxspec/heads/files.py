"""Learned drafter files: one safetensors file whose metadata holds the JSON config, tied to its target.

Every kind (medusa, eagle) is saved and read here, so a file either loads whole or not at all
(written to a temp file, then renamed) and a head for another model is refused by the sha256 of
the target's weights.
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
from ..kernels.packing import unpack_codes

FORMAT_VERSION = 1


def identity(model: nn.Module) -> str:
    """sha256 over the target's weight tensors (names, shapes, dtypes and bytes), in name order; codes
    the CPU kernels hold packed count in MLX's layout, so the digest does not depend on the kernels."""
    digest = hashlib.sha256()
    packed = {f"{path}.weight": m for path, m in model.named_modules() if getattr(m, "_pack", 1) > 1}
    for name, value in sorted(tree_flatten(model.parameters()), key=lambda kv: kv[0]):
        if name in packed:  # one layer at a time: no second copy of the model
            value = unpack_codes(value, packed[name].bits, packed[name]._pack)
        flat = value.reshape(-1)
        digest.update(f"{name}:{value.shape}:{value.dtype};".encode())
        digest.update(memoryview(flat.view(mx.uint8)))
    return digest.hexdigest()


def save(path: Path, tensors: dict[str, mx.array], config: dict) -> Path:
    """Write tensors + config to `path` (.safetensors) atomically: a temp file, then a rename."""
    path = Path(path)
    if path.suffix != ".safetensors":
        path = path.with_name(path.name + ".safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"mlxspec": json.dumps({**config, "format": FORMAT_VERSION})}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp.safetensors")
    os.close(fd)
    try:
        mx.save_safetensors(tmp, tensors, metadata=meta)
        os.replace(tmp, path)  # the only moment `path` appears: complete or absent
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def module_tensors(module: nn.Module) -> dict[str, mx.array]:
    return dict(tree_flatten(module.parameters()))


def read(path: Path, kind: str) -> tuple[dict[str, mx.array], dict]:
    """(tensors, config) of a `kind` file `save` wrote; anything else is refused with an MlxspecError."""
    path = Path(path)
    try:
        tensors, meta = mx.load(str(path), return_metadata=True)
        config = json.loads(meta["mlxspec"])
    except (OSError, RuntimeError, ValueError, KeyError, TypeError) as e:
        raise MlxspecError(f"{path} is not a {kind} drafter file mlxspec wrote: {e}") from None
    if config.get("kind") != kind:
        raise MlxspecError(f"{path} holds a {config.get('kind')!r} drafter, not {kind}")
    return tensors, config


def load_into(module: nn.Module, tensors: dict[str, mx.array], path: Path) -> None:
    """Strict: every weight present, shapes checked."""
    try:
        module.load_weights(list(tensors.items()))
    except (ValueError, KeyError, TypeError) as e:
        raise MlxspecError(f"{path}: its weights do not fit its config: {e}") from None


def check_target(config: dict, model: nn.Module, path: Path | str) -> None:
    """Heads fit only the target they were trained on: refuse any other (different weights)."""
    want, have = config.get("target_sha256"), identity(model)
    if want != have:
        kind = config.get("kind", "medusa")
        raise MlxspecError(
            f"{kind} drafter {path} was trained for target {config.get('target', '?')} "
            f"(sha256 {str(want)[:12]}), not this target (sha256 {have[:12]}): train one for it with "
            f"`mlxspec train-drafter MODEL --kind {kind}`"
        )


def drafter_path(name_or_path: str) -> Path:
    """A file path as given, else a name in MLXSPEC_HOME/drafters/NAME.safetensors."""
    from ..home import default_home

    given = Path(name_or_path).expanduser()
    if given.is_file() or "/" in name_or_path or name_or_path.endswith(".safetensors"):
        return given
    return default_home() / "drafters" / f"{name_or_path}.safetensors"
