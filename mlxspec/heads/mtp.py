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
between draft steps; a wrong choice never shows in the output, only in acceptance. The block is read from
the GGUF the target came from (llama.cpp's converter writes it as the blocks past the trunk:
nextn_predict_layers), on demand.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import MlxspecError
from ..gguf import layer_quantization, read_nextn_block

# GGUF names within the block -> this module's; the attention block's own tensors go under `layer.`
NEXTN = {"nextn.eh_proj": "eh_proj", "nextn.enorm": "enorm", "nextn.hnorm": "hnorm",
         "nextn.shared_head_norm": "norm", "nextn.shared_head_head": "head", "nextn.embed_tokens": "embed"}
ARCHS = ("qwen35", "qwen35moe")


class MtpHead(nn.Module):
    def __init__(self, args, own_head: bool = False, own_embed: bool = False):
        """`args`: the target's mlx-lm qwen3_5 TextModelArgs (the block is one of its attention layers)."""
        super().__init__()
        from mlx_lm.models import qwen3_5

        dims, eps = args.hidden_size, args.rms_norm_eps
        self.enorm, self.hnorm, self.norm = nn.RMSNorm(dims, eps), nn.RMSNorm(dims, eps), nn.RMSNorm(dims, eps)
        self.eh_proj = nn.Linear(2 * dims, dims, bias=False)
        self.layer = qwen3_5.DecoderLayer(args, layer_idx=args.full_attention_interval - 1)
        assert not self.layer.is_linear
        if own_head:
            self.head = nn.Linear(dims, args.vocab_size, bias=False)
        if own_embed:
            self.embed = nn.Embedding(args.vocab_size, dims)

    @property
    def dims(self) -> int:
        return self.norm.weight.shape[0]

    def __call__(self, embeds: mx.array, features: mx.array, cache=None, mask=None) -> mx.array:
        """(B, L, D) token embeddings, (B, L, D) features of the positions before -> (B, L, D) features."""
        x = mx.concatenate([self.enorm(embeds), self.hnorm(features.astype(embeds.dtype))], axis=-1)
        return self.norm(self.layer(self.eh_proj(x), mask, cache))


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
    head = MtpHead(target.language_model.args, "head.weight" in weights, "embed.weight" in weights)
    if "norm.weight" not in weights:  # llama.cpp: the output norm then
        weights["norm.weight"] = target.language_model.model.norm.weight
    nn.quantize(head, class_predicate=lambda p, m: hasattr(m, "to_quantized") and layer_quantization(weights, p) or False)
    try:
        head.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise MlxspecError(f"{path.name}: its mtp block does not fit the model: {e}") from None
    mx.eval(head.parameters())
    head.eval()
    return head
