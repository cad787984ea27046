"""Prompt chunks on GPUs take MLX's ops; decoding passes the row-invariant kernels (kernels/passes.py).
No GPU here: stand-in CUDA kernels that record their calls (gpu_stand_ins.py, conftest.pretend_cuda)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx_lm.models.base as base

from model_factory import build_model
from mlxspec.kernels import attention, dense, layers, registry
from mlxspec.kernels.passes import DECODE_ROWS
from mlxspec.kernels.projections import join_projections
from mlxspec.loading import load
from mlxspec.options import MAX_DRAFT_LENGTH, GenerateOptions
from mlxspec.tree import MAX_TREE_NODES

QWEN3_MOE = {"model_type": "qwen3_moe", "num_hidden_layers": 2, "vocab_size": 96, "hidden_size": 64,
             "intermediate_size": 128, "moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2,
             "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
             "max_position_embeddings": 512, "tie_word_embeddings": False}
LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "tie_word_embeddings": False}


def test_every_decoding_pass_fits_within_decode_rows():
    assert MAX_TREE_NODES + 1 <= DECODE_ROWS  # a tree's drafts and its root
    assert MAX_DRAFT_LENGTH + 1 <= DECODE_ROWS  # a chain's drafts and the bonus row
    GenerateOptions(draft_length=MAX_DRAFT_LENGTH).validate()


def test_quantized_layers_run_prompt_chunks_through_mlx_and_decoding_passes_through_the_kernel(pretend_cuda):
    model = build_model(LLAMA, seed=4)
    nn.quantize(model, group_size=32, bits=4)
    chunk = (mx.arange(DECODE_ROWS + 1) % 96)[None]
    want = model(chunk)  # MLX's ops throughout
    layers.use_kernels(model, gpu=True, device=mx.cpu)
    assert join_projections(model, mx.cpu) == 2 * 2
    pretend_cuda.clear()
    assert mx.array_equal(model(chunk), want).item() and not pretend_cuda  # bit for bit MLX's, no kernel call
    model(chunk[:, :DECODE_ROWS])  # the largest decoding pass: every matmul through the kernel
    assert len(pretend_cuda) == 2 * 4 + 1  # qkv, o, gate/up, down a block; the head


def test_a_short_prompt_read_by_prefill_takes_mlx_s_ops_too(pretend_cuda):
    """cache.prefill marks its forwards as a prompt's (passes.prompt_pass): a 5-token prompt's layers take MLX's ops
    on a GPU as a long one does (bit for bit), the same 5 rows outside it the kernels."""
    from mlxspec.cache import new_cache, prefill

    model = build_model(LLAMA, seed=4)
    nn.quantize(model, group_size=32, bits=4)
    prompt = [3, 14, 15, 92, 65]
    want = new_cache(model)
    prefill(model, want, prompt)  # MLX's ops throughout
    layers.use_kernels(model, gpu=True, device=mx.cpu)
    pretend_cuda.clear()
    cache = new_cache(model)
    prefill(model, cache, prompt)
    assert not pretend_cuda and all(mx.array_equal(a.state[0], b.state[0]).item() for a, b in zip(cache, want))
    mx.eval(model(mx.array([prompt]), cache=new_cache(model)))  # a decoding pass's 5 rows
    assert len(pretend_cuda) == 2 * 7 + 1


def test_experts_count_a_passes_tokens_by_the_models_top_k(pretend_cuda):
    """A prompt chunk's (token, expert) pairs take MLX's gather_qmm (sorted by expert there); the
    largest decoding pass's pairs (sorted too: 128 of them) the gather kernel."""
    model = build_model(QWEN3_MOE, seed=5)
    nn.quantize(model, group_size=32, bits=4)
    chunk = (mx.arange(DECODE_ROWS + 1) % 96)[None]
    want = model(chunk)
    layers.use_kernels(model, gpu=True, device=mx.cpu)
    experts = [m for _, m in model.named_modules() if isinstance(m, layers.KernelQuantizedSwitchLinear)]
    assert len(experts) == 2 * 3 and all(m._top_k == 2 for m in experts)
    pretend_cuda.clear()
    assert mx.array_equal(model(chunk), want).item() and not pretend_cuda
    mx.eval(model(chunk[:, :DECODE_ROWS]))
    assert sum(kind == "gather" for kind, _ in pretend_cuda) == 2 * 3


def test_the_cpu_kernels_keep_prompt_chunks(cpu_ext):
    model = build_model(LLAMA, seed=4)
    nn.quantize(model, group_size=32, bits=4)
    layers.use_kernels(model, device=mx.cpu)
    calls = []
    for _, m in model.named_modules():
        if isinstance(m, layers.KernelQuantizedLinear):
            m._qmm = lambda x, *a, qmm=m._qmm, **kw: calls.append(x.shape) or qmm(x, *a, **kw)
    mx.eval(model((mx.arange(DECODE_ROWS + 1) % 96)[None]))
    assert len(calls) == 2 * 7 + 1 and all(shape[-2] == DECODE_ROWS + 1 for shape in calls)


def test_dense_layers_run_prompt_chunks_through_mlx(tiny_qwen2, monkeypatch):
    calls = []

    def rowwise(x, w):
        calls.append(x.shape)
        rows = x.reshape(-1, x.shape[-1]).astype(mx.float32)
        return (rows @ w.astype(mx.float32).T).astype(x.dtype).reshape(*x.shape[:-1], w.shape[0])

    registry.reset()
    monkeypatch.setitem(registry._loaders, "dense", lambda backend: (rowwise, "stand-in"))
    try:
        model = load(str(tiny_qwen2)).model
        chunk = (mx.arange(DECODE_ROWS + 1) % 50)[None]
        want = model(chunk)
        assert dense.use_dense_kernels(model)["swapped"]
        calls.clear()
        assert mx.array_equal(model(chunk), want).item() and not calls
        model(chunk[:, :3])
        assert calls and all(shape[-2] == 3 for shape in calls)
    finally:
        registry.reset()


def test_gpu_attention_leaves_prompt_chunks_to_mlx(monkeypatch):
    calls = []

    def kernel(q, k, v, scale, causal, **kw):
        calls.append(q.shape[2])
        return attention.attention_reference(q, k, v, scale, causal)

    signature = (4, 2, 32, 32, str(mx.float32))
    keys = mx.random.normal((1, 2, DECODE_ROWS + 9, 32), key=mx.random.key(1))
    q = mx.random.normal((1, 4, DECODE_ROWS + 1, 32), key=mx.random.key(2))
    for backend, kernel_rows in (("cuda", [DECODE_ROWS]), ("cpu", [DECODE_ROWS + 1, DECODE_ROWS])):
        calls.clear()
        rec = registry.KernelRecord("sdpa", backend, fn=kernel, checks={signature: None})
        monkeypatch.setattr(attention, "_record", lambda rec=rec: rec)
        chunk = attention.few_row_attention(q, keys, keys, None, scale=0.2, mask="causal")
        attention.few_row_attention(q[:, :, 1:], keys, keys, None, scale=0.2, mask="causal")
        assert calls == kernel_rows, backend  # a GPU leaves the chunk to MLX; the CPU kernel takes both
        if backend == "cuda":
            assert mx.array_equal(chunk, base.scaled_dot_product_attention(q, keys, keys, None, scale=0.2,
                                                                           mask="causal")).item()
