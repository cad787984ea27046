"""The target's own features for learned drafters (EAGLE, Medusa): final hidden states + logits.

`target_forward` is mlx-lm's `Model.__call__` split in two (the decoder body, then the head), so
its logits are bit-identical to `model(x, cache=cache)`; the loop uses it only when a drafter
asks for hidden states (`Drafter.wants_hidden`).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


def target_forward(model: nn.Module, x: mx.array, cache: list | None = None) -> tuple[mx.array, mx.array]:
    """(B, L) ids -> (logits (B, L, V), hidden (B, L, H)): hidden is after the final norm."""
    body = getattr(model, "model", None)
    if body is None or not hasattr(body, "embed_tokens"):
        raise TypeError(f"target features need an mlx-lm decoder with .model.embed_tokens, not {type(model)}")
    hidden = body(x, cache=cache)
    return head(model)(hidden), hidden


def head(model: nn.Module):
    """The output projection, chosen as mlx-lm does: the tied embedding, else lm_head (a wrapper's, qwen3_5's,
    from its text model)."""
    inner = getattr(model, "language_model", None)
    if isinstance(inner, nn.Module):
        return head(inner)
    if getattr(getattr(model, "args", None), "tie_word_embeddings", False) or "lm_head" not in model:
        return model.model.embed_tokens.as_linear
    return model.lm_head


def vocabulary_size(model: nn.Module) -> int:
    """Rows of the input embedding table: the ids a prompt may hold are 0..size-1."""
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if embed is not None and "weight" in embed:
        return int(embed["weight"].shape[0])
    return int(model.args.vocab_size)
