"""MoE routers that multiply by a raw weight, and unquantized experts, one token at a time on a GPU.

Many of mlx-lm's mixture-of-experts gates are not Linear layers: `gates = x @ self.weight.T`, then
a softmax or sigmoid and a top-k (DeepSeek V2/V3, GLM-4.5, dots.llm1, EXAONE MoE, MiMo ...). On a
GPU MLX's matmul changes its arithmetic with the row count, so a verify pass would route its tokens
with other gate values than one-token steps do, and an expert chosen on a near tie could differ.
The dense kernel cannot be slipped in (the operator is not a module), but a gate maps each token's
row to that token's routing alone, so calling the model's own gate on one token at a time gives
every row exactly a one-token step's arithmetic. `use_rowwise_gates` gives this model's such gates
a subclass that does so for decoding passes (a prompt chunk, as everywhere on a GPU, runs whole:
passes.py). The gates are small (experts x hidden): the extra calls cost launches, not reads.

Unquantized experts (mlx-lm's SwitchGLU / SwitchMLP over plain SwitchLinear: a float16 or bfloat16 MoE
checkpoint) go the same way: their `gather_mm` has no kernel of ours (quantized experts have the gather qmm,
layers.py), and a verify pass's M tokens x k experts may even be sorted by expert where a one-token step's are
not. Called one token at a time, each token's call has exactly a one-token step's shapes, hence its kernels
and bits. Those calls read each chosen expert once per token, as M one-token steps would.

Some models multiply each token by a small matrix of its own or a raw weight outside any module's Linear (Gemma 3n's
AltUp predictions, IQuest-Loop-Coder's loop gates, DeepSeek-V4.1's hyper-connections: TOKENWISE), or by a float
SwitchLinear outside any expert MLP (DeepSeek-V4.1's grouped output projection): the same, one token at a time.
"""

from __future__ import annotations

import functools
import inspect
import re

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import deepseek_v41, gemma3n, iquestloopcoder
from mlx_lm.models.switch_layers import SwitchGLU, SwitchLinear, SwitchMLP

from .passes import prompt_tokens

_RAW_WEIGHT = re.compile(r"@\s*self\.weight\b")  # `x @ self.weight.T`: a matmul that is not a module


def raw_weight_gate(cls: type) -> bool:
    """Is `cls` a router that multiplies its input by its own raw weight (not a Linear layer)?"""
    if issubclass(cls, (nn.Linear, nn.QuantizedLinear)) or not re.search(r"(Gate|Router)$", cls.__name__):
        return False
    try:
        return bool(_RAW_WEIGHT.search(inspect.getsource(cls.__call__)))
    except (OSError, TypeError):
        return False


def unquantized_experts(module: nn.Module) -> bool:
    """Is `module` an expert MLP of mlx-lm's (called as (x, indices)) over plain, unquantized SwitchLinear?"""
    return isinstance(module, (SwitchGLU, SwitchMLP)) and any(type(c) is SwitchLinear for c in module.children().values())


def _one_token_at_a_time(self, x: mx.array, *per_token: mx.array):
    """The base class's call on each token's row alone (x (..., T, hidden), batch 1; each of `per_token`
    (..., T, n): the experts' indices), joined along T (of x, and of an expert MLP's (..., T, k, out))."""
    tokens = x.shape[-2] if x.ndim >= 2 else 1
    if tokens <= 1 or x.size != tokens * x.shape[-1] or any(a.ndim < 2 or a.shape[-2] != tokens for a in per_token):
        return self._whole(x, *per_token)
    return _tokens_one_at_a_time(self._whole, x, x.ndim - 2, *per_token)


@functools.lru_cache(maxsize=None)
def _rowwise(cls: type) -> type:
    return type(f"Rowwise{cls.__name__}", (cls,), {"__call__": _one_token_at_a_time, "_whole": cls.__call__,
                                                    "__module__": cls.__module__})


def _tokens_one_at_a_time(call, x: mx.array, axis: int, *per_token: mx.array):
    """call(x, *per_token) on each token of x's `axis` alone (each of `per_token` (..., T, n) cut along its T too),
    joined along that axis (one sequence); whole for one token or a prompt chunk (passes.prompt_tokens)."""
    tokens = x.shape[axis]
    if tokens <= 1 or prompt_tokens(tokens):
        return call(x, *per_token)
    index = (slice(None),) * axis
    outs = [call(x[index + (slice(t, t + 1),)], *(a[..., t : t + 1, :] for a in per_token)) for t in range(tokens)]
    if isinstance(outs[0], tuple):
        return tuple(mx.concatenate(parts, axis=axis) for parts in zip(*outs))
    return mx.concatenate(outs, axis=axis)


class RowwiseAltUp(gemma3n.Gemma3nAltUp):
    """Gemma 3n's AltUp: `predict` multiplies each token's inputs by that token's own coefficient matrix, a batched
    matmul over the tokens (`mx.matmul(x_permuted, all_coefs)`): one token at a time in decoding passes."""

    def predict(self, x: mx.array) -> mx.array:  # x (altup inputs, B, T, hidden)
        return _tokens_one_at_a_time(super().predict, x, 2)


class RowwiseLoopGate(iquestloopcoder.LoopGateProjection):
    """IQuest-Loop-Coder's loop gate: each head's `query @ weight` over the tokens (a compiled matmul): one token at
    a time in decoding passes."""

    def __call__(self, query: mx.array) -> mx.array:  # query (B, heads, T, head_dim)
        return _tokens_one_at_a_time(super().__call__, query, 2)


class RowwiseHyperConnection(deepseek_v41.HyperConnection):
    """DeepSeek-V4.1's hyper-connections: each token's mix from its streams by a raw weight (`flat @ self.fn.T`):
    one token at a time in decoding passes."""

    def __call__(self, streams: mx.array) -> tuple[mx.array, mx.array, mx.array]:  # streams (B, T, hc, hidden)
        return _tokens_one_at_a_time(super().__call__, streams, 1)


class RowwiseGroupedProjection(SwitchLinear):
    """A float SwitchLinear outside an expert MLP, as a block-diagonal projection (DeepSeek-V4.1's o_a_proj: x
    (B*T, groups, 1, dim), indices (1, groups), a matrix a group): MLX's gather_mm over every token's groups at
    once, so one token at a time in decoding passes."""

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        whole = super().__call__
        if indices.shape[0] != 1:  # indices a token each (an expert's call): not the grouped form
            return whole(x, indices, sorted_indices)
        return _tokens_one_at_a_time(lambda token: whole(token, indices, sorted_indices), x, 0)


def _grouped_projections(model: nn.Module):
    """The plain SwitchLinear layers that are not an expert MLP's (those go whole: unquantized_experts)."""
    for _, m in model.named_modules():
        if not isinstance(m, (SwitchGLU, SwitchMLP)):
            yield from (c for c in m.children().values() if type(c) is SwitchLinear)


TOKENWISE = {gemma3n.Gemma3nAltUp: RowwiseAltUp, iquestloopcoder.LoopGateProjection: RowwiseLoopGate,
             deepseek_v41.HyperConnection: RowwiseHyperConnection}


def use_rowwise_gates(model: nn.Module) -> int:
    """Give this model's raw-weight routers, unquantized expert MLPs and per-token matmuls (TOKENWISE) the
    one-token-at-a-time call; returns how many."""
    swapped = 0
    for m in list(_grouped_projections(model)):
        m.__class__ = RowwiseGroupedProjection
        swapped += 1
    for _, m in model.named_modules():
        if type(m) in TOKENWISE:
            m.__class__ = TOKENWISE[type(m)]  # same parameters, same names
            swapped += 1
        elif not getattr(type(m), "_whole", None) and (raw_weight_gate(type(m)) or unquantized_experts(m)):
            m.__class__ = _rowwise(type(m))
            swapped += 1
    return swapped


def restore_rowwise_gates(model: nn.Module) -> None:
    for _, m in model.named_modules():
        if getattr(type(m), "_whole", None) or type(m) in (*TOKENWISE.values(), RowwiseGroupedProjection):
            m.__class__ = type(m).__mro__[1]
