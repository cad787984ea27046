"""EAGLE-3 heads as their authors publish them (Li et al., 2025), read and run by EAGLE's loop.

An EAGLE-3 head reads, besides the token just chosen, three of the target's hidden states: the inputs of
a low, a middle and a high layer (2, L/2 and L-3 of L by default), concatenated; `fc` maps them to the
head's width. Later draft steps feed the head its own previous output instead (already that width).

    g_t      = fc([a_{t-1} ; b_{t-1} ; c_{t-1}])                   (D,)   3 Dt -> D (a target position)
    x_t      = [input_layernorm(embed(c_t)) ; hidden_norm(g_t)]    (2D,)  the target's embedding
    h_t      = g_t + attn(x_t)                                     q, k, v: 2D -> heads; its own KV cache
    f_t      = h_t + mlp(post_attention_layernorm(h_t))            (D,)   the next step's feature
    logits_t = lm_head(norm(f_t))                                  (V',)  draft vocabulary: token i + d2t[i]

(`norm_before_residual`, an option of the speculators library: the residual is hidden_norm(g_t).)
This is the graph of EAGLE's own code (eagle/model/cnets.py: LlamaDecoderLayeremb, Model.forward) and
of vLLM's and SGLang's llama_eagle3; the layer choice is EAGLE's (modeling_llama_kv.py: the hidden
states entering layers 2, L//2 and L-3) or the config's `eagle_aux_hidden_state_layer_ids`.

A head is a folder: config.json (llama-style, as EAGLE's repository writes it, or the speculators
library's, whose layer sits in `transformer_layer_config`) and safetensors, its tensors named
`midlayer.*` (EAGLE) or `layers.0.*` (speculators). PyTorch pickles (pytorch_model.bin) are refused.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from ..errors import MlxspecError
from ..features import head as target_head
from ..features import vocabulary_size
from .mtp_checkpoints import read_config

LAYER_PREFIXES = ("midlayer.", "layers.0.", "model.layers.0.")
DROPPED = ("t2d", "embed_tokens.weight", "model.embed_tokens.weight")  # a head as wide as the target: its embedding


class Eagle3Layer(nn.Module):
    """The head's one decoder layer: llama's, its attention reading the token's and the feature's norms side by side."""

    def __init__(self, args: llama.ModelArgs, norm_before_residual: bool = False, qk_norms: bool = False):
        """`qk_norms`: Qwen3's attention (RMS norms of each q and k head), as newer speculators heads for
        Qwen3 targets have it; else llama's."""
        super().__init__()
        dims, eps = args.hidden_size, args.rms_norm_eps
        self.input_layernorm, self.hidden_norm = nn.RMSNorm(dims, eps), nn.RMSNorm(dims, eps)
        self.post_attention_layernorm = nn.RMSNorm(dims, eps)
        self.self_attn = _qwen3_attention(args) if qk_norms else llama.Attention(args)  # mlx-lm's (its rope), over 2D inputs:
        heads, kv_heads = args.num_attention_heads, args.num_key_value_heads
        head_dim = args.head_dim or dims // heads
        bias = args.attention_bias
        self.self_attn.q_proj = nn.Linear(2 * dims, heads * head_dim, bias=bias)
        self.self_attn.k_proj = nn.Linear(2 * dims, kv_heads * head_dim, bias=bias)
        self.self_attn.v_proj = nn.Linear(2 * dims, kv_heads * head_dim, bias=bias)
        self.mlp = llama.MLP(args)
        self.norm_before_residual = norm_before_residual

    def __call__(self, embeds: mx.array, g: mx.array, mask=None, cache=None) -> mx.array:
        """(B, L, D) token embeddings, (B, L, D) features -> (B, L, D) the head's features."""
        normed = self.hidden_norm(g)
        h = (normed if self.norm_before_residual else g) + self.self_attn(
            mx.concatenate([self.input_layernorm(embeds), normed], axis=-1), mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


def _qwen3_attention(args: llama.ModelArgs) -> nn.Module:
    from mlx_lm.models import qwen3

    return qwen3.Attention(qwen3.ModelArgs(
        model_type="qwen3", hidden_size=args.hidden_size, num_hidden_layers=1, intermediate_size=args.intermediate_size,
        num_attention_heads=args.num_attention_heads, rms_norm_eps=args.rms_norm_eps, vocab_size=args.vocab_size,
        num_key_value_heads=args.num_key_value_heads, max_position_embeddings=args.max_position_embeddings,
        head_dim=args.head_dim or args.hidden_size // args.num_attention_heads, tie_word_embeddings=False,
        rope_theta=args.rope_theta, rope_scaling=args.rope_scaling))


class Eagle3Head(nn.Module):
    def __init__(self, args: llama.ModelArgs, target_dims: int, norm_before_residual: bool, norm_before_fc: bool,
                 qk_norms: bool = False):
        super().__init__()
        if norm_before_fc:
            self.input_norm = nn.RMSNorm(3 * target_dims, args.rms_norm_eps)
        self.fc = nn.Linear(3 * target_dims, args.hidden_size, bias=False)
        self.layer = Eagle3Layer(args, norm_before_residual, qk_norms)

    @property
    def dims(self) -> int:
        return self.layer.hidden_norm.weight.shape[0]

    def __call__(self, embeds: mx.array, features: mx.array, cache=None, mask=None) -> mx.array:
        """(B, L, D) token embeddings, (B, L, 3 Dt) target features or (B, L, D) the head's own ->
        (B, L, D) features."""
        g = features.astype(embeds.dtype)
        if g.shape[-1] != self.dims:  # the target's three layers
            g = self.fc(self.input_norm(g) if "input_norm" in self else g)
        return self.layer(embeds, g, mask, cache)


class Eagle3Output(nn.Module):
    """norm, then the head's lm_head over its draft vocabulary (or the target's head over all of it):
    draft index i is token vocab[i] = i + d2t[i]."""

    def __init__(self, norm: nn.RMSNorm, lm_head, vocab: mx.array, target_rows: int):
        super().__init__()
        self.norm, self.vocab, self.module_rows = norm, vocab, target_rows
        if isinstance(lm_head, nn.Module):
            self.lm_head = lm_head
        else:
            self._target_head = lm_head  # a bound method: not a parameter of this module

    def __call__(self, f: mx.array) -> mx.array:
        h = self.norm(f)
        return self.lm_head(h) if "lm_head" in self else self._target_head(h)


def read(path: Path, target: nn.Module) -> tuple[Eagle3Head, Eagle3Output, dict]:
    """(head, output, config with "feature_layers") from the head's folder, checked against `target`."""
    config = read_config(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        extra = " (it has pytorch_model.bin: PyTorch pickles are not read; convert it to safetensors)" \
            if (path / "pytorch_model.bin").exists() else ""
        raise MlxspecError(f"{path.name} holds no safetensors{extra}")
    block = config.get("transformer_layer_config") or config
    tensors = {}
    for f in files:
        tensors.update(mx.load(str(f)))
    embed = tensors.get("embed_tokens.weight", tensors.get("model.embed_tokens.weight"))
    weights, d2t = _head_names(tensors, path.name)
    args = _layer_args(block, config)
    target_dims, target_vocab = _target_args(target).hidden_size, vocabulary_size(target)
    fc = weights.get("fc.weight")
    if fc is None or fc.shape != (args.hidden_size, 3 * target_dims):
        raise MlxspecError(f"{path.name} is an EAGLE-3 head for another model: its fc takes "
                           f"{None if fc is None else fc.shape[1]} features, this model gives 3 x {target_dims}")
    head = Eagle3Head(args, target_dims, bool(config.get("norm_before_residual")), "input_norm.weight" in weights,
                      "layer.self_attn.q_norm.weight" in weights)
    if args.hidden_size != target_dims:  # a narrower head embeds tokens itself (EAGLE trains that table)
        if embed is None or embed.shape[-1] != args.hidden_size:
            raise MlxspecError(f"{path.name}: a {args.hidden_size}-wide head for a {target_dims}-wide model needs "
                               "its own embed_tokens")
        head.embed = nn.Embedding(*embed.shape)
        weights["embed.weight"] = embed
    norm = nn.RMSNorm(args.hidden_size, args.rms_norm_eps)
    lm_head = weights.pop("lm_head.weight", None)
    if "norm.weight" not in weights:
        raise MlxspecError(f"{path.name}: the EAGLE-3 head has no output norm (norm.weight)")
    norm.weight = weights.pop("norm.weight")
    try:
        head.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise MlxspecError(f"{path.name}: its EAGLE-3 layer does not fit: {e}") from None
    vocab = _draft_vocabulary(d2t, lm_head, target_vocab, path.name)
    if lm_head is not None:
        projection = nn.Linear(args.hidden_size, lm_head.shape[0], bias=False)
        projection.weight = lm_head
    else:
        projection = target_head(target)
    output = Eagle3Output(norm, projection, vocab, target_vocab)
    layers = config.get("eagle_aux_hidden_state_layer_ids") or _default_layers(len(target.layers))
    if len(layers) != 3:
        raise MlxspecError(f"{path.name}: its fc reads three layers' states, its config names {len(layers)}")
    return head, output, {"kind": "eagle3", "file": str(path), "feature_layers": [int(i) for i in layers]}


def _default_layers(count: int) -> list[int]:
    """EAGLE's choice: the hidden states entering layers 2, L//2 and L-3 (modeling_llama_kv.py)."""
    layers = [2, count // 2, count - 3]
    if len(set(layers)) < 3 or min(layers) < 1:
        raise MlxspecError(f"EAGLE-3 reads three distinct layers' inputs; a {count}-layer model has none such")
    return layers


def _head_names(tensors: dict, name: str) -> tuple[dict, mx.array | None]:
    """The folder's tensors under Eagle3Head's names (layer.*, fc, input_norm) plus norm and lm_head; d2t apart."""
    out, d2t = {}, None
    for key, value in tensors.items():
        if key in DROPPED or key.endswith("rotary_emb.inv_freq") or key.startswith("verifier_"):
            continue  # verifier_norm / verifier_lm_head: the speculators library's training copies of the target's
        if key == "d2t":
            d2t = value
            continue
        prefix = next((p for p in LAYER_PREFIXES if key.startswith(p)), None)
        if prefix is not None:
            out["layer." + key[len(prefix):]] = value
        elif key.startswith(("layers.", "model.layers.")):
            raise MlxspecError(f"{name}: an EAGLE-3 head of more than one layer ({key}); mlxspec runs one-layer heads")
        elif key in ("fc.weight", "norm.weight", "lm_head.weight", "input_norm.weight"):
            out[key] = value
        else:
            raise MlxspecError(f"{name}: tensor {key} is not one of an EAGLE-3 head mlxspec knows")
    return out, d2t


def _layer_args(block: dict, config: dict) -> llama.ModelArgs:
    try:
        dims = int(block["hidden_size"])
        return llama.ModelArgs(
            model_type="llama", hidden_size=dims, num_hidden_layers=1, intermediate_size=int(block["intermediate_size"]),
            num_attention_heads=int(block["num_attention_heads"]), rms_norm_eps=float(block.get("rms_norm_eps", 1e-6)),
            vocab_size=int(block.get("vocab_size", 1)), head_dim=block.get("head_dim"),
            max_position_embeddings=block.get("max_position_embeddings"),
            num_key_value_heads=block.get("num_key_value_heads") or block["num_attention_heads"],
            attention_bias=bool(block.get("attention_bias", False)), rope_theta=float(block.get("rope_theta", 10000.0)),
            rope_scaling=block.get("rope_scaling"))
    except (KeyError, TypeError, ValueError) as e:
        raise MlxspecError(f"the EAGLE-3 head's config lacks its layer's shape: {e}") from None


def _target_args(target: nn.Module):
    return getattr(target, "language_model", target).args


def _draft_vocabulary(d2t: mx.array | None, lm_head: mx.array | None, target_vocab: int, name: str) -> mx.array:
    """(V',) target ids of the draft indices: i + d2t[i], distinct and within the target's vocabulary."""
    rows = target_vocab if lm_head is None else lm_head.shape[0]
    if d2t is not None and d2t.shape != (rows,):
        raise MlxspecError(f"{name}: d2t has {d2t.size} entries for a draft vocabulary of {rows}")
    ids = mx.arange(rows, dtype=mx.int64) + (0 if d2t is None else d2t.astype(mx.int64))
    if ids.min().item() < 0 or ids.max().item() >= target_vocab:
        raise MlxspecError(f"{name}: its draft vocabulary maps outside this model's {target_vocab} tokens")
    if len(set(ids.tolist())) != rows:
        raise MlxspecError(f"{name}: its d2t maps two draft tokens to one token")
    return ids.astype(mx.uint32)
