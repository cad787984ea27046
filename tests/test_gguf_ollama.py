"""Ollama's own GGUF layouts (mlxspec.gguf_ollama): gemma3, gemma4, gptoss and Llama 3 vocabularies as Ollama's
converter wrote them load as the same models in llama.cpp's layout.

Each Ollama file is rewritten from a llama.cpp-layout tiny model (tests/ollama_gguf.py: the same tensor
bytes, Ollama's names and metadata, as ollama/ollama's llama/compat/llama-ollama-compat.cpp describes
them), then checked against the independent numpy forward (gemma3) or the llama.cpp-layout file (gpt-oss).
"""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np
import pytest

from fake_ollama import add_model
from gguf_gemma4_fixtures import Gemma4, ollama_gemma4, write_tiny_gemma4_gguf
from gguf_reference import dequantized_weights, forward
from speculation_checks import assert_drafts_keep_plain_tokens
from ollama_gguf import rewrite
from test_gguf_archs import TOKENS, mlx_logits, write_case
from mlxspec.engine import Engine
from mlxspec.errors import ModelLoadError
from mlxspec.gguf import load_gguf
from mlxspec.gguf_header import Header, read_header
from mlxspec.gguf_ollama import GEMMA3_CHAT_TEMPLATE, translate
from mlxspec.options import GenerateOptions
from mlxspec.store import Store

IMAGE_TOKENS = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]  # in Ollama's vocabulary, not the embedding


def ollama_gemma3(tmp_path, context: int, nested_rope: bool = True):
    """The llama.cpp gemma3 case as Ollama's converter lays it out: no rms epsilon; rope bases under
    rope.global / rope.local; no rope scaling keys; image tokens past the embedding rows; a vision tower."""
    src, hp = write_case(tmp_path, "gemma3")
    hp = dataclasses.replace(hp, eps=1e-6, rope_base=10_000.0, swa_rope_base=1_000_000.0) if nested_rope else hp
    tokens = read_header(src).metadata
    vocab = {key: tokens[f"tokenizer.ggml.{key}"] for key in ("tokens", "scores", "token_type")}
    # the bases swapped from gemma3's (1e6 global, 1e4 local), so that logits show each key is read, not defaulted
    rope = {"gemma3.rope.global.freq_base": 10_000.0, "gemma3.rope.local.freq_base": 1_000_000.0} if nested_rope else {}
    dst = rewrite(src, tmp_path / "ollama-gemma3.gguf",
                  drop=["gemma3.attention.layer_norm_rms_epsilon", "gemma3.rope.freq_base", "gemma3.rope.scaling.type",
                        "gemma3.rope.scaling.factor"],
                  set={"gemma3.context_length": context, "gemma3.mm.tokens_per_image": 256, **rope,
                       "tokenizer.ggml.tokens": vocab["tokens"] + IMAGE_TOKENS,
                       "tokenizer.ggml.scores": [float(s) for s in vocab["scores"]] + [0.0] * len(IMAGE_TOKENS),
                       "tokenizer.ggml.token_type": [int(t) for t in vocab["token_type"]] + [3] * len(IMAGE_TOKENS)},
                  extra_tensors={"v.blk.0.attn_q.weight": np.ones((8, 8)), "mm.mm_input_projection_weight": np.ones((8, 4))})
    return src, dst, hp


def test_an_ollama_gemma3_loads_as_the_same_model(tmp_path):
    src, path, hp = ollama_gemma3(tmp_path, context=131072)
    model, tokenizer, config = load_gguf(path)
    # Ollama's defaults for what the file leaves out: eps 1e-6, linear x8 for the 128k-context sizes
    assert config["rms_norm_eps"] == 1e-6 and config["rope_theta"] == 1e4 and config["rope_local_base_freq"] == 1e6
    assert config["rope_scaling"]["factor"] == 8.0 and config["rope_scaling"]["rope_type"] == "linear"
    rows = read_header(src).metadata["tokenizer.ggml.tokens"]
    assert config["vocab_size"] == len(rows) and len(tokenizer.get_vocab()) == len(rows)

    got = mlx_logits(model, TOKENS)
    np.testing.assert_allclose(got, forward(dequantized_weights(src), hp, TOKENS), atol=5e-5, rtol=0)
    # each nested rope base and the injected scaling move the logits 200x the tolerance and more when missed
    # (the global base: one layer of six over 12 positions)
    for wrong in (dict(rope_base=1e6), dict(swa_rope_base=1e4), dict(rope_scale=1.0)):
        assert np.abs(got - forward(dequantized_weights(src), dataclasses.replace(hp, **wrong), TOKENS)).max() > 0.01

    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n")


def test_a_short_context_ollama_gemma3_gets_no_rope_scaling(tmp_path):
    _, path, _ = ollama_gemma3(tmp_path, context=32768)  # gemma3:1b
    _, _, config = load_gguf(path)
    assert "rope_scaling" not in config and config["rope_theta"] == 1e4


def test_ollamas_per_layer_window_pattern_is_read_as_a_period(tmp_path):
    """Ollama's converter writes gemma3:1b's pattern per layer (true: sliding), as layer_types."""
    src, hp = write_case(tmp_path, "gemma3")  # six layers: five sliding, then a global one
    path = rewrite(src, tmp_path / "pattern.gguf", set={"gemma3.attention.sliding_window_pattern": [True] * 5 + [False]})
    model, _, config = load_gguf(path)
    assert config["sliding_window_pattern"] == 6
    np.testing.assert_array_equal(mlx_logits(model, TOKENS), mlx_logits(load_gguf(src)[0], TOKENS))
    odd = rewrite(src, tmp_path / "odd.gguf", set={"gemma3.attention.sliding_window_pattern": [True, False] * 2 + [True] * 2})
    with pytest.raises(ModelLoadError, match="not every n-th layer global"):
        load_gguf(odd)


def test_ollamas_embeddinggemma_is_refused_by_name(tmp_path):
    src, _ = write_case(tmp_path, "gemma3")
    path = rewrite(src, tmp_path / "embeddinggemma.gguf", extra_tensors={"dense.0.weight": np.ones((8, 8)),
                                                                        "dense.1.weight": np.ones((8, 8))})
    with pytest.raises(ModelLoadError, match="embedding-only model"):
        load_gguf(path)


def test_llama_cpp_files_pass_through_unchanged(tmp_path):
    for name in ("gemma3", "gpt-oss", "llama3", "mistral3"):
        header = read_header(write_case(tmp_path, name)[0])
        assert translate(header) is header


def ollama_gptoss(tmp_path, **extra):
    """The llama.cpp gpt-oss case as Ollama publishes it: "gptoss" keys, attn_out / attn_sinks / ffn_norm,
    no expert FFN length, no YaRN type, the default pre-tokenizer."""
    src, _ = write_case(tmp_path, "gpt-oss")
    names = [t.name for t in read_header(src).tensors]
    renames = {n: n.replace(".attn_output.", ".attn_out.").replace(".attn_sinks.weight", ".attn_sinks")
               .replace(".post_attention_norm.", ".ffn_norm.") for n in names}
    renames |= extra.pop("renames", {})
    dst = rewrite(src, tmp_path / "ollama-gptoss.gguf", arch="gptoss", renames=renames,
                  drop=["gpt-oss.expert_feed_forward_length", "gpt-oss.rope.scaling.type"],
                  set={"tokenizer.ggml.pre": "default"}, **extra)
    return src, dst


def test_an_ollama_gptoss_loads_as_llama_cpps_gpt_oss(tmp_path):
    src, path = ollama_gptoss(tmp_path)
    assert {"blk.0.attn_out.weight", "blk.0.attn_sinks", "blk.0.ffn_norm.weight"} <= {t.name for t in read_header(path).tensors}
    want, _, want_config = load_gguf(src)
    model, tokenizer, config = load_gguf(path)
    assert config["gguf_architecture"] == "gpt-oss" and config["rope_scaling"]["rope_type"] == "yarn"
    for key in ("intermediate_size", "num_local_experts", "num_experts_per_tok", "sliding_window", "rope_scaling"):
        assert config[key] == want_config[key], key
    assert np.array_equal(mlx_logits(model, TOKENS), mlx_logits(want, TOKENS))  # the same tensors, bit for bit
    header = translate(read_header(path))
    assert header.metadata["tokenizer.ggml.pre"] == "gpt-4o" and header.metadata["general.architecture"] == "gpt-oss"


@pytest.mark.parametrize("fused", ["ffn_gate_up_exps", "attn_qkv"])
def test_an_early_ollama_gptoss_is_refused_by_name(tmp_path, fused):
    part = {"ffn_gate_up_exps": "ffn_gate_exps", "attn_qkv": "attn_q"}[fused]
    _, path = ollama_gptoss(tmp_path, renames={f"blk.0.{part}.weight": f"blk.0.{fused}.weight"})
    with pytest.raises(ModelLoadError, match=f"early Ollama gpt-oss layout \\(fused blk.0.{fused}"):
        load_gguf(path)


def test_an_ollama_mistral3_loads_as_llama_cpps(tmp_path):
    """Ollama's mistral3 (Mistral Small 3.1/3.2, Ministral 3): YaRN's betas and the attention temperature
    under its own names, a vision tower in the file, no pre-tokenizer name (tekken, as Ollama sets it)."""
    src, _ = write_case(tmp_path, "mistral3")
    meta = read_header(src).metadata
    renames = {"rope.scaling.yarn_log_multiplier": "rope.scaling.mscale_all_dim",
               "attention.temperature_scale": "rope.scaling_beta"}
    path = rewrite(src, tmp_path / "ollama-mistral3.gguf", drop=[f"mistral3.{k}" for k in renames],
                   set={**{f"mistral3.{theirs}": meta[f"mistral3.{ours}"] for ours, theirs in renames.items()},
                        "mistral3.rope.scaling.beta_fast": 16.0, "tokenizer.ggml.pre": "default"},
                   extra_tensors={"v.patch_conv.weight": np.ones((4, 4)), "mm.linear_1.weight": np.ones((4, 4))})
    with_betas = rewrite(src, tmp_path / "betas.gguf", set={"mistral3.rope.scaling.yarn_beta_fast": 16.0})
    model, _, config = load_gguf(path)
    assert config["rope_parameters"]["llama_4_scaling_beta"] == 0.5 and config["rope_parameters"]["beta_fast"] == 16.0
    assert np.array_equal(mlx_logits(model, TOKENS), mlx_logits(load_gguf(with_betas)[0], TOKENS))
    assert translate(read_header(path)).metadata["tokenizer.ggml.pre"] == "tekken"


def test_ollamas_olmo3_reads_as_olmo2_and_its_sliding_windows_are_refused_by_name(tmp_path):
    src, _ = write_case(tmp_path, "olmo2")
    renamed = rewrite(src, tmp_path / "olmo3.gguf", arch="olmo3")
    assert np.array_equal(mlx_logits(load_gguf(renamed)[0], TOKENS), mlx_logits(load_gguf(src)[0], TOKENS))
    windowed = rewrite(src, tmp_path / "olmo3-swa.gguf", arch="olmo3", set={"olmo3.attention.sliding_window": 4096})
    with pytest.raises(ModelLoadError, match="sliding-window layers"):
        load_gguf(windowed)


def llama3_header(pre: str | None, eos: int | None, template: str = "") -> Header:
    tokens = [f"t{i}" for i in range(128256)]
    tokens[128001], tokens[128006], tokens[128009] = "<|end_of_text|>", "<|start_header_id|>", "<|eot_id|>"
    meta = {"general.architecture": "llama", "tokenizer.ggml.tokens": tokens}
    if eos is not None:
        meta["tokenizer.ggml.eos_token_id"] = eos
    if pre is not None:
        meta["tokenizer.ggml.pre"] = pre
    if template:
        meta["tokenizer.chat_template"] = template
    return Header(path=None, metadata=meta, tensors=[])


@pytest.mark.parametrize("pre, eos", [(None, 128009), ("default", 128009), ("llama-bpe", 128001), (None, 128001),
                                      (None, None)])
def test_llama3_vocabularies_get_their_pre_tokenizer_and_end_of_turn(pre, eos):
    meta = translate(llama3_header(pre, eos)).metadata
    assert meta["tokenizer.ggml.pre"] == (pre if pre not in (None, "default") else "llama-bpe")
    assert meta["tokenizer.ggml.eot_token_id"] == 128009  # chats end at <|eot_id|>
    assert meta["tokenizer.ggml.eos_token_id"] == (eos or 128009)  # and still at an <|end_of_text|> EOS


def test_complete_or_other_llama_vocabularies_are_left_alone():
    complete = llama3_header("llama-bpe", 128009)
    assert translate(complete) is complete
    other = llama3_header(None, 2)
    other.metadata["tokenizer.ggml.tokens"][128006] = "x"  # no chat markers: not a Llama 3 chat vocabulary
    assert translate(other) is other
    with_template = llama3_header(None, 2, template="{{ '<|start_header_id|>' }}")
    with_template.metadata["tokenizer.ggml.tokens"][128006] = "x"
    assert translate(with_template).metadata["tokenizer.ggml.pre"] == "llama-bpe"


def test_an_ollama_gemma3_runs_from_ollamas_store(tmp_path):
    """The user's path: `ollama:NAME` resolves to the blob, which loads and generates (exact as plain)."""
    _, path, _ = ollama_gemma3(tmp_path, context=131072)
    root = tmp_path / "ollama"
    add_model(root, "gemma3", path, template=None, params={"stop": ["<end_of_turn>"]})
    store = Store(tmp_path / "home", ollama_models=root)
    engine = store.load_engine(store.get("ollama:gemma3"))
    ids = [2, 5, 77, 271, 12]
    plain = [t for e in engine.generate(ids, GenerateOptions(max_tokens=12, draft_length=0)) for t in e.tokens]
    spec = [t for e in engine.generate(ids, GenerateOptions(max_tokens=12, draft_length=3, adaptive=False))
            for t in e.tokens]
    assert len(plain) == 12 and spec == plain
    assert mx.array(plain).max().item() < engine.target.config["vocab_size"]


GEMMA4_SHAPES = {"e2b": Gemma4(), "26b-a4b": Gemma4(per_layer=0, shared=0, k_eq_v=True, global_kv_heads=2, experts=8,
                                                    fused_experts=False)}
GEMMA4_TEXTS = ["the world and the world", " is the\n\nworld\n", "<|turn>the<turn|>\n\n\nan", "\u00e9 \u00fcn ok"]


def llama_cpp_and_ollama_gemma4(tmp_path, shape: str, **extra):
    g = GEMMA4_SHAPES[shape]
    src = write_tiny_gemma4_gguf(tmp_path / "llama-cpp.gguf", "Q8_0", seed=5, g=g, vocabulary="gemma4")
    return src, ollama_gemma4(src, tmp_path / "ollama-gemma4.gguf", **extra)


@pytest.mark.parametrize("shape", list(GEMMA4_SHAPES))
def test_an_ollama_gemma4_loads_as_llama_cpps(tmp_path, shape):
    """Its towers hidden, its "llama"-named vocabulary read as the BPE it is, the per-expert scale renamed:
    the same model and token ids as the llama.cpp-layout file of the same bytes."""
    src, path = llama_cpp_and_ollama_gemma4(tmp_path, shape)
    want, want_tokenizer, want_config = load_gguf(src)
    model, tokenizer, config = load_gguf(path)
    assert (config.get("num_experts"), config["hidden_size_per_layer_input"]) == (
        want_config.get("num_experts"), want_config["hidden_size_per_layer_input"])
    assert np.array_equal(mlx_logits(model, TOKENS), mlx_logits(want, TOKENS))  # the same tensors, bit for bit
    for text in GEMMA4_TEXTS:
        assert tokenizer.encode(text) == want_tokenizer.encode(text), text
    assert set(tokenizer.eos_token_ids) == set(want_tokenizer.eos_token_ids)
    header = translate(read_header(path))
    assert header.metadata["tokenizer.ggml.model"] == "gemma4"
    assert not any(t.name.startswith(("a.", "v.", "mm.", "model.")) for t in header.tensors)


def test_an_ollama_gemma4_speculates_as_it_decodes(tmp_path):
    _, path = llama_cpp_and_ollama_gemma4(tmp_path, "e2b")
    plain, lookup = Engine.load(str(path)), Engine.load(str(path), drafter="lookup")
    assert plain.info["architecture"] == "gemma4"
    assert_drafts_keep_plain_tokens(plain, lookup, ["the world and the world and the"], 24)


def test_llama_cpp_gemma4_files_pass_through_unchanged(tmp_path):
    """A llama.cpp file's vocabulary is "gemma4"; the fixtures' sentencepiece one is named "llama" but has no merges."""
    for vocabulary in ("gemma4", "llama"):
        header = read_header(write_tiny_gemma4_gguf(tmp_path / f"{vocabulary}.gguf", "Q8_0", vocabulary=vocabulary))
        assert translate(header) is header


@pytest.mark.parametrize("extra, match", [
    # the experts' quantization sidecars, with which Ollama's compat layer leaves gate/up apart
    ({"extra_tensors": {"blk.0.ffn_gate_exps.input_scale": np.ones(8)}}, r"sidecars \(blk.N.ffn_gate_exps.input"),
    # names only Ollama's Go engine read (model/models/gemma4/model_text.go's alt: tags and fallback keys)
    ({"renames": {"blk.0.ffn_norm.weight": "blk.0.ffn_pre_norm.weight"}}, r"Go engine read \(blk.N.ffn_pre_norm"),
    ({"renames": {"blk.1.layer_output_scale.weight": "blk.1.layer_scalar"}}, r"\(blk.N.layer_scalar\)"),
    ({"set": {"gemma4.rope.local.freq_base": 10000.0}}, r"\(gemma4.rope.local.freq_base\)"),
])
def test_gemma4_layouts_llama_cpp_does_not_read_are_refused_by_name(tmp_path, extra, match):
    _, path = llama_cpp_and_ollama_gemma4(tmp_path, "26b-a4b", **extra)
    with pytest.raises(ModelLoadError, match=match):
        load_gguf(path)
