"""Mamba-2 layers (Granite 4.0-H, Nemotron-H, Falcon-H1, PLaMo 2, Mamba-2) verified one token at a time.

mlx-lm's `ssm_update` computes a call of several tokens as SSD does: a T x T "attention" matrix of decays
and C.B products, plus the carried state's contribution, summed in another order than T calls of one
token (on Apple GPUs one token even runs a Metal kernel of its own). So a verify pass's rows were not a
one-row step's bits, on the CPU too (`exactness.RowInvariance` measured it: `exact: false` on Granite
4.0-H). Routed per model (hooks.py), a call of up to DECODE_ROWS tokens that continues a state goes
through the same function one token at a time, so every row is a one-row step; prompt chunks (longer,
or without a state) keep the SSD pass, whose speed they need.

    report = use_ssm_steps(model, gpu)   # {"routed": modules, "stepped": Jamba mixers (gpu=True)}
    restore_ssm_steps(model)

Jamba's Mamba mixer scans its tokens one by one already, then reads the outputs of all T in one batched
matmul (`new_state @ C`), whose arithmetic a GPU may choose by T; on GPUs (`gpu=True`) a decoding pass's
tokens go through its scan one at a time (the CPU's batched matmul gives each row a one-row call's bits).
Bailing's lightning attention (`recurrent_gla`: one recurrent step for one token, decay-weighted chunks
for more) is routed the same way as `ssm_update`, on every device. RecurrentGemma's RG-LRU (block-diagonal gate
matmuls over the tokens) and temporal conv (`conv_general`) step on GPUs as Jamba's mixers do.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import jamba, recurrent_gemma

from .hooks import route_functions, unroute_functions
from .passes import prompt_tokens

NAME = "ssm_update"


def mlx_lm_ssm_update():
    from mlx_lm.models import ssm

    return ssm.ssm_update


def _stepped(step, tokens: int, axis: int, state):
    """step(t, state) -> (y, state) for each token in order: the ys joined along `axis` (the tokens'), the last state."""
    ys = []
    for t in range(tokens):
        y, state = step(t, state)
        ys.append(y)
    return mx.concatenate(ys, axis=axis), state


def stepwise_ssm_update(hidden_states, A_log, B, C, D, dt, dt_bias, state=None, time_step_limit=(0.001, 100.0),
                        mask=None, lengths=None):
    """mlx-lm's ssm_update (same arguments, same results as its one-token calls): (batch, T, heads, head
    dim) inputs with a state, T <= DECODE_ROWS, one sequence, go one token at a time."""
    update = mlx_lm_ssm_update()
    tokens = hidden_states.shape[1]
    if tokens == 1 or prompt_tokens(tokens) or state is None or mask is not None or lengths is not None:
        return update(hidden_states, A_log, B, C, D, dt, dt_bias, state, time_step_limit, mask, lengths)
    return _stepped(lambda t, s: update(hidden_states[:, t : t + 1], A_log, B[:, t : t + 1], C[:, t : t + 1], D,
                                        dt[:, t : t + 1], dt_bias, s, time_step_limit), tokens, 1, state)


def mlx_lm_recurrent_gla():
    from mlx_lm.models import bailing_hybrid

    return bailing_hybrid.recurrent_gla


def stepwise_recurrent_gla(q, k, v, g, *, scale, h=None, mask=None, chunk=128):
    """mlx-lm's recurrent_gla (q, k, v (B, heads, T, dim)): with a state and no mask, T <= DECODE_ROWS tokens one
    at a time (its one-token step), else as it is."""
    gla, tokens = mlx_lm_recurrent_gla(), q.shape[2]
    if tokens == 1 or prompt_tokens(tokens) or h is None or mask is not None:
        return gla(q, k, v, g, scale=scale, h=h, mask=mask, chunk=chunk)
    return _stepped(lambda t, s: gla(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], g, scale=scale, h=s),
                    tokens, 2, h)


class StepwiseJambaMixer(jamba.JambaMambaMixer):
    def ssm_step(self, x: mx.array, A: mx.array, state: mx.array | None = None):
        """mlx-lm's ssm_step ((B, T, inner) -> y, last state) on one token at a time, for T <= DECODE_ROWS with a state."""
        whole = super().ssm_step
        return _stepped_with_state(lambda x, s: whole(x, A, s), x, state)


def _stepped_with_state(whole, x: mx.array, state):
    """whole(x, state) -> (y, state) of a (B, T, ...) input: the tokens of a decoding pass that continue a state one
    at a time, else whole (one token, a prompt chunk: passes.prompt_tokens)."""
    tokens = x.shape[1]
    if tokens == 1 or prompt_tokens(tokens) or state is None:
        return whole(x, state)
    return _stepped(lambda t, s: whole(x[:, t : t + 1], s), tokens, 1, state)


class StepwiseRGLRU(recurrent_gemma.RGLRU):
    """RecurrentGemma's RG-LRU: its gates are block-diagonal matmuls over the tokens (`h @ w`, per head)."""

    def __call__(self, x: mx.array, cache=None):
        whole = super().__call__
        return _stepped_with_state(lambda x, s: whole(x, cache=s), x, cache)


class StepwiseGriffinConv(recurrent_gemma.Conv1d):
    """RecurrentGemma's temporal conv: a grouped `conv_general` over the tokens."""

    def __call__(self, x: mx.array, cache=None):
        whole = super().__call__
        return _stepped_with_state(lambda x, s: whole(x, cache=s), x, cache)


GPU_STEPS = {jamba.JambaMambaMixer: StepwiseJambaMixer, recurrent_gemma.RGLRU: StepwiseRGLRU,
             recurrent_gemma.Conv1d: StepwiseGriffinConv}


def use_ssm_steps(model: nn.Module, gpu: bool = False) -> dict:
    """Route the model's ssm_update calls (its Mamba-2 mixers) to stepwise_ssm_update and recurrent_gla's (Bailing's
    lightning attention) to stepwise_recurrent_gla; on GPUs Jamba's mixers and RecurrentGemma's RG-LRUs and convs
    step (GPU_STEPS)."""
    routes = {NAME: (mlx_lm_ssm_update(), stepwise_ssm_update),
              "recurrent_gla": (mlx_lm_recurrent_gla(), stepwise_recurrent_gla)}
    report = {"kernel": "ssm_steps", "stepped": 0, "routed": route_functions(model, routes)}
    for _, m in model.named_modules():
        if gpu and type(m) in GPU_STEPS:
            m.__class__ = GPU_STEPS[type(m)]  # same parameters, same names
            report["stepped"] += 1
    return report


def restore_ssm_steps(model: nn.Module) -> None:
    unroute_functions(model, [NAME, "recurrent_gla"])
    for _, m in model.named_modules():
        if type(m) in GPU_STEPS.values():
            m.__class__ = type(m).__mro__[1]
