"""Joined projections on GPUs (kernels/projections.py), on this CPU with stand-in CUDA kernels: a
llama block's q/k/v and gate/up run as one launch each, logits unchanged, no extra weight memory,
and every part computes its own rows again once unjoined."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from model_factory import build_model
from mlxspec.kernels import layers
from mlxspec.kernels.projections import SharedProjection, join_projections, unjoin_projections

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "tie_word_embeddings": False}


def quantized_llama(bits: int = 4):
    model = build_model(LLAMA, seed=4)
    nn.quantize(model, group_size=32, bits=bits)
    return model


def weight_bytes(model) -> int:
    return sum(v.nbytes for _, v in nn.utils.tree_flatten(model.parameters()))


def test_joined_projections_launch_once_and_keep_the_logits(pretend_cuda):
    model = quantized_llama()
    tokens = mx.array([[5, 17, 2, 40, 33]])
    want, before = model(tokens), weight_bytes(model)
    layers.use_kernels(model, gpu=True, device=mx.cpu)
    pretend_cuda.clear()
    model(tokens)
    assert len(pretend_cuda) == 2 * 7 + 1  # q, k, v, o, gate, up, down a block; the head
    assert join_projections(model, mx.cpu) == 2 * 2  # q/k/v and gate/up in each block
    assert model.model.layers[0].mlp.up_proj._shared.kernel.startswith("cuda (stand-in")  # what the launch runs
    mx.eval(model.parameters())
    assert weight_bytes(model) == before  # the parts' parameters are row slices of the joined matrices
    pretend_cuda.clear()
    got = model(tokens)
    assert len(pretend_cuda) == 2 * 4 + 1  # qkv, o, gate/up, down a block; the head
    assert mx.allclose(got, want, atol=1e-4, rtol=1e-4).item()
    assert join_projections(model, mx.cpu) == 0  # already joined
    unjoin_projections(model)
    pretend_cuda.clear()
    assert mx.allclose(model(tokens), want, atol=1e-4, rtol=1e-4).item()
    assert len(pretend_cuda) == 2 * 7 + 1


def test_a_shared_projection_computes_once_per_input():
    calls = []

    def qmm(x, *args, **kw):
        calls.append(x)
        return x * 2

    shared = SharedProjection(qmm, None, None, None, 32, 4, {})
    x, other = mx.ones((1, 4)), mx.ones((1, 4))
    assert shared(x) is shared(x) and len(calls) == 1
    shared(other)  # equal values, another input: computed again
    assert len(calls) == 2


def test_parts_of_different_layouts_stay_apart(pretend_cuda):
    model = quantized_llama()
    for block in model.model.layers:  # k_proj at 8 bits: q/k/v cannot share one matrix
        block.self_attn.k_proj = nn.QuantizedLinear.from_linear(
            nn.Linear(64, 32, bias=False), group_size=32, bits=8)
    layers.use_kernels(model, gpu=True, device=mx.cpu)
    assert join_projections(model, mx.cpu) == 2  # gate/up only
    assert all(block.self_attn.q_proj._shared is None for block in model.model.layers)


def test_install_joins_on_gpus_and_remove_unjoins(pretend_cuda, monkeypatch):
    from mlxspec.kernels import install

    monkeypatch.setattr(install, "device_backend_name", lambda device=None: "cuda")
    model = quantized_llama()
    tokens = mx.array([[5, 17, 2]])
    want = model(tokens)
    report = install.install_kernels(model, mx.cpu)
    assert report["joined_projections"] == 4
    assert mx.allclose(model(tokens), want, atol=1e-4, rtol=1e-4).item()
    install.remove_kernels(model)  # MLX's ops over the joined matrices' row slices
    assert not install.installed(model) and mx.allclose(model(tokens), want, atol=1e-4, rtol=1e-4).item()
    assert install.install_kernels(model, mx.cpu)["joined_projections"] == 4  # and joined again


def test_joined_projections_keep_verify_rows_equal_to_one_row_steps(pretend_cuda):
    """M-row forwards equal one-row steps bit for bit with the joined launches (the stand-in kernels are
    row-invariant): each step's parts read that step's launch, never an earlier one's."""
    from mlxspec.exactness import RowInvariance

    model = quantized_llama()
    layers.use_kernels(model, gpu=True, device=mx.cpu)
    assert join_projections(model, mx.cpu) == 4
    check = RowInvariance(model)
    assert check.holds(6), check.failures()
