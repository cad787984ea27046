"""Unquantized layers through a dense kernel (on GPUs): swap, self-check, restore, per model.

No GPU here: the registry is given a stand-in kernel for this test (a row-by-row float32 matmul,
row-invariant by construction) and a wrong one; on a device the real one is checked the same way.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from mlxspec.kernels import dense, registry
from mlxspec.loading import load


def rowwise(x, w):
    rows = x.reshape(-1, x.shape[-1])
    out = mx.concatenate([(rows[i : i + 1].astype(mx.float32) @ w.astype(mx.float32).T) for i in range(rows.shape[0])])
    return out.astype(x.dtype).reshape(*x.shape[:-1], w.shape[0])


@pytest.fixture
def with_kernel(monkeypatch):
    def use(fn):
        registry.reset()
        monkeypatch.setitem(registry._loaders, "dense", lambda backend: (fn, "stand-in"))

    yield use
    registry.reset()


def test_tied_unquantized_model_swaps_linears_and_head_and_restores(tiny_qwen2, with_kernel):
    with_kernel(rowwise)
    model = load(str(tiny_qwen2)).model
    ids = mx.array([[3, 9, 27, 4]])
    before = model(ids)
    report = dense.use_dense_kernels(model)
    linears = {p for p, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert set(report["swapped"]) == linears | {"model.embed_tokens"} and not report["kept"]
    assert isinstance(model.model.embed_tokens, dense.KernelEmbedding)
    assert mx.allclose(model(ids), before, atol=1e-5, rtol=1e-5).item()
    dense.restore_dense(model)
    assert not any(isinstance(m, (dense.KernelLinear, dense.KernelEmbedding)) for _, m in model.named_modules())
    assert mx.array_equal(model(ids), before).item()


def test_a_row_dependent_kernel_fails_its_check_and_is_kept_out(tiny_llama, with_kernel):
    with_kernel(lambda x, w: rowwise(x, w) * (1 + 2**-20 * (x.reshape(-1, x.shape[-1]).shape[0] > 1)))
    model = load(str(tiny_llama)).model
    report = dense.use_dense_kernels(model)
    assert not report["swapped"] and all("differs from the 1-row call" in why for why in report["kept"].values())


def test_cpu_has_no_dense_kernel():
    registry.reset()
    assert "not needed on the CPU" in registry.kernel("dense", "cpu").error
