"""Whole K-quant GGUF models through load_gguf: logits against the numpy reference, the conversion
report `show` prints, and the memory the load takes.

The files mix types as llama.cpp's Q4_K_M does (Q4_K with Q5_K/Q6_K, Q5_0/Q5_1 fallbacks, a Q8_0 or
Q6_K head). Rows are 256 wide, the K-quant super-block.
"""

from __future__ import annotations

import tracemalloc

import gguf
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

import gguf_fixtures as fx
from gguf_fixtures import Dims, write_tiny_llama_gguf
from gguf_reference import Hparams, dequantized_weights, forward
from mlxspec import gguf_quants
from mlxspec.gguf import load_gguf

DIMS = Dims(hidden=256, ffn=512, heads=4, kv_heads=2)
HP = Hparams(arch="llama", hidden=256, heads=4, kv_heads=2, head_dim=64, eps=fx.RMS_EPS)
TOKENS = [5, 77, 271, 12, 9, 150, 44, 260, 3, 88]
# Every block tensor Q4_K unless named; both files untied.
EXACT_MIX = {"token_embd.weight": "Q4_K", "output.weight": "Q8_0", "blk.0.attn_v.weight": "Q5_K",
             "blk.1.attn_v.weight": "Q5_K", "blk.0.ffn_gate.weight": "Q5_0", "blk.1.ffn_up.weight": "Q5_1",
             "blk.0.ffn_down.weight": "Q5_K", "blk.1.attn_output.weight": "Q4_0", "blk.1.ffn_gate.weight": "Q4_1"}
REQUANTIZED_MIX = {"output.weight": "Q6_K", "blk.0.ffn_down.weight": "Q6_K", "blk.1.attn_v.weight": "Q3_K",
                   "blk.1.ffn_gate.weight": "Q2_K", "blk.0.attn_v.weight": "Q5_K"}


def write(tmp_path, name, mix):
    types = {k: v for k, v in mix.items() if k not in ("token_embd.weight", "output.weight")}
    return write_tiny_llama_gguf(tmp_path / name, "Q4_K", seed=4, dims=DIMS, embed_qtype=mix.get("token_embd.weight"),
                                 output_qtype=mix["output.weight"], type_overrides=types)


def logits(model, tokens):
    return np.array(model(mx.array([tokens])).astype(mx.float32))[0]


def loaded_weights(model, gguf_names) -> dict[str, np.ndarray]:
    """The weights the loaded MLX model multiplies by, dequantized by MLX, under their GGUF names."""
    params = dict(tree_flatten(model.parameters()))
    out = {}
    for name in gguf_names:
        stem = fx._mlx_name(name).rsplit(".", 1)[0]
        w = params[f"{stem}.weight"]
        if f"{stem}.scales" in params:
            s, b = params[f"{stem}.scales"].astype(mx.float32), params[f"{stem}.biases"].astype(mx.float32)
            w = mx.dequantize(w, s, b, group_size=32, bits=w.shape[-1] // s.shape[-1])
        out[name] = np.array(w.astype(mx.float32))
    return out


def test_exact_k_quant_model_matches_reference(tmp_path):
    path = write(tmp_path, "q4_k_m.gguf", EXACT_MIX)
    model, _, config = load_gguf(path)
    reference = forward(dequantized_weights(path), HP, TOKENS)
    np.testing.assert_allclose(logits(model, TOKENS), reference, atol=5e-5, rtol=0)

    summary = config["gguf_conversion"]
    assert summary["requantized"] == {}
    assert summary["exact"] == {"Q4_K": 8, "Q5_K": 3, "Q5_0": 1, "Q5_1": 1, "Q4_0": 1, "Q4_1": 1, "Q8_0": 1,
                                "F32": 5}
    q = config["quantization"]
    assert (q["bits"], q["group_size"]) == (4, 32) and q["model.layers.0.self_attn.v_proj"]["bits"] == 5
    assert q["lm_head"]["bits"] == 8


def test_requantized_tensors_reported_and_the_rest_exact(tmp_path):
    path = write(tmp_path, "mixed.gguf", REQUANTIZED_MIX)
    model, _, config = load_gguf(path)
    source = dequantized_weights(path)
    got = logits(model, TOKENS)

    # The model computes exactly with the weights it holds (the numpy forward over them agrees) ...
    np.testing.assert_allclose(got, forward(loaded_weights(model, source), HP, TOKENS), atol=5e-5, rtol=0)
    # ... which are gguf-py's own, except the requantized tensors, whose errors are the reported ones.
    held = loaded_weights(model, source)
    report = config["gguf_conversion"]["requantized"]
    assert set(report) == {"output.weight", "blk.0.ffn_down.weight", "blk.1.attn_v.weight", "blk.1.ffn_gate.weight"}
    for name, weights in held.items():
        err = weights - source[name]
        if name in report:
            assert report[name]["max_error"] == pytest.approx(np.abs(err).max(), rel=1e-5)
            assert 0 < report[name]["rms_error"] <= report[name]["source_rms"]
        else:
            assert np.array_equal(weights, source[name]), name

    # Against the file's own dequantized weights the logits move by about that error, no more.
    drift = np.abs(got - forward(source, HP, TOKENS)).max()
    assert drift < 0.05 * np.abs(got).max(), drift


def test_load_converts_tensor_by_tensor(tmp_path, monkeypatch):
    """Neither numpy (the conversion's scratch) nor MLX ever holds a second copy of the model."""
    path = write(tmp_path, "mixed.gguf", REQUANTIZED_MIX)
    monkeypatch.setattr(gguf_quants, "CHUNK_WEIGHTS", 256 * 8)
    monkeypatch.setattr(gguf_quants, "THREADS", 2)  # scratch: a chunk per thread
    load_gguf(path)  # warm imports and caches
    mx.clear_cache()
    mx.reset_peak_memory()
    before = mx.get_active_memory()  # arrays other tests left alive (session fixtures) count in the peak
    tracemalloc.start()
    model, _, _ = load_gguf(path)
    numpy_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    model_bytes = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    # numpy scratch and Python objects (tracemalloc sees both; measured 381 kB) stay under one
    # tensor in float32, while the whole model as float32 would be 5 MB
    largest = max(int(np.prod(t.shape)) for t in gguf.GGUFReader(str(path)).tensors) * 4
    assert numpy_peak < largest < model_bytes, (numpy_peak, largest, model_bytes)
    assert mx.get_peak_memory() - before < 1.3 * model_bytes, (mx.get_peak_memory(), before, model_bytes)


def test_k_quant_mixture_of_experts(tmp_path):
    """A qwen3moe file as Ollama's Q4_K_M lays it out: Q4_K experts and attention, a Q6_K down
    projection (requantized, reported) beside a Q5_K one, F32 routers; the stacked experts convert
    expert by expert, and the logits follow the weights held."""
    dims = Dims(hidden=256, heads=4, kv_heads=2, experts=4, experts_used=2, expert_ffn=256)
    hp = Hparams(arch="qwen3moe", hidden=256, heads=4, kv_heads=2, head_dim=64, eps=fx.RMS_EPS)
    mix = {"blk.0.ffn_down_exps.weight": "Q5_K", "blk.1.ffn_down_exps.weight": "Q6_K"}
    path = write_tiny_llama_gguf(tmp_path / "moe.gguf", "Q4_K", seed=5, arch="qwen3moe", dims=dims,
                                 output_qtype="Q6_K", type_overrides=mix)
    model, _, config = load_gguf(path)
    source = dequantized_weights(path)
    held = loaded_weights(model, [n for n in source if not n.endswith("norm.weight")])
    assert set(config["gguf_conversion"]["requantized"]) == {"output.weight", "blk.1.ffn_down_exps.weight"}
    assert np.array_equal(held["blk.0.ffn_gate_exps.weight"], source["blk.0.ffn_gate_exps.weight"])
    assert np.array_equal(held["blk.0.ffn_down_exps.weight"], source["blk.0.ffn_down_exps.weight"])
    assert config["quantization"]["model.layers.0.mlp.switch_mlp.down_proj"]["bits"] == 5
    got = logits(model, TOKENS)
    np.testing.assert_allclose(got, forward(source | held, hp, TOKENS), atol=5e-5, rtol=0)
