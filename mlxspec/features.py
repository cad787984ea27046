"""The target's own features for learned drafters (EAGLE, Medusa): final hidden states + logits.

`target_forward` is mlx-lm's `Model.__call__` split in two (the decoder body, then the head), so
its logits are bit-identical to `model(x, cache=cache)`; the loop uses it only when a drafter
asks for hidden states (`Drafter.wants_hidden`).

EAGLE-3 heads read the inputs of three layers instead (low, middle, high: `Drafter.feature_layers`).
`tap(model, layers)` makes those layers' predecessors keep their last output (a class swap of those
layer instances, per model: mlx-lm's classes and other models are untouched), and
`target_forward(..., layers=...)` returns them, concatenated, from the same pass.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


TAPPED = "_mlxspec_tap"  # class attribute of a tapped layer class: the list its last output is kept in


def target_forward(model: nn.Module, x: mx.array, cache: list | None = None,
                   layers: tuple[int, ...] | None = None) -> tuple[mx.array, mx.array]:
    """(B, L) ids -> (logits (B, L, V), hidden (B, L, H)): hidden is after the final norm; with `layers`
    (tapped first), the inputs of those layers instead, concatenated: (B, L, len(layers) H)."""
    if layers is not None:  # the model's own pass for the logits (any architecture), the taps for the features
        return model(x, cache=cache), tapped(model, layers)
    body = decoder_body(model)
    hidden = body(x, cache=cache)
    return head(model)(hidden), hidden


def decoder_body(model: nn.Module) -> nn.Module:
    """The decoder without its output head: mlx-lm's `model.model`, or a wrapper's text model's (gemma4)."""
    for body in (getattr(model, "model", None), getattr(getattr(model, "language_model", None), "model", None)):
        if body is not None and hasattr(body, "embed_tokens"):
            return body
    raise TypeError(f"target features need an mlx-lm decoder with .model.embed_tokens, not {type(model)}")


def embedding(model: nn.Module) -> nn.Module:
    """The target's token embedding table (unscaled: a Gemma model multiplies its output by sqrt(D) itself)."""
    return decoder_body(model).embed_tokens


def tap(model: nn.Module, layers: tuple[int, ...]) -> None:
    """Make the decoder keep the input of each of `layers` (the output of the layer before it) on every
    pass. Idempotent; per model."""
    blocks = model.layers
    for i in layers:
        if not 1 <= i < len(blocks):
            raise ValueError(f"layer {i}'s input is not a layer's output (the model has {len(blocks)} layers)")
        block = blocks[i - 1]
        if hasattr(type(block), TAPPED):
            continue
        base, sink = type(block), []

        def call(self, *args, _base=base, _sink=sink, **kwargs):
            out = _base.__call__(self, *args, **kwargs)
            _sink[:] = [out[0] if isinstance(out, tuple) else out]  # gemma4's layers return (h, kv, offset)
            return out

        block.__class__ = type(f"Tapped{base.__name__}", (base,), {"__call__": call, TAPPED: sink})


def tapped(model: nn.Module, layers: tuple[int, ...]) -> mx.array:
    """The inputs of `layers` from the decoder's last pass, concatenated on the last axis; each is then
    forgotten, so a pass that did not run the taps cannot hand out an older pass's rows."""
    out = []
    for i in layers:
        sink = getattr(type(model.layers[i - 1]), TAPPED, None)
        if not sink:
            raise RuntimeError(f"layer {i - 1} of the target was not tapped, or has not run since it was read")
        out.append(sink[0])
    for i in layers:
        getattr(type(model.layers[i - 1]), TAPPED).clear()
    return mx.concatenate(out, axis=-1)


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
