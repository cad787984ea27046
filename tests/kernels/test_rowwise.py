"""kernels/rowwise.py: MoE routers that multiply by a raw weight, and unquantized experts, run one token at a time
(on GPUs)."""

from __future__ import annotations

import contextlib

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import deepseek_v2, glm4_moe
from mlx_lm.models.switch_layers import SwitchGLU, SwitchMLP

from mlxspec.kernels.rowwise import raw_weight_gate, restore_rowwise_gates, unquantized_experts, use_rowwise_gates


class Holder(nn.Module):
    def __init__(self, gate):
        super().__init__()
        self.gate = gate


@contextlib.contextmanager
def whole_calls(module: nn.Module):
    """The shapes of each call the swapped module makes to its base class's call (one tuple of shapes a call)."""
    calls, cls = [], type(module)
    whole = cls._whole
    cls._whole = lambda self, *args: calls.append(tuple(a.shape for a in args)) or whole(self, *args)
    try:
        yield calls
    finally:
        cls._whole = whole


def deepseek_gate(method: str = "greedy") -> nn.Module:
    args = deepseek_v2.ModelArgs(model_type="deepseek_v2", hidden_size=32, n_routed_experts=8, num_experts_per_tok=2,
                                 topk_method=method, n_group=2, topk_group=1, routed_scaling_factor=1.5)
    gate = deepseek_v2.MoEGate(args)
    gate.weight = mx.random.normal((8, 32), key=mx.random.key(0))
    return gate


def test_routers_with_a_raw_weight_are_found_and_others_are_not():
    assert raw_weight_gate(deepseek_v2.MoEGate) and raw_weight_gate(glm4_moe.MoEGate)
    assert not raw_weight_gate(nn.Linear) and not raw_weight_gate(nn.QuantizedLinear)

    class FeatureGate(nn.Module):  # named like a gate, but a Linear layer inside
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def __call__(self, x):
            return self.proj(x)

    assert not raw_weight_gate(FeatureGate)


def test_one_token_at_a_time_gives_the_gate_s_own_routing_and_comes_off_again(cpu_ext):  # the CPU: the same bits
    for method in ("greedy", "group_limited_greedy"):
        model = Holder(deepseek_gate(method))
        x = mx.random.normal((1, 5, 32), key=mx.random.key(1))
        want = model.gate(x)
        assert use_rowwise_gates(model) == 1 and type(model.gate).__name__ == "RowwiseMoEGate"
        assert use_rowwise_gates(model) == 0  # already swapped
        with whole_calls(model.gate) as calls:
            got = model.gate(x)
        assert calls == [((1, 1, 32),)] * 5  # each token alone
        for g, w in zip(got, want):  # inds (1, 5, 2), scores (1, 5, 2): on the CPU, the same bits
            assert g.shape == w.shape and mx.array_equal(g, w).item()
        restore_rowwise_gates(model)
        assert type(model.gate) is deepseek_v2.MoEGate


def test_a_prompt_chunk_runs_the_gate_whole(cpu_ext):
    model = Holder(deepseek_gate())
    use_rowwise_gates(model)
    with whole_calls(model.gate) as calls:
        model.gate(mx.random.normal((1, 100, 32), key=mx.random.key(2)))
    assert calls == [((1, 100, 32),)]


def test_unquantized_experts_run_one_token_at_a_time_with_a_one_token_step_s_shapes(cpu_ext):
    """A float MoE's SwitchGLU (gather_mm, which a verify pass of 8 tokens x 8 experts even sorts by expert): each
    token's call has a one-token step's shapes, x (1, 1, hidden) and indices (1, 1, k); the result is the whole
    call's (..., T, k, out). Quantized experts keep their gather kernel (layers.py)."""
    mx.random.seed(0)
    for mlp in (SwitchGLU(32, 48, 8), SwitchMLP(32, 48, 8)):
        model = Holder(mlp)
        x = mx.random.normal((1, 8, 32), key=mx.random.key(3))
        inds = mx.random.randint(0, 8, (1, 8, 8), key=mx.random.key(4))  # 64 (token, expert) pairs: sorted whole
        want = model.gate(x, inds)
        assert unquantized_experts(model.gate) and use_rowwise_gates(model) == 1
        with whole_calls(model.gate) as calls:
            got = model.gate(x, inds)
        assert calls == [((1, 1, 32), (1, 1, 8))] * 8
        assert got.shape == want.shape == (1, 8, 8, 32) and mx.allclose(got, want, atol=1e-5).item()
        restore_rowwise_gates(model)
        assert type(model.gate) in (SwitchGLU, SwitchMLP)
    quantized = Holder(SwitchGLU(64, 64, 4))
    nn.quantize(quantized, group_size=32, bits=4)
    assert not unquantized_experts(quantized.gate) and use_rowwise_gates(quantized) == 0
