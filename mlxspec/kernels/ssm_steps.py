"""Mamba-2 layers (Granite 4.0-H, Nemotron-H, Falcon-H1, PLaMo 2, Mamba-2) verified one token at a time.

mlx-lm's `ssm_update` computes a call of several tokens as SSD does: a T x T "attention" matrix of decays
and C.B products, plus the carried state's contribution, summed in another order than T calls of one
token (on Apple GPUs one token even runs a Metal kernel of its own). So a verify pass's rows were not a
one-row step's bits, on the CPU too (`exactness.RowInvariance` measured it: `exact: false` on Granite
4.0-H). Routed per model (hooks.py), a call of up to DECODE_ROWS tokens that continues a state goes
through the same function one token at a time, so every row is a one-row step; prompt chunks (longer,
or without a state) keep the SSD pass, whose speed they need.

    report = use_ssm_steps(model)   # {"routed": modules}
    restore_ssm_steps(model)
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .hooks import route_functions, unroute_functions
from .passes import DECODE_ROWS

NAME = "ssm_update"


def mlx_lm_ssm_update():
    from mlx_lm.models import ssm

    return ssm.ssm_update


def stepwise_ssm_update(hidden_states, A_log, B, C, D, dt, dt_bias, state=None, time_step_limit=(0.001, 100.0),
                        mask=None, lengths=None):
    """mlx-lm's ssm_update (same arguments, same results as its one-token calls): (batch, T, heads, head
    dim) inputs with a state, T <= DECODE_ROWS, one sequence, go one token at a time."""
    update = mlx_lm_ssm_update()
    tokens = hidden_states.shape[1]
    if tokens == 1 or tokens > DECODE_ROWS or state is None or mask is not None or lengths is not None:
        return update(hidden_states, A_log, B, C, D, dt, dt_bias, state, time_step_limit, mask, lengths)
    ys = []
    for t in range(tokens):
        y, state = update(hidden_states[:, t : t + 1], A_log, B[:, t : t + 1], C[:, t : t + 1], D, dt[:, t : t + 1],
                          dt_bias, state, time_step_limit)
        ys.append(y)
    return mx.concatenate(ys, axis=1), state


def use_ssm_steps(model: nn.Module) -> dict:
    """Route the model's ssm_update calls (its Mamba-2 mixers) to stepwise_ssm_update."""
    return {"kernel": "ssm_steps", "routed": route_functions(model, {NAME: (mlx_lm_ssm_update(), stepwise_ssm_update)})}


def restore_ssm_steps(model: nn.Module) -> None:
    unroute_functions(model, [NAME])
