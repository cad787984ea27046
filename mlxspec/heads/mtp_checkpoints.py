"""A multi-token-prediction block read from safetensors checkpoints (Qwen3.5 / Qwen3.6 / Qwen3-Next).

Where such a block is found:
- the original checkpoint (Qwen/Qwen3.5-4B): `mtp.*` tensors beside `model.*`, its RMSNorm weights stored
  zero-centred (the norm multiplies by 1 + w), the experts fused (`experts.gate_up_proj`, Qwen3.5/3.6) or
  one tensor per expert (Qwen3-Next). mlx-lm's conversions drop these tensors (its sanitize skips `mtp.`);
- an MLX conversion that kept them (`mtp.*` in files MLX saved: the norms already hold 1 + w);
- a drafter folder split from either (mlx-vlm's `qwen3_5_mtp` format: config.json with that model_type, the
  block's tensors without the prefix, already sanitized, float or quantized as its config says).

`read_block` returns the tensors under MtpHead's names (heads/mtp.py); nothing is evaluated here but them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from ..errors import MlxspecError

PREFIX = "mtp."
DRAFTER_TYPE = "qwen3_5_mtp"  # mlx-vlm's standalone drafter folders
INDEX = "model.safetensors.index.json"
NAMES = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm", "norm": "norm"}
# RMSNorm weights the original checkpoints store as w for a norm that multiplies by 1 + w (Qwen3.5's,
# Qwen3-Next's): every norm of the block but the delta-net's gated one, which the block does not have
ZERO_CENTRED = ("enorm.weight", "hnorm.weight", "norm.weight", "layer.input_layernorm.weight",
                "layer.post_attention_layernorm.weight", "layer.self_attn.q_norm.weight", "layer.self_attn.k_norm.weight")
PER_EXPERT = re.compile(r"layer\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


@dataclass
class Block:
    weights: dict[str, mx.array]  # MtpHead's names (heads/mtp.py)
    quantization: dict | None  # how stored quantized tensors were quantized: {"bits", "group_size"[, "mode"]},
    #                            per-layer entries under MtpHead's names; None where none is stored quantized
    name: str  # the checkpoint, for messages


def read_block(path: Path) -> Block | None:
    """The block of the checkpoint directory `path` (config.json + safetensors), None where it has none."""
    config = read_config(path)
    standalone = config.get("model_type") == DRAFTER_TYPE
    tensors, raw = _block_tensors(path, standalone)
    if not tensors:
        return None
    if any(key.endswith("weight_scale_inv") for key in tensors):
        raise MlxspecError(f"{path.name}: its mtp block is stored in block FP8, which mlxspec does not read; "
                           "use the BF16 checkpoint or a drafter folder split from it")
    depth = (config.get("text_config") or config).get("mtp_num_hidden_layers", 1)
    if depth != 1 or any(k.startswith("layers.") and not k.startswith("layers.0.") for k in tensors):
        raise MlxspecError(f"{path.name}: its mtp block has {depth} layers; mlxspec runs one-layer blocks (Qwen3.5's)")
    weights = _head_names(tensors, zero_centred=raw)
    return Block(weights, _quantization(config, weights), path.name)


def read_config(path: Path) -> dict:
    """A checkpoint's config.json, or a one-line error saying why it cannot be read."""
    try:
        config = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise MlxspecError(f"{path} is not a checkpoint: it has no config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MlxspecError(f"{path / 'config.json'} cannot be read: {e}") from None
    if not isinstance(config, dict):
        raise MlxspecError(f"{path / 'config.json'} is not a JSON object")
    return config


def _block_tensors(path: Path, standalone: bool) -> tuple[dict[str, mx.array], bool]:
    """The block's tensors (lazy, the prefix taken off), and whether they are the original checkpoint's
    (prefixed, in files MLX did not write: their norms zero-centred)."""
    wanted = (lambda key: True) if standalone else (lambda key: key.startswith(PREFIX))
    if (path / INDEX).exists():  # sharded: open only the files the block lives in
        weight_map = json.loads((path / INDEX).read_text()).get("weight_map", {})
        files = sorted({path / f for key, f in weight_map.items() if wanted(key)})
    else:
        files = sorted(path.glob("*.safetensors"))
    tensors, raw = {}, False
    for file in files:
        arrays, metadata = mx.load(str(file), return_metadata=True)
        for key, array in arrays.items():
            if wanted(key):
                tensors[key.removeprefix(PREFIX)] = array
                raw = raw or (key.startswith(PREFIX) and metadata.get("format") != "mlx")
    return tensors, raw


def local_name(key: str) -> str:
    """A block tensor's name (prefix off) -> MtpHead's: 'fc.weight' -> 'eh_proj.weight',
    'layers.0.self_attn.q_proj.weight' -> 'layer.self_attn.q_proj.weight'."""
    first, _, rest = key.partition(".")
    if first == "layers" and rest.startswith("0."):
        return "layer." + rest[2:]
    if first in NAMES:
        return f"{NAMES[first]}.{rest}" if rest else NAMES[first]
    raise MlxspecError(f"tensor mtp.{key} of the mtp block is not one mlxspec knows how to map")


def _head_names(tensors: dict[str, mx.array], zero_centred: bool) -> dict[str, mx.array]:
    """Renamed to MtpHead's, the experts in mlx-lm's SwitchGLU form, zero-centred norms made 1 + w."""
    out, experts = {}, {}
    for key, value in tensors.items():
        name = local_name(key)
        if zero_centred and name in ZERO_CENTRED:
            value = value + 1.0  # as mlx-lm's qwen3_5 sanitize does, in the stored dtype
        if match := PER_EXPERT.fullmatch(name):  # Qwen3-Next: one tensor per expert
            experts.setdefault(match[2], {})[int(match[1])] = value
        elif name == "layer.mlp.experts.gate_up_proj":  # Qwen3.5/3.6: (experts, 2 x inner, dims), gate rows first
            gate, up = mx.split(value, 2, axis=-2)
            out["layer.mlp.switch_mlp.gate_proj.weight"], out["layer.mlp.switch_mlp.up_proj.weight"] = gate, up
        elif name == "layer.mlp.experts.down_proj":
            out["layer.mlp.switch_mlp.down_proj.weight"] = value
        else:
            out[name] = value
    for proj, by_index in experts.items():
        out[f"layer.mlp.switch_mlp.{proj}.weight"] = mx.stack([by_index[e] for e in sorted(by_index)])
    return out


def _quantization(config: dict, weights: dict) -> dict | None:
    """mlx-lm's "quantization" config with its per-layer entries renamed to MtpHead's, where the block's
    tensors are stored quantized."""
    if not any(key.endswith(".scales") for key in weights):
        return None
    stored = config.get("quantization")
    if not isinstance(stored, dict) or "bits" not in stored:
        raise MlxspecError("the mtp block is stored quantized, and its config.json does not say how")
    out = {key: value for key, value in stored.items() if not isinstance(value, dict) and value is not False}
    for key, value in stored.items():  # per-layer entries: the block's own (a whole model's file has others)
        if (isinstance(value, dict) or value is False) and (name := _block_layer(key)):
            out[name] = value
    return out


def _block_layer(key: str) -> str | None:
    try:
        return local_name(key.removeprefix(PREFIX))
    except MlxspecError:
        return None
