"""Self-drafting: the target's own first layers, through its final norm and head (early exit).

No second set of weights: the draft is a view of the target that stops after `layers` blocks
(its own small KV cache). Acceptance depends on how much the later layers change the prediction;
measure it per model (benchmarks/) before relying on it.
"""

from __future__ import annotations

import copy

import mlx.nn as nn

from .model import ModelDrafter


def decoder_of(model: nn.Module) -> nn.Module:
    """The decoder body an early-exit view can cut: `model.model`, a plain attribute with a .layers list and .norm.
    Wrapped models (Gemma 4's language_model, Qwen3.5's `model` property over it) raise ValueError."""
    inner = getattr(model, "model", None)
    wrapped = isinstance(getattr(type(model), "model", None), property)  # a view of another module: not settable
    if (inner is None or wrapped or not isinstance(getattr(inner, "layers", None), list)
            or not hasattr(inner, "norm")):  # (PLaMo's .layers is a module of its own around the list)
        raise ValueError(f"early exit needs an mlx-lm decoder with .model.layers and .model.norm, not {type(model)}"
                         + (" (a wrapper around its language model)" if wrapped or hasattr(model, "language_model") else ""))
    return inner


def early_exit_view(model: nn.Module, layers: int) -> nn.Module:
    """A shallow copy of an mlx-lm model running only its first `layers` blocks (weights shared)."""
    inner = decoder_of(model)
    total = len(inner.layers)
    if not 1 <= layers < total:
        raise ValueError(f"early exit after {layers} layers: the model has {total}, choose 1..{total - 1}")
    view_inner = copy.copy(inner)
    view_inner.layers = inner.layers[:layers]
    view = copy.copy(model)
    view.model = view_inner
    return view


class EarlyExitDrafter(ModelDrafter):
    name = "early-exit"

    def __init__(self, target: nn.Module, layers: int | None = None):
        total = len(decoder_of(target).layers)  # ValueError for a model early exit cannot cut
        self.layers = layers if layers is not None else max(1, total // 2)
        super().__init__(early_exit_view(target, self.layers))
        self.name = f"early-exit:{self.layers}"
