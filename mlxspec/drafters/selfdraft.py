"""Self-drafting: the target's own first layers, through its final norm and head (early exit).

No second set of weights: the draft is a view of the target that stops after `layers` blocks
(its own small KV cache). Acceptance depends on how much the later layers change the prediction;
measure it per model (benchmarks/) before relying on it.
"""

from __future__ import annotations

import copy

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from .model import ModelDrafter


# Where mlx-lm models keep the decoder body (its blocks as a list): text models as .model (GPT-2's family and others
# as .transformer, Mamba's and Nemotron-H's as .backbone); multimodal wrappers (Gemma 3 and 4, Qwen3.5, Llama 4,
# Mistral 3, the VL models) as language_model.model; Gemma 3n as model.language_model. The blocks: .layers, GPT-2's
# .h, DBRX's and Talkie's .blocks; PLaMo's a module of its own around its .layers list (model.layers). Whatever runs
# after them (the final norm, the head) is the model's own.
DECODER_PATHS = (("model",), ("transformer",), ("backbone",), ("language_model", "model"), ("model", "language_model"),
                 ("model", "layers"))
BLOCK_LISTS = ("layers", "h", "blocks")
BLOCK_COUNTS = ("end_idx", "num_layers")  # a body's own counts of the blocks it loops over (PipelineMixin, Kimi K3)


def decoder_path(model: nn.Module) -> tuple[str, ...]:
    """The attributes from `model` to the decoder body an early-exit view can cut, through plain attributes (not
    properties: Qwen3.5's `model` is a view of language_model.model); ValueError where there is none."""
    for path in DECODER_PATHS:
        node = model
        for name in path:
            plain = not isinstance(getattr(type(node), name, None), property)
            node = getattr(node, name, None) if plain else None
            if not isinstance(node, nn.Module):
                break
        else:
            if _blocks(node) is not None:
                return path
    raise ValueError(f"early exit needs an mlx-lm decoder with its blocks as a list (.model.layers, a wrapper's "
                     f"language_model.model.layers...), not {type(model)}")


def _blocks(body: nn.Module) -> str | None:
    """The name of the body's list of blocks."""
    return next((name for name in BLOCK_LISTS if isinstance(getattr(body, name, None), list)), None)


def decoder_of(model: nn.Module) -> nn.Module:
    """The decoder body an early-exit view cuts (decoder_path)."""
    for name in decoder_path(model):
        model = getattr(model, name)
    return model


def block_count(model: nn.Module) -> int:
    body = decoder_of(model)
    return len(getattr(body, _blocks(body)))


def early_exit_view(model: nn.Module, layers: int) -> nn.Module:
    """A shallow copy of an mlx-lm model running only its first `layers` blocks (weights shared; each module on the
    way to the decoder body copied, so the model itself keeps all of them). A view whose forward fails (a model that
    sizes something else by its block count: Gemma 3n's per-layer inputs) raises ValueError here, not in a request."""
    total = block_count(model)
    if not 1 <= layers < total:
        raise ValueError(f"early exit after {layers} layers: the model has {total}, choose 1..{total - 1}")
    view = _cut(model, decoder_path(model), layers)
    try:
        mx.eval(view(mx.array([[0, 1]]), cache=make_prompt_cache(view)))
    except Exception as e:  # mlx-lm's model code on a cut it does not expect
        raise ValueError(f"early exit after {layers} layers does not run on {type(model).__module__}: "
                         f"{type(e).__name__}: {str(e).splitlines()[0][:160]}") from None
    return view


def _cut(node: nn.Module, path: tuple[str, ...], layers: int) -> nn.Module:
    view = copy.copy(node)
    if path:
        setattr(view, path[0], _cut(getattr(node, path[0]), path[1:], layers))
        return view
    blocks = _blocks(node)
    for name in BLOCK_COUNTS:
        if getattr(node, name, None) == len(getattr(node, blocks)):
            setattr(view, name, layers)
    setattr(view, blocks, getattr(node, blocks)[:layers])
    return view


class EarlyExitDrafter(ModelDrafter):
    name = "early-exit"

    def __init__(self, target: nn.Module, layers: int | None = None):
        total = block_count(target)  # ValueError for a model early exit cannot cut
        self.layers = layers if layers is not None else max(1, total // 2)
        super().__init__(early_exit_view(target, self.layers))
        self.name = f"early-exit:{self.layers}"
