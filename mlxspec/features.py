"""The target's own features for learned drafters (EAGLE, Medusa, mtp, EAGLE-3) and its logits, from one pass.

`target_forward` runs the model itself, `model(x, cache=cache)`, so its logits are those of plain decoding
bit for bit, whatever the architecture adds after its head (Gemma 2/4's softcap, Granite's and Cohere's
logit scales); the features are taken from that same pass by taps: the final norm's output (the hidden
state EAGLE, Medusa and mtp read) or, for EAGLE-3 heads, the inputs of three layers (low, middle, high:
`Drafter.feature_layers`). A tap is a class swap of that module instance (per model: mlx-lm's classes and
other models are untouched) that keeps its last output; it is read once, then forgotten. The loop uses
this only when a drafter asks for hidden states (`Drafter.wants_hidden`).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


TAPPED = "_mlxspec_tap"  # class attribute of a tapped module's class: the list its last output is kept in


def target_forward(model: nn.Module, x: mx.array, cache: list | None = None,
                   layers: tuple[int, ...] | None = None) -> tuple[mx.array, mx.array]:
    """(B, L) ids -> (logits (B, L, V), hidden (B, L, H)): logits as model(x, cache=cache), hidden after the
    final norm; with `layers`, the inputs of those layers instead, concatenated: (B, L, len(layers) H)."""
    modules = [_final_norm(model)] if layers is None else _layer_taps(model, layers)
    for m in modules:
        _tap(m)
    logits = model(x, cache=cache)
    return logits, _read(modules)


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
    pass. Idempotent; per model. (target_forward taps what it reads itself; this checks the layers early.)"""
    for m in _layer_taps(model, layers):
        _tap(m)


def tapped(model: nn.Module, layers: tuple[int, ...]) -> mx.array:
    """The inputs of `layers` from the decoder's last pass, concatenated on the last axis (read once)."""
    return _read(_layer_taps(model, layers))


def _final_norm(model: nn.Module) -> nn.Module:
    body = decoder_body(model)
    if "norm" not in body:
        raise TypeError(f"target features need the decoder's final norm (.norm), which {type(model)} lacks")
    return body["norm"]


def _layer_taps(model: nn.Module, layers: tuple[int, ...]) -> list[nn.Module]:
    blocks = model.layers
    for i in layers:
        if not 1 <= i < len(blocks):
            raise ValueError(f"layer {i}'s input is not a layer's output (the model has {len(blocks)} layers)")
    return [blocks[i - 1] for i in layers]


def _tap(module: nn.Module) -> None:
    if hasattr(type(module), TAPPED):
        return
    base, sink = type(module), []

    def call(self, *args, _base=base, _sink=sink, **kwargs):
        out = _base.__call__(self, *args, **kwargs)
        _sink[:] = [out[0] if isinstance(out, tuple) else out]  # gemma4's layers return (h, kv, offset)
        return out

    module.__class__ = type(f"Tapped{base.__name__}", (base,), {"__call__": call, TAPPED: sink})


def _read(modules: list[nn.Module]) -> mx.array:
    """The tapped modules' last outputs, concatenated on the last axis, then forgotten: a pass that did not
    run them cannot hand out an older pass's rows."""
    out = []
    for m in modules:
        sink = getattr(type(m), TAPPED, None)
        if not sink:
            raise RuntimeError(f"{type(m).__name__} of the target was not tapped, or has not run since it was read")
        out.append(sink[0])
    for m in modules:
        getattr(type(m), TAPPED).clear()
    return out[0] if len(out) == 1 else mx.concatenate(out, axis=-1)


def head(model: nn.Module):
    """The output projection, chosen as mlx-lm does: the tied embedding, else lm_head (a wrapper's, qwen3_5's,
    from its text model)."""
    inner = getattr(model, "language_model", None)
    if isinstance(inner, nn.Module):
        return head(inner)
    if getattr(getattr(model, "args", None), "tie_word_embeddings", False) or "lm_head" not in model:
        return model.model.embed_tokens.as_linear
    return model.lm_head


def logits_size(model: nn.Module) -> int:
    """Columns of the model's logits: its lm_head's rows (a Linear's, quantized or not; a head module's inner
    layer, as Phixtral's; a bare array, as Talkie's), else the input table's (a tied head)."""
    head = model.get("lm_head") if isinstance(model, nn.Module) else None
    if isinstance(head, mx.array):
        return int(head.shape[0])
    if isinstance(head, nn.Module):
        for m in [head, *(m for _, m in head.named_modules())]:
            if isinstance(m.get("weight"), mx.array) and m["weight"].ndim == 2:  # (out, in); quantized: (out, packed)
                return int(m["weight"].shape[0])
    return vocabulary_size(model)


def vocabulary_size(model: nn.Module) -> int:
    """Rows of the input embedding table: the ids a prompt may hold are 0..size-1."""
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if embed is not None and "weight" in embed:
        return int(embed["weight"].shape[0])
    args = getattr(model, "args", None)
    if getattr(args, "vocab_size", None):
        return int(args.vocab_size)
    tables = [m for _, m in model.named_modules() if isinstance(m, (nn.Embedding, nn.QuantizedEmbedding))]
    if tables:  # another name for the input table (Phixtral's transformer.embd.wte)
        return int(tables[0]["weight"].shape[0])
    raise ValueError(f"cannot tell {type(model).__name__}'s vocabulary size (no embed_tokens, args.vocab_size or table)")
