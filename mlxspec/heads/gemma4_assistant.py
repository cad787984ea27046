"""Gemma 4's multi-token-prediction "assistant": the drafter Google ships with Gemma 4 (model_type
gemma4_assistant, e.g. google/gemma-4-31B-it-assistant, mlx-community/gemma-4-31B-it-assistant-bf16).

A few Gemma 4 decoder layers of their own width whose keys and values are the target's: every layer is
KV-shared, reading the target's cache of its last full-attention layer or its last sliding-window layer
(by the layer's type). Each draft step reads the token just chosen and a backbone-wide hidden state:

    x     = pre_projection([embed_t(token) * sqrt(Dt) ; h])      2 Dt -> D   the target's embedding, scaled
    y     = norm(layers(x, queries at position q, the target's K/V: all of it / its last `window` positions))
    logits = embed_a(y)^T                                        the assistant's own tied embedding
    h'    = post_projection(y)                                   D -> Dt     the next step's h

The first step's h is the target's final (normed) hidden state of the last position its cache holds, q
that position; every later step keeps q and feeds its own h'. This follows mlx-vlm's port
(speculative/drafters/gemma4_assistant, speculative/mtp.py), itself after Hugging Face's
SinglePositionMultiTokenCandidateGenerator; the layers are mlx-lm's gemma4 DecoderLayer (shared_kv,
offset). The E2B / E4B assistants (use_ordered_embeddings) score only the tokens of their top clusters
(MaskedEmbedder, after Hugging Face's Gemma4AssistantMaskedEmbedder): the others get the least of those
logits less one, so they lose every argmax and keep a little probability when sampling.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import MlxspecError
from .mtp_checkpoints import read_config

MODEL_TYPE = "gemma4_assistant"
FAMILIES = ("gemma4", "gemma4_text")  # mlx-lm modules of the targets it drafts for


class MaskedEmbedder(nn.Module):
    """The E2B / E4B assistants' head: `centroids` scores clusters of tokens; the top_k clusters' tokens
    (token_ordering lists each cluster's in a block) are scored against the tied embedding, the rest of the
    vocabulary set to the least of those scores less one."""

    def __init__(self, dims: int, vocab: int, clusters: int, top_k: int):
        super().__init__()
        self.centroids = nn.Linear(dims, clusters, bias=False)
        self.token_ordering = mx.zeros((vocab,), dtype=mx.int32)
        self.top_k, self.per_cluster, self.vocab = top_k, vocab // clusters, vocab

    def __call__(self, y: mx.array, embed: nn.Module) -> mx.array:
        """(B, L, D) -> (B, L, V) logits."""
        top = mx.argpartition(self.centroids(y), kth=-self.top_k, axis=-1)[..., -self.top_k :]  # (B, L, K)
        ids = self.token_ordering.reshape(-1, self.per_cluster)[top].reshape(*y.shape[:2], -1)  # (B, L, K x per)
        scores = (embed(ids) @ y[..., :, None])[..., 0]  # (B, L, K x per): the embedding's rows, dequantized
        floor = mx.broadcast_to(scores.min(axis=-1, keepdims=True) - 1, (*y.shape[:2], self.vocab))
        return mx.put_along_axis(floor, ids, scores, axis=-1)


class Gemma4Assistant(nn.Module):
    def __init__(self, args, backbone: int, tied: bool, clusters: tuple[int, int] | None = None):
        """`args`: mlx-lm gemma4_text ModelArgs of the assistant's layers (all KV-shared); `backbone`: Dt;
        `clusters`: (num_centroids, centroid_intermediate_top_k) of an E2B / E4B assistant's head."""
        super().__init__()
        from mlx_lm.models import gemma4_text

        self.model = _Inner(args, gemma4_text)
        self.pre_projection = nn.Linear(2 * backbone, args.hidden_size, bias=False)
        self.post_projection = nn.Linear(args.hidden_size, backbone, bias=False)
        if clusters is not None:
            self.masked_embedding = MaskedEmbedder(args.hidden_size, args.vocab_size, *clusters)
        elif not tied:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.layer_types = list(args.layer_types[: args.num_hidden_layers])
        self.window = args.sliding_window

    def __call__(self, x: mx.array, shared: dict, position, masks: dict | None = None) -> tuple[mx.array, mx.array]:
        """(1, 1, 2 Dt) [embedding ; h], {layer type: (keys, values)} -> (logits (1, 1, V), h' (1, 1, Dt)).
        `masks` {layer type: (1, keys)}: which of those keys count (a compiled step's whole buffers)."""
        h, offset = self.pre_projection(x), mx.array(position)
        for layer in self.model.layers:
            mask = None if masks is None else masks[layer.layer_type]
            h, _, _ = layer(h, mask, None, shared_kv=shared[layer.layer_type], offset=offset)
        y = self.model.norm(h)
        if "masked_embedding" in self:
            logits = self.masked_embedding(y, self.model.embed_tokens)
        else:
            logits = self.lm_head(y) if "lm_head" in self else self.model.embed_tokens.as_linear(y)
        return logits, self.post_projection(y)


class _Inner(nn.Module):
    def __init__(self, args, gemma4_text):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [gemma4_text.DecoderLayer(args, i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


def is_assistant(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and read_config(path).get("model_type") == MODEL_TYPE


def read(path: Path, target: nn.Module) -> Gemma4Assistant:
    """The assistant in the folder `path` (config.json + safetensors), checked against `target`."""
    from mlx_lm.models import gemma4_text

    family = type(target).__module__.rpartition(".")[2]
    if family not in FAMILIES:
        raise MlxspecError(f"{path.name} is Gemma 4's assistant: it drafts for a Gemma 4 model, not {family}")
    config = read_config(path)
    clusters = (int(config.get("num_centroids", 2048)), int(config.get("centroid_intermediate_top_k", 32))) \
        if config.get("use_ordered_embeddings") else None
    tensors = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(mx.load(str(f)))
    text = dict(config.get("text_config") or {})
    layers = int(text.get("num_hidden_layers", 4))
    per_layer = text.get("hidden_size_per_layer_input", 0) if any(".per_layer_input_gate." in k for k in tensors) else 0
    args = gemma4_text.ModelArgs.from_dict(text | {"num_kv_shared_layers": layers, "num_hidden_layers": layers,
                                                   "hidden_size_per_layer_input": per_layer})  # every layer KV-shared
    target_args = getattr(target, "language_model", target).args
    backbone = int(config.get("backbone_hidden_size", 0))
    if backbone != target_args.hidden_size or args.vocab_size != target_args.vocab_size:
        raise MlxspecError(f"{path.name} is the assistant of another model: {backbone} wide over {args.vocab_size} "
                           f"tokens, this model {target_args.hidden_size} over {target_args.vocab_size}")
    if clusters is not None and args.vocab_size % clusters[0]:
        raise MlxspecError(f"{path.name}: {args.vocab_size} tokens do not split into {clusters[0]} equal clusters")
    head = Gemma4Assistant(args, backbone, bool(config.get("tie_word_embeddings", True)), clusters)
    weights = dict(tensors)
    if "masked_embedding.token_ordering" in weights:
        weights["masked_embedding.token_ordering"] = weights["masked_embedding.token_ordering"].astype(mx.int32)
    if "lm_head" not in head:
        weights.pop("lm_head.weight", None)
    missing = {k for k, _ in _flat(head)} - set(weights)
    if missing - {k for k in missing if k.endswith("layer_scalar")}:  # a scalar left out stays 1
        raise MlxspecError(f"{path.name}: the assistant lacks {sorted(missing)[0]}")
    try:
        head.load_weights(list(weights.items()), strict=False)
    except ValueError as e:
        raise MlxspecError(f"{path.name}: the assistant does not fit: {e}") from None
    extra = set(weights) - {k for k, _ in _flat(head)}
    if extra:
        raise MlxspecError(f"{path.name}: tensor {sorted(extra)[0]} is not one of a Gemma 4 assistant")
    mx.eval(head.parameters())
    head.eval()
    return head


def _flat(module: nn.Module):
    from mlx.utils import tree_flatten

    return tree_flatten(module.parameters())
