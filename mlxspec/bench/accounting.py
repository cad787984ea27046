"""Bytes read from memory per generated token: the denominator of the decode roofline.

One plain decoding step reads every weight the forward pass touches once, plus the whole KV cache
so far. "Every weight" is every parameter's nbytes (packed quantized weights, scales and biases
included), except an input embedding table that is not also the output head: of that table one
row is read per token. A tied table is read whole, as the head. Of a mixture of experts' stacked
experts (mlx-lm's SwitchLinear layers) a token reads the k it is routed to: k / experts of them.
A verify pass of several rows reads the union of their experts, more than one row's: for MoE
models the speculative figures below count one row's share, a lower bound.

A speculative round reads the target's weights once for all the tokens it yields, plus the
drafter's weights once per drafted token: that is how speculation gets past the roofline.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten


@dataclass
class ModelBytes:
    parameter_bytes: int  # all parameters, as stored
    weights_read_per_step: int  # what one forward pass over one token reads
    embedding_table_bytes: int  # an untied input embedding table (0 when tied or absent)
    kv_bytes_per_position: int  # K and V of one context position, all layers

    def step_bytes(self, context: float) -> float:
        """Bytes one plain decoding step reads at this context length."""
        return self.weights_read_per_step + self.kv_bytes_per_position * context

    def to_dict(self) -> dict:
        return asdict(self)


def parameter_bytes(model: nn.Module) -> int:
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def _tied(model: nn.Module) -> bool:
    args = getattr(model, "args", None)
    tied = getattr(args, "tie_word_embeddings", None)
    return bool(tied) if tied is not None else not hasattr(model, "lm_head")


def _embedding_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    kinds = (nn.Embedding, nn.QuantizedEmbedding)
    return [(name, m) for name, m in model.named_modules() if isinstance(m, kinds)]


def untied_embedding(model: nn.Module) -> tuple[int, int]:
    """(table bytes, one row's bytes) of input embeddings not used as the head; (0, 0) if tied."""
    if _tied(model):
        return 0, 0
    table = row = 0
    for _, m in _embedding_modules(model):
        nbytes = parameter_bytes(m)
        rows = m.weight.shape[0]
        table += nbytes
        row += nbytes // max(rows, 1)
    return table, row


def kv_bytes_per_position(model: nn.Module) -> int:
    """Measured, not derived from the config: run one token into a fresh cache and weigh it.

    Caches allocate in steps (mlx-lm: 256 positions), so weigh each (B, heads, T, dim) array per
    position along T rather than by its allocated size.
    """
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array([[0]], dtype=mx.uint32), cache=cache)
    arrays = [a for c in cache for _, a in tree_flatten(c.state) if isinstance(a, mx.array)]
    mx.eval(arrays)
    return sum(a.nbytes // a.shape[-2] for a in arrays if a.ndim == 4)


def unrouted_expert_bytes(model: nn.Module) -> int:
    """Bytes of stacked experts one token does not read: (1 - k / experts) of them (0 if dense)."""
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

    args = getattr(model, "args", None)
    used = getattr(args, "num_experts_per_tok", None)
    experts = [m for _, m in model.named_modules() if isinstance(m, (SwitchLinear, QuantizedSwitchLinear))]
    if not experts or not used:
        return 0
    return round(sum(parameter_bytes(m) * (1 - used / m.num_experts) for m in experts))


def model_bytes(model: nn.Module) -> ModelBytes:
    total = parameter_bytes(model)
    table, row = untied_embedding(model)
    return ModelBytes(total, total - table + row - unrouted_expert_bytes(model), table, kv_bytes_per_position(model))


def bytes_per_token(target: ModelBytes, draft: ModelBytes | None, *, tokens: int, target_passes: int,
                    draft_passes: int, context: float) -> float:
    """Bytes actually read per generated token by a run (weights of both models, target KV)."""
    if tokens <= 0:
        return 0.0
    read = target_passes * target.step_bytes(context)
    if draft is not None:
        read += draft_passes * draft.step_bytes(context)
    return read / tokens
