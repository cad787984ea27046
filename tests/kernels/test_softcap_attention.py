"""Gemma 2's capped attention scores through the few-row attention kernel (kernels/softcap_attention.py)."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models import gemma2

from gguf_fixtures import Dims, write_tiny_llama_gguf
from model_factory import build_model
from mlxspec.cache import new_cache
from mlxspec.engine import Engine
from mlxspec.kernels.attention import self_check
from mlxspec.kernels.install import install_kernels, remove_kernels
from mlxspec.kernels.softcap_attention import SoftcapAttention
from speculation_checks import assert_drafts_keep_plain_tokens

GEMMA2 = {"model_type": "gemma2", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
          "vocab_size": 96, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 30.0,
          "query_pre_attn_scalar": 32}


def test_the_cpu_kernel_caps_scores_and_a_kernel_that_ignores_the_cap_fails_its_check(cpu_ext):
    from mlxspec.kernels.cpu import cpu_sdpa_function

    fn = cpu_sdpa_function()
    assert fn.softcaps and self_check(fn, 4, 2, 32, 32, mx.float32) is None

    def uncapped(*args, softcap=0.0, **kw):
        return fn(*args, **kw)

    uncapped.windows = uncapped.sinks = uncapped.mixed = uncapped.lengths = uncapped.softcaps = True
    assert "softcap" in self_check(uncapped, 4, 2, 32, 32, mx.float32)


def test_gemma2_attention_runs_the_kernel_with_mlx_lm_s_logits(cpu_ext):
    model = build_model(GEMMA2, seed=2, scale=1.5)  # large weights: scores reach the cap's curve
    tokens = mx.array([[3, 17, 40, 9, 71, 12, 5, 60]])
    want = model(tokens, cache=new_cache(model))
    report = install_kernels(model, fuse=False)
    assert report["attention"]["softcapped"] == 2
    assert all(type(layer.self_attn) is SoftcapAttention for layer in model.model.layers)
    got = model(tokens, cache=new_cache(model))
    assert mx.allclose(got, want, atol=2e-4, rtol=2e-4).item()
    remove_kernels(model)
    assert all(type(layer.self_attn) is gemma2.Attention for layer in model.model.layers)
    assert mx.array_equal(model(tokens, cache=new_cache(model)), want).item()


def test_greedy_speculation_on_gemma2_is_plain_decoding(tmp_path, cpu_ext):
    path = write_tiny_llama_gguf(tmp_path / "g2.gguf", "Q8_0", arch="gemma2", dims=Dims(head_dim=32), tokenizer="llama",
                                 metadata={"attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0})
    plain, lookup = Engine.load(str(path)), Engine.load(str(path), drafter="lookup")
    assert plain.kernels["target"]["attention"]["softcapped"] == len(plain.target.model.model.layers)
    prompts = ["the cat sat on the mat and the cat sat on the", "one two three one two three one"]
    assert_drafts_keep_plain_tokens(plain, lookup, prompts, 24)
