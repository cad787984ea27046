"""Gemma 4 GGUFs (llama.cpp's "gemma4") on mlx-lm's gemma4_text, against llama.cpp itself where it is installed.

Three tiny shapes (tests/gguf_gemma4_fixtures.py): E2B-style (sliding and global layers of two head sizes, the
global ones' partial rope through rope_freqs, KV-shared last layers with a double-wide MLP, per-layer inputs),
31B-style (no per-layer inputs, global layers whose values are their keys, with their own KV head count) and
26B-A4B-style (the 31B's attention, a router and 8 experts beside each layer's MLP, top 2).
"""

from __future__ import annotations

from dataclasses import replace

import gguf
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from gguf_gemma4_fixtures import Gemma4, gemma4_vocab, write_tiny_gemma4_gguf
from mlx_lm.models.cache import make_prompt_cache
from mlxspec.engine import Engine
from mlxspec.errors import ModelLoadError
from mlxspec.gguf import load_gguf
from speculation_checks import assert_drafts_keep_plain_tokens

TOKENS = [5, 77, 271, 12, 9, 150, 44, 260, 3, 88, 199, 31]
SHAPES = {"e2b": Gemma4(), "31b": Gemma4(per_layer=0, shared=0, k_eq_v=True, global_kv_heads=2),
          "26b-a4b": Gemma4(per_layer=0, shared=0, k_eq_v=True, global_kv_heads=2, experts=8)}
# llama.cpp's GELU reads an f16 table (~5e-4 of each value; two GELUs a layer here, the MLP's and the per-layer
# input gate's): measured 1.4e-3..3.0e-3 over seeds 1-7 against mlx-lm's exact GELU, the gemma3 tolerance.
# With that table emulated what is left is llama.cpp's own noise (its batched and one-by-one logits differ by
# ~5e-4 here): measured 6.5e-4. The MoE shape (the MLP's and the experts' GELUs): 1.3e-3..3.6e-3 exact (seed 7:
# 2.2e-3; seed 4 flips a routing choice), 9.2e-4 with the table, over seeds 1-7.
LLAMA_CPP_TOLERANCE, F16_GELU_TOLERANCE = 3e-3, 1e-3


def logits(model, tokens=TOKENS) -> np.ndarray:
    return np.array(model(mx.array([tokens])).astype(mx.float32))[0]


def llama_cpp_logits(llama_cpp, path) -> np.ndarray:
    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=64, n_threads=2, type_k=0, type_v=0, verbose=False)
    llm.eval(TOKENS)
    return np.array(llm.scores[: len(TOKENS)])


_GELU = nn.gelu_approx  # mlx's tanh-form GELU, kept before a test replaces it


def f16_table_gelu(x: mx.array) -> mx.array:
    """llama.cpp's CPU GELU: the tanh form's value at x rounded to f16, looked up as f16; x past +-10 as is."""
    y = _GELU(x.astype(mx.float16).astype(mx.float32)).astype(mx.float16).astype(mx.float32)
    return mx.where(x <= -10, 0.0, mx.where(x >= 10, x, y))


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_llama_cpp(tmp_path, shape, qtype, monkeypatch):
    """mlxspec's load of the file against llama.cpp's of the same weights in float32 (for Q8_0: a file of
    the Q8_0 values, since llama.cpp's own Q8_0 matmuls round the activations to int8 as well)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (not a dev dependency)")
    g = SHAPES[shape]
    path = write_tiny_gemma4_gguf(tmp_path / "model.gguf", qtype, seed=7, g=g)
    reference = path if qtype == "F32" else write_tiny_gemma4_gguf(tmp_path / "ref.gguf", qtype, seed=7, g=g,
                                                                    rounded_through=qtype)
    model, _, config = load_gguf(path)
    assert config["gguf_tensor_types"].get(qtype) and config["model_type"] == "gemma4_text"
    want = llama_cpp_logits(llama_cpp, reference)
    got = logits(model)
    assert np.abs(want).max() > 1.0  # not a degenerate model
    np.testing.assert_allclose(got, want, atol=LLAMA_CPP_TOLERANCE, rtol=0)

    import mlx_lm.models.gemma4_text as gemma4_text

    monkeypatch.setattr(gemma4_text, "geglu", lambda gate, x: f16_table_gelu(gate) * x)
    monkeypatch.setattr(nn, "gelu_approx", f16_table_gelu)  # the per-layer input gate's
    np.testing.assert_allclose(logits(model), want, atol=F16_GELU_TOLERANCE, rtol=0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_config_and_layers(tmp_path, shape):
    g = SHAPES[shape]
    model, _, config = load_gguf(write_tiny_gemma4_gguf(tmp_path / "model.gguf", "Q8_0", g=g))
    assert config["layer_types"] == ["sliding_attention" if s else "full_attention" for s in g.pattern]
    assert (config["head_dim"], config["global_head_dim"], config["sliding_window"]) == (32, 64, 4)
    assert config["num_kv_shared_layers"] == g.shared and config["use_double_wide_mlp"] == bool(g.shared)
    assert config["attention_k_eq_v"] == g.k_eq_v and config["final_logit_softcapping"] == g.softcap
    assert config["hidden_size_per_layer_input"] == g.per_layer
    moe = [config.get(k) for k in ("enable_moe_block", "num_experts", "top_k_experts", "moe_intermediate_size")]
    assert moe == ([True, g.experts, g.top_k, g.expert_ffn] if g.experts else [False, None, None, None])
    attention = [layer.self_attn for layer in model.layers]
    assert [a.has_kv for a in attention] == [i < g.layers - g.shared for i in range(g.layers)]
    assert [a.n_kv_heads for a in attention] == [g.kv(i) for i in range(g.layers)]
    # global layers: the file's rope_freqs rotate 8 of the 32 pairs; 1e30 leaves the rest as they are
    rope = attention[2].rope
    x = mx.random.normal((1, 1, 3, 64))
    turned = np.array(rope(x, offset=5) - x)
    assert np.abs(turned[..., 8:32]).max() == 0 and np.abs(turned[..., 40:]).max() == 0
    assert np.abs(turned[..., :8]).max() > 0.01


def test_cached_decoding_matches_full_forward(tmp_path):
    """Token by token through mlx-lm's caches: the sliding layers' rotating window, the shared layers' reuse."""
    model, _, _ = load_gguf(write_tiny_gemma4_gguf(tmp_path / "model.gguf", "Q8_0", seed=3))
    full = logits(model)
    cache = make_prompt_cache(model)
    model(mx.array([TOKENS[:3]]), cache=cache)
    for i in range(3, len(TOKENS)):
        step = np.array(model(mx.array([[TOKENS[i]]]), cache=cache))[0, 0]
        np.testing.assert_allclose(step, full[i], atol=2e-4, rtol=0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_lookup_speculation_keeps_plain_tokens(tmp_path, shape):
    path = str(write_tiny_gemma4_gguf(tmp_path / "model.gguf", "Q8_0", seed=1, g=SHAPES[shape]))
    plain, lookup = Engine.load(path), Engine.load(path, drafter="lookup")
    assert plain.info["architecture"] == "gemma4"
    assert_drafts_keep_plain_tokens(plain, lookup, ["the world and the world and the"], 24)


def test_expert_gate_up_fused_or_apart(tmp_path):
    """llama.cpp reads the experts' gate and up rows from one ffn_gate_up_exps (the converter's) or two tensors:
    the same values give the same model, the fused rows split gate first."""
    g = SHAPES["26b-a4b"]
    fused, _, _ = load_gguf(write_tiny_gemma4_gguf(tmp_path / "fused.gguf", "Q8_0", seed=2, g=g))
    apart, _, _ = load_gguf(write_tiny_gemma4_gguf(tmp_path / "apart.gguf", "Q8_0", seed=2,
                                                   g=replace(g, fused_experts=False)))
    np.testing.assert_array_equal(logits(fused), logits(apart))


def test_router_scales_are_the_files(tmp_path):
    """ffn_gate_inp.scale and ffn_down_exps.scale land on the router's scale and per_expert_scale, as stored."""
    path = write_tiny_gemma4_gguf(tmp_path / "model.gguf", "Q8_0", g=SHAPES["26b-a4b"])
    model, _, _ = load_gguf(path)
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    router = model.layers[3].router
    np.testing.assert_array_equal(np.array(router.scale), tensors["blk.3.ffn_gate_inp.scale"].data)
    np.testing.assert_array_equal(np.array(router.per_expert_scale), tensors["blk.3.ffn_down_exps.scale"].data)


TEXTS = ["the world and the world", " is the\n\nworld\n", "hello world", "<|turn>the<turn|>\n\n\nan", "  two  spaces",
         "\u00e9 \u00fcn\u00efcode ok"]


def test_gemma4_vocabulary(tmp_path):
    """Gemma 4's own vocabulary kind: merges over characters, "▁" for spaces, newline runs apart, bytes for the rest."""
    _, tokenizer, _ = load_gguf(write_tiny_gemma4_gguf(tmp_path / "model.gguf", "Q8_0", vocabulary="gemma4"))
    tokens = gemma4_vocab()[0]
    pieces = [[tokens[i] for i in tokenizer.encode(text)] for text in TEXTS]
    assert pieces[0] == ["<bos>", "the", "\u2581world", "\u2581and", "\u2581the", "\u2581world"]  # merges run
    assert pieces[1][-3:] == ["\n\n", "world", "\n"]  # a newline run is a piece of its own
    assert pieces[5][1:3] == ["<0xC3>", "<0xA9>"]  # no token: its UTF-8 bytes
    assert {tokens[i] for i in tokenizer.eos_token_ids} == {"<eos>", "<turn|>"}  # a turn's end ends generation
    for text in TEXTS:
        assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=True) == text.replace("<|turn>", "").replace(
            "<turn|>", "")


def test_gemma4_vocabulary_matches_llama_cpp(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (not a dev dependency)")
    path = write_tiny_gemma4_gguf(tmp_path / "model.gguf", "Q8_0", vocabulary="gemma4")
    _, tokenizer, _ = load_gguf(path)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in TEXTS:
        assert tokenizer.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=True), text
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    eog = {i for i in range(len(gemma4_vocab()[0])) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    assert set(tokenizer.eos_token_ids) == eog and len(eog) == 2  # <eos>, <turn|>


@pytest.mark.parametrize("metadata, match", [
    ({"expert_count": 8}, "not a router .* in every layer"),  # mlx-lm's experts are in every layer or none
    ({"attention.sliding_window_pattern": 5}, "sliding-window flag per layer"),
    # llama.cpp's shared layers would read layers 4 and 5 (a full and a sliding one): not mlx-lm's choice
    ({"attention.shared_kv_layers": 1}, "KV-shared layers follow"),
    ({"feed_forward_length": [128] * 6 + [512]}, "feed-forward widths"),
    ({"rope.dimension_count_swa": 16}, "partial rope on the sliding layers"),
])
def test_unsupported_variants_refused(tmp_path, metadata, match):
    path = write_tiny_gemma4_gguf(tmp_path / "model.gguf", "Q8_0", metadata=metadata)
    with pytest.raises(ModelLoadError, match=match):
        load_gguf(path)
