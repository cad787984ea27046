"""EAGLE: a one-layer draft model that reads the target's own features (Li et al., 2024).

At position t it reads the token c_t and the target's final hidden state h_{t-1} of the position
before, and predicts the feature f_t ~ h_t; the target's own output head on f_t guesses c_{t+1}.
Drafting runs autoregressively at the feature level: the next step reads (d_1, f_t), and so on.

    e_t = embed(c_t)                         (D,)  the target's frozen embedding
    x_t = fc([e_t ; h_{t-1}])                (D,)  2D -> D
    f_t = block(x_t, its own KV cache)       (D,)  one llama decoder block of the target's shape
    logits_t = W_head[vocab] f_t             (V',) the target's head rows for the draft vocabulary

The draft vocabulary is the V' tokens the target writes most often (from its recorded answers):
SmolLM2's head has 49k rows, as many weights as the block and fc together times seven, so a full
head would dominate each draft step. A token outside it is never drafted (the target still writes it).

File (files.py): fc and block weights, `vocab` (V',) ids, config {kind, dims, block shape, the
target's sha256, training facts}.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from ..errors import MlxspecError
from ..features import head as target_head
from ..kernels.packing import code_rows
from . import files

KIND = "eagle"
BLOCK_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
              "rms_norm_eps", "rope_theta")


def block_config(model: nn.Module) -> dict:
    """The decoder block shape of the target (llama-style keys), for a draft block of the same shape."""
    args = model.args
    dims = args.hidden_size
    heads = args.num_attention_heads
    out = {"hidden_size": dims, "num_attention_heads": heads,
           "num_key_value_heads": getattr(args, "num_key_value_heads", None) or heads,
           "head_dim": getattr(args, "head_dim", None) or dims // heads,
           "intermediate_size": args.intermediate_size,
           "rms_norm_eps": float(getattr(args, "rms_norm_eps", 1e-5)),
           "rope_theta": float(getattr(args, "rope_theta", 10000.0))}
    return out


class EagleHead(nn.Module):
    def __init__(self, block: dict):
        super().__init__()
        args = llama.ModelArgs(model_type="llama", num_hidden_layers=1, vocab_size=1,
                               **{k: block[k] for k in BLOCK_KEYS})
        dims = args.hidden_size
        self.fc = nn.Linear(2 * dims, dims, bias=False)
        self.layer = llama.TransformerBlock(args)

    @property
    def dims(self) -> int:
        return self.fc.weight.shape[0] if "weight" in self.fc else self.fc.scales.shape[0]

    def __call__(self, embeds: mx.array, features: mx.array, cache=None, mask=None) -> mx.array:
        """(B, L, D) token embeddings, (B, L, D) features of the positions before -> (B, L, D) features."""
        x = self.fc(mx.concatenate([embeds, features.astype(embeds.dtype)], axis=-1))
        return self.layer(x, mask, cache)


class DraftHead(nn.Module):
    """The target's output head restricted to the draft vocabulary: its own rows, same storage
    (quantized rows are gathered as they are), so a draft logit is the target's logit on f. The
    rows sit in an nn.QuantizedLinear / nn.Linear so mlxspec's kernels can run it (kernel_modules)."""

    def __init__(self, model: nn.Module, vocab: mx.array):
        super().__init__()
        head = target_head(model)
        module = getattr(head, "__self__", head)  # tied: embed_tokens.as_linear
        self.vocab = vocab.astype(mx.uint32)
        self.module_rows = module["weight"].shape[0]  # V: the target's logits have this many columns
        rows = code_rows(module, self.vocab)  # MLX's layout, whether the kernels packed the codes or not
        if "scales" in module:
            bits, group = module.bits, module.group_size
            self.proj = nn.QuantizedLinear(rows.shape[1] * 32 // bits, rows.shape[0], "bias" in module, group, bits)
            self.proj.weight, self.proj.scales = rows, module["scales"][self.vocab]
            if "biases" in module:
                self.proj.biases = module["biases"][self.vocab]
        else:
            self.proj = nn.Linear(rows.shape[1], rows.shape[0], bias="bias" in module)
            self.proj.weight = rows
        if "bias" in module:
            self.proj.bias = module["bias"][self.vocab]
        self.freeze()
        mx.eval(self.parameters())

    def __call__(self, f: mx.array) -> mx.array:
        """(..., D) -> (..., V') logits over the draft vocabulary."""
        return self.proj(f)


def save(path: Path, head: EagleHead, vocab: mx.array, config: dict) -> Path:
    tensors = {**files.module_tensors(head), "vocab": vocab.astype(mx.int32)}
    return files.save(path, tensors, {**config, "kind": KIND})


def read(path: Path) -> tuple[EagleHead, mx.array, dict]:
    """(head, draft vocabulary ids, config) from a file `save` wrote; anything else is refused."""
    tensors, config = files.read(path, KIND)
    try:
        head = EagleHead(config["block"])
        vocab = tensors.pop("vocab")
    except (KeyError, ValueError, TypeError) as e:
        raise MlxspecError(f"{path} is not an eagle drafter file mlxspec wrote: {e}") from None
    files.load_into(head, tensors, path)
    return head, vocab, config
