"""Mamba-2 mixers (Granite 4.0-H here) verified one token at a time: mlx-lm's SSD pass over several tokens
sums in another order than one-token steps, so speculation was not exact on the CPU either; routed per
model, a verify pass's rows are one-row steps' bits."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxspec.engine import Engine
from mlxspec.exactness import RowInvariance
from mlxspec.kernels.hooks import routed
from mlxspec.kernels.ssm_steps import mlx_lm_ssm_update, restore_ssm_steps, stepwise_ssm_update, use_ssm_steps
from mlxspec.loading import load
from model_factory import make_model_dir
from speculation_checks import assert_drafts_keep_plain_tokens

PROMPTS = ["the world and the world and the world and the", "def add(a, b):"]


@pytest.fixture(scope="module")
def granite(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("granite-h"), "granitemoehybrid", layers=4, seed=1)


def inputs(tokens: int, seed: int = 0):
    keys = mx.random.split(mx.random.key(seed), 6)
    x = mx.random.normal((1, tokens, 8, 16), key=keys[0])
    B, C = (mx.random.normal((1, tokens, 1, 16), key=keys[i]) for i in (1, 2))
    dt = mx.random.normal((1, tokens, 8), key=keys[3])
    A_log, state = mx.random.normal((8,), key=keys[4]), mx.random.normal((1, 8, 16, 16), key=keys[5])
    return x, A_log, B, C, mx.ones((8,)), dt, mx.zeros((8,)), state


def test_a_verify_call_is_its_one_token_calls():
    x, A_log, B, C, D, dt, dt_bias, state = inputs(5)
    y, s = stepwise_ssm_update(x, A_log, B, C, D, dt, dt_bias, state)
    s1, rows = state, []
    for t in range(5):
        yt, s1 = mlx_lm_ssm_update()(x[:, t : t + 1], A_log, B[:, t : t + 1], C[:, t : t + 1], D, dt[:, t : t + 1],
                                     dt_bias, s1)
        rows.append(yt)
    assert mx.array_equal(y, mx.concatenate(rows, axis=1)).item() and mx.array_equal(s, s1).item()
    ssd, ssd_state = mlx_lm_ssm_update()(x, A_log, B, C, D, dt, dt_bias, state)  # mlx-lm's own: close, other bits
    assert mx.allclose(y, ssd, atol=1e-4).item() and not mx.array_equal(y, ssd).item()
    assert mx.allclose(s, ssd_state, atol=1e-4).item()


def test_routed_per_model_makes_speculation_exact(granite):
    model = load(str(granite)).model
    assert not RowInvariance(model).holds(4)  # mlx-lm's SSD pass: rows differ from one-row steps
    assert use_ssm_steps(model)["routed"] == 2  # its two Mamba-2 mixers
    assert RowInvariance(model).holds(8)
    other = load(str(granite)).model
    assert not any(routed(m, "ssm_update") for _, m in other.named_modules())  # per model
    restore_ssm_steps(model)
    assert not any(routed(m, "ssm_update") for _, m in model.named_modules())


def test_greedy_speculation_on_granite_h_is_plain_decoding(granite):
    plain, drafted = Engine.load(str(granite)), Engine.load(str(granite), drafter="lookup")
    assert drafted.kernels["target"]["ssm_steps"]["routed"] == 2
    assert drafted.kernels["target"]["delta"]["convs"] == 2  # their convs (with a bias) run the conv family too
    assert_drafts_keep_plain_tokens(plain, drafted, PROMPTS, 32, lengths=(2, 4))
