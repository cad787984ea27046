"""A model's own multi-token-prediction (MTP) block, trained with it: Qwen3.5 / Qwen3.6 ship one.

It has EAGLE's shape (heads/eagle.py) with norms around it, so EAGLE's drafting loop runs it
(drafters/eagle.py: MtpDrafter). At position t it reads the token c_t and the target's final
hidden state h_{t-1} (after the output norm), as llama.cpp's qwen35 MTP graph does:

    x_t = eh_proj([enorm(embed(c_t)) ; hnorm(h_{t-1})])   (D,)   2D -> D
    f_t = norm(layer(x_t, its own KV cache))             (D,)   one of the target's attention blocks
    logits_t = W_head f_t                                (V,)   the target's head (or the block's own)

and f_t stands in for h_t at the next draft step. Both are taken after a final norm (the target's, the
block's own): Qwen3.5's block was trained on the post-norm state, which measured higher acceptance than
the pre-norm one in llama.cpp (PR #24025) and LightLLM (PR #1402), and vLLM chains the normed output
between draft steps; a wrong choice never shows in the output, only in acceptance. The block is read on
demand from the GGUF the target came from (llama.cpp's converter writes it as the blocks past the trunk:
nextn_predict_layers), or from a safetensors checkpoint: the target's own directory, the original
checkpoint, or a drafter folder split from it (heads/mtp_checkpoints.py). A block stored in float next to
a quantized target is quantized as the target's own attention layer is.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import MlxspecError
from ..gguf import layer_quantization, read_nextn_block
from . import mtp_checkpoints

# GGUF names within the block -> this module's; the attention block's own tensors go under `layer.`
NEXTN = {"nextn.eh_proj": "eh_proj", "nextn.enorm": "enorm", "nextn.hnorm": "hnorm",
         "nextn.shared_head_norm": "norm", "nextn.shared_head_head": "head", "nextn.embed_tokens": "embed"}
ARCHS = ("qwen35", "qwen35moe")
FAMILIES = ("qwen3_5", "qwen3_5_moe", "qwen3_next")  # mlx-lm modules whose blocks these are


class MtpHead(nn.Module):
    def __init__(self, dims: int, eps: float, layer: nn.Module, vocab: int, own_head: bool = False,
                 own_embed: bool = False):
        """`layer`: a fresh attention block of the target's own kind (attention_layer_like)."""
        super().__init__()
        self.enorm, self.hnorm, self.norm = nn.RMSNorm(dims, eps), nn.RMSNorm(dims, eps), nn.RMSNorm(dims, eps)
        self.eh_proj = nn.Linear(2 * dims, dims, bias=False)
        self.layer = layer
        if own_head:
            self.head = nn.Linear(dims, vocab, bias=False)
        if own_embed:
            self.embed = nn.Embedding(vocab, dims)

    @property
    def dims(self) -> int:
        return self.norm.weight.shape[0]

    def __call__(self, embeds: mx.array, features: mx.array, cache=None, mask=None) -> mx.array:
        """(B, L, D) token embeddings, (B, L, D) features of the positions before -> (B, L, D) features."""
        x = mx.concatenate([self.enorm(embeds), self.hnorm(features.astype(embeds.dtype))], axis=-1)
        return self.norm(self.layer(self.eh_proj(x), mask, cache))


def attention_layer(target: nn.Module) -> tuple[int, nn.Module]:
    """The target's first attention (not recurrent) layer, and its index: the block is one more of these."""
    family = type(target).__module__.rpartition(".")[2]
    if family not in FAMILIES:
        raise MlxspecError(f"the mtp drafter runs the multi-token-prediction blocks of Qwen3.5/3.6 and Qwen3-Next "
                           f"({', '.join(FAMILIES)}), not {family}'s")
    return next((i, layer) for i, layer in enumerate(target.layers) if not layer.is_linear)


def _args(target: nn.Module):
    return getattr(target, "language_model", target).args


def from_gguf(path: Path, target: nn.Module) -> MtpHead:
    """The MTP block of the GGUF at `path`, built for `target` (the mlx-lm model loaded from it)."""
    found = read_nextn_block(path)
    if found is None:
        raise MlxspecError(f"{path.name} carries no multi-token-prediction block (nextn_predict_layers): the mtp "
                           "drafter needs a GGUF that has one, e.g. Qwen3.5 from a recent llama.cpp converter")
    name, arch, block = found
    if name not in ARCHS or not hasattr(target, "language_model"):
        raise MlxspecError(f"{path.name}: the mtp drafter runs Qwen3.5's block ({', '.join(ARCHS)}), not {name}'s")
    weights = {}
    for key, arrays in block.items():
        role, _, suffix = key.rpartition(".")
        local = NEXTN.get(role) or (f"layer.{arch.block[role]}" if role in arch.block else None)
        if local is None:
            raise MlxspecError(f"{path.name}: tensor {key} of the mtp block is not one mlxspec knows how to map")
        stem = f"{local}.{suffix}"
        for part, array in arrays.items():
            weights[stem if part == "weight" else f"{local}.{part}"] = array
    if "norm.weight" not in weights:  # llama.cpp: the output norm then
        weights["norm.weight"] = target.language_model.model.norm.weight
    return _build(weights, target, path.name, lambda p: layer_quantization(weights, p))


def from_checkpoint(path: Path, target: nn.Module) -> MtpHead:
    """The MTP block in the safetensors checkpoint directory `path` (the target's own, the original
    checkpoint's, or a drafter folder: heads/mtp_checkpoints.py), built for `target`."""
    attention_layer(target)  # the right model first, then its files
    block = mtp_checkpoints.read_block(path)
    if block is None:
        raise MlxspecError(
            f"{path.name} carries no multi-token-prediction block (mtp.* tensors): mlx-lm's conversions drop it. "
            "Name a checkpoint that has one: --drafter mtp:ORG/REPO (the original, e.g. mtp:Qwen/Qwen3.5-4B, "
            "of which only the files holding the block are fetched) or mtp:PATH (a drafter folder)")
    q = block.quantization or {}

    def stored(p: str):
        entry = q.get(p, q)
        return entry if entry is False else {k: entry[k] for k in ("bits", "group_size", "mode") if k in entry}

    head = _build(block.weights, target, block.name, stored)
    _quantize_like_target(head, target)
    return head


def _build(weights: dict, target: nn.Module, name: str, stored) -> MtpHead:
    """MtpHead from tensors under its names; `stored(path)`: the quantization of a layer stored quantized."""
    args = _args(target)
    index, _ = attention_layer(target)
    eh_proj = weights.get("eh_proj.weight")
    dims = args.hidden_size
    if eh_proj is None or eh_proj.shape[0] != dims:
        raise MlxspecError(f"{name}: its mtp block does not fit the model: it works on "
                           f"{'no' if eh_proj is None else eh_proj.shape[0]} hidden dimensions, the model on {dims}")
    kind = next(c for c in type(target.layers[index]).__mro__ if c.__module__.startswith("mlx_lm."))  # not a swap's
    layer = kind(args, layer_idx=index)
    head = MtpHead(dims, args.rms_norm_eps, layer, args.vocab_size, "head.weight" in weights, "embed.weight" in weights)
    nn.quantize(head, class_predicate=lambda p, m: hasattr(m, "to_quantized") and f"{p}.scales" in weights
                and stored(p) or False)
    try:
        head.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise MlxspecError(f"{name}: its mtp block does not fit the model: {e}") from None
    mx.eval(head.parameters())
    head.eval()
    return head


def _quantize_like_target(head: MtpHead, target: nn.Module) -> None:
    """Quantize the block's float layers as the target's own attention layer is (the same module paths;
    eh_proj as its q_proj): a float block next to a 4-bit target would cost a draft step several times the
    bytes. Its bits reach only acceptance, never the output."""
    _, twin = attention_layer(target)
    modules = dict(twin.named_modules())

    def like(path: str, module: nn.Module):
        if not hasattr(module, "to_quantized") or "scales" in module:
            return False
        other = modules.get(path.removeprefix("layer.") if path.startswith("layer.") else "self_attn.q_proj")
        if other is None or "scales" not in other:
            return False
        return {"bits": other.bits, "group_size": other.group_size, "mode": getattr(other, "mode", "affine")}

    nn.quantize(head, class_predicate=like)
    mx.eval(head.parameters())
