"""Load a GGUF file (llama.cpp's format) into mlx-lm's own model class and a tokenizer.

    model, tokenizer, config = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")

`mx.load` reads GGUF tensors straight into MLX: Q4_0/Q4_1 become 4-bit affine group-32 triples
(`.weight` uint32, `.scales`, `.biases`), Q8_0 the same at 8 bits, F16/F32 plain arrays. Other
ggml types it silently converts or cannot read, so we read the header ourselves first and refuse
them: a K-quant dequantized to float16 would load, run slowly, and not be the model the user chose.

The architecture comes from mlx-lm (llama, qwen2); only the names and the config are mapped here.
The tokenizer is rebuilt from the `tokenizer.ggml.*` metadata by mlxspec.gguf_tokenizer, as llama.cpp reads it.
"""

from __future__ import annotations

import importlib
import mmap
import os
import struct
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from .errors import ModelLoadError

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

# ggml type ids (ggml.h `enum ggml_type`) -> names, as llama.cpp prints them.
GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
    24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
    35: "TQ2_0", 39: "MXFP4",
}

# The types MLX holds natively: (elements per block, bytes per block), to check the data is all there.
SUPPORTED_TYPES = {"F32": (1, 4), "F16": (1, 2), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34)}

GGML_GROUP_SIZE = 32  # every supported quantized type stores blocks of 32 weights with one scale

# mlx-lm model modules, and whether the GGUF q/k rows are in interleaved rope order (llama.cpp's
# "normal" rope, which is mlx's rope_traditional=True) or in halves (llama.cpp's NEOX rope).
_ARCHITECTURES = {
    "llama": ("mlx_lm.models.llama", True),
    "qwen2": ("mlx_lm.models.qwen2", False),
}

_TOP_LEVEL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# A quantized tensor arrives as .weight/.scales/.biases; qwen2's q/k/v add a plain `.bias`.
_PARAM_SUFFIXES = {"weight", "scales", "biases", "bias"}


# ---------------------------------------------------------------- header


def gguf_tensor_types(path: str | Path) -> dict[str, str]:
    """Tensor name -> ggml type name ("Q4_0", "F16", ...), read from the file's header."""
    return {name: type_name for name, _, type_name, _ in _read_header(Path(path))}


def _read_header(path: Path) -> list[tuple[str, tuple[int, ...], str, int]]:
    """[(name, ggml dims fastest-first, type name, data offset)], checked for truncation.

    Layout (GGUF v2/v3, little-endian): "GGUF", u32 version, u64 tensor count, u64 kv count;
    kv pairs (string key, u32 value type, value); tensor infos (string name, u32 n_dims,
    u64 dims[n_dims], u32 type, u64 offset); padding to `general.alignment`; tensor data.
    """
    try:
        f = open(path, "rb")
    except OSError as e:  # missing, a directory, unreadable
        raise ModelLoadError(f"cannot read GGUF file {path}: {e.strerror or e}") from None
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ModelLoadError(f"{path} is not a GGUF file (it is empty)")
        # mmap: the header of a big vocabulary is ~100k small strings; unpack_from on the map is fast.
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse_header(_Cursor(buf, path), len(buf))


class _Cursor:
    """Little-endian reads over the mapped file; running past its end means it is truncated."""

    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> int:
        """Advance by n bytes and return where they start."""
        start, self.pos = self.pos, self.pos + n
        if self.pos > len(self.buf):
            raise ModelLoadError(f"GGUF file {self.path} is truncated (header ends past the end of the file)")
        return start

    def unpack(self, fmt: str):
        return struct.unpack_from("<" + fmt, self.buf, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("Q")
        start = self.take(n)
        return bytes(self.buf[start : start + n]).decode("utf-8", errors="replace")


# GGUF metadata value types (gguf.h `enum gguf_type`) of fixed size -> struct format.
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def _parse_header(cur: _Cursor, file_size: int):
    if file_size < 4 or bytes(cur.buf[:4]) != b"GGUF":
        raise ModelLoadError(f"{cur.path} is not a GGUF file (no 'GGUF' magic at its start)")
    cur.take(4)
    version = cur.unpack("I")
    if version not in (2, 3):
        raise ModelLoadError(f"{cur.path}: GGUF version {version} is not supported (only 2 and 3)")
    n_tensors, n_kv = cur.unpack("Q"), cur.unpack("Q")

    alignment = 32
    for _ in range(n_kv):
        key, value_type = cur.string(), cur.unpack("I")
        if key == "general.alignment" and value_type == 4:
            alignment = cur.unpack("I")
        else:
            _skip_value(cur, value_type)

    tensors = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.unpack("I")
        if n_dims > 4:  # GGML_MAX_DIMS: more means we are reading garbage
            raise ModelLoadError(f"{cur.path}: tensor {name!r} claims {n_dims} dimensions; the header is corrupt")
        dims = tuple(cur.unpack("Q") for _ in range(n_dims))
        type_id, offset = cur.unpack("I"), cur.unpack("Q")
        tensors.append((name, dims, GGML_TYPE_NAMES.get(type_id, f"type {type_id}"), offset))

    data_start = -(-cur.pos // alignment) * alignment
    for name, dims, type_name, offset in tensors:
        if type_name in SUPPORTED_TYPES:  # others are refused anyway, and we do not know their sizes
            block, block_bytes = SUPPORTED_TYPES[type_name]
            count = 1
            for d in dims:
                count *= d
            if data_start + offset + count // block * block_bytes > file_size:
                raise ModelLoadError(f"GGUF file {cur.path} is truncated (tensor {name!r} runs past its end)")
    return tensors


def _skip_value(cur: _Cursor, value_type: int) -> None:
    if value_type in _SCALAR_FORMATS:
        cur.take(struct.calcsize(_SCALAR_FORMATS[value_type]))
    elif value_type == _STRING:
        cur.take(cur.unpack("Q"))
    elif value_type == _ARRAY:
        item_type, count = cur.unpack("I"), cur.unpack("Q")
        if item_type in _SCALAR_FORMATS:  # fixed size: skip the whole array at once
            cur.take(count * struct.calcsize(_SCALAR_FORMATS[item_type]))
        else:
            for _ in range(count):
                _skip_value(cur, item_type)
    else:
        raise ModelLoadError(f"{cur.path}: unknown GGUF metadata value type {value_type}; the header is corrupt")


def _check_types(path: Path) -> Counter:
    """Refuse tensors MLX cannot hold as they are; return a count of the types found."""
    tensors = _read_header(path)
    unsupported: dict[str, list[str]] = {}
    for name, _, type_name, _ in tensors:
        if type_name not in SUPPORTED_TYPES:
            unsupported.setdefault(type_name, []).append(name)
    if unsupported:
        listed = "; ".join(
            f"{t}: {', '.join(names[:3])}{f' and {len(names) - 3} more' if len(names) > 3 else ''}"
            for t, names in unsupported.items()
        )
        raise ModelLoadError(
            f"{path.name} holds tensor types mlxspec cannot load ({listed}); "
            f"supported: {', '.join(SUPPORTED_TYPES)}. Use a Q4_0, Q4_1, Q8_0 or F16 GGUF of this model."
        )
    return Counter(type_name for _, _, type_name, _ in tensors)


# ---------------------------------------------------------------- model


def load_gguf(path: str | Path) -> tuple[nn.Module, TokenizerWrapper, dict]:
    """GGUF file -> (mlx-lm model with weights loaded and evaluated, mlx-lm TokenizerWrapper, config dict)."""
    path = Path(path)
    type_counts = _check_types(path)  # before mx.load, which would convert what we refuse
    try:
        tensors, metadata = mx.load(str(path), format="gguf", return_metadata=True)
    except Exception as e:  # mx.load raises bare RuntimeError/ValueError on files it cannot parse
        raise ModelLoadError(f"cannot read GGUF file {path}: {e}") from None

    arch = _value(metadata, "general.architecture")
    if arch not in _ARCHITECTURES:
        raise ModelLoadError(
            f"{path.name}: architecture {arch!r} is not supported (supported: {', '.join(_ARCHITECTURES)})"
        )
    weights = _rename_tensors(tensors, path)
    config = _model_config(arch, metadata, weights, path)
    config["gguf_file_type"] = _value(metadata, "general.file_type")
    config["gguf_tensor_types"] = dict(type_counts)

    model = _build_model(arch, config, weights, path)
    tokenizer = _build_tokenizer(metadata, path)
    return model, tokenizer, config


def _value(metadata: dict, key: str, default=None):
    """A metadata value as plain Python: mx.load gives scalars as 0-d mx.arrays."""
    v = metadata.get(key, default)
    return v.item() if isinstance(v, mx.array) and v.ndim == 0 else v


def _rename_tensors(tensors: dict[str, mx.array], path: Path) -> dict[str, mx.array]:
    """GGUF names (blk.3.attn_q.scales) -> mlx-lm names (model.layers.3.self_attn.q_proj.scales)."""
    renamed, unknown = {}, []
    for name, array in tensors.items():
        parts = name.split(".")
        if len(parts) == 2 and parts[0] in _TOP_LEVEL_NAMES and parts[1] in _PARAM_SUFFIXES:
            renamed[f"{_TOP_LEVEL_NAMES[parts[0]]}.{parts[1]}"] = array
        elif len(parts) == 4 and parts[0] == "blk" and parts[2] in _BLOCK_NAMES and parts[3] in _PARAM_SUFFIXES:
            renamed[f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{parts[3]}"] = array
        else:
            unknown.append(name)
    if unknown:
        # e.g. rope_freqs.weight (llama-3.1 rope scaling) or MoE experts: not a model we can run right
        raise ModelLoadError(f"{path.name}: tensors mlxspec does not know how to map: {', '.join(unknown[:5])}")
    return renamed


def _model_config(arch: str, metadata: dict, weights: dict, path: Path) -> dict:
    """mlx-lm config (the HF config.json keys) from the `{arch}.*` metadata."""

    def get(key, default=None):
        value = _value(metadata, f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"{path.name}: metadata key {arch}.{key} is missing")
        return value

    hidden, heads = get("embedding_length"), get("attention.head_count")
    head_dim = get("attention.key_length", hidden // heads)
    if get("rope.dimension_count", head_dim) != head_dim:
        raise ModelLoadError(f"{path.name}: partial rotary embeddings are not supported")
    if arch == "qwen2" and head_dim != hidden // heads:
        raise ModelLoadError(f"{path.name}: qwen2 with head_dim {head_dim} != hidden/heads is not supported")

    tokens = metadata.get("tokenizer.ggml.tokens")
    vocab_size = len(tokens) if tokens is not None else get("vocab_size")
    config = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon"),
        "vocab_size": vocab_size,
        "max_position_embeddings": get("context_length"),
        "rope_theta": get("rope.freq_base", 10000.0),
        "rope_traditional": _ARCHITECTURES[arch][1],
        "tie_word_embeddings": "lm_head.weight" not in weights,
    }
    scaling = _value(metadata, f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": get("rope.scaling.factor")}
    elif scaling != "none":
        raise ModelLoadError(f"{path.name}: rope scaling {scaling!r} is not supported")
    config["quantization"] = _quantization_config(weights)
    return config


def _layer_quantization(weights: dict, layer: str) -> dict | None:
    """{"group_size": 32, "bits": b} for a layer that arrived quantized, else None.

    weight is uint32 (out, in * bits / 32) and scales (out, in / 32): so bits = their width ratio.
    """
    if f"{layer}.scales" not in weights:
        return None
    bits = weights[f"{layer}.weight"].shape[-1] // weights[f"{layer}.scales"].shape[-1]
    return {"group_size": GGML_GROUP_SIZE, "bits": bits}


def _quantization_config(weights: dict) -> dict | None:
    """mlx-lm's "quantization" config: the commonest setting, plus per-layer entries where a layer
    differs (a dict, or False for a plain one), the form mlx-lm's own loader reads back."""
    layers = sorted({k.rsplit(".", 1)[0] for k in weights if k.endswith(".weight") and weights[k].ndim == 2})
    settings = {layer: _layer_quantization(weights, layer) for layer in layers}
    counts = Counter((q["group_size"], q["bits"]) for q in settings.values() if q)
    if not counts:
        return None
    group_size, bits = counts.most_common(1)[0][0]
    main = {"group_size": group_size, "bits": bits}
    overrides = {layer: (q or False) for layer, q in settings.items() if q != main}
    return main | overrides


def _build_model(arch: str, config: dict, weights: dict, path: Path) -> nn.Module:
    module = importlib.import_module(_ARCHITECTURES[arch][0])
    model = module.Model(module.ModelArgs.from_dict(config))

    # Quantize exactly the layers that arrived quantized, each with its own bits (the Q8_0 token
    # table becomes a QuantizedEmbedding, which also serves as the tied head via as_linear).
    def arrived_quantized(layer_path: str, module: nn.Module) -> dict | bool:
        return hasattr(module, "to_quantized") and _layer_quantization(weights, layer_path) or False

    nn.quantize(model, class_predicate=arrived_quantized)
    # A quantized embedding returns rows in its scales' dtype: float16 would round the residual
    # stream at its source (tiny-model logits off by ~5e-3). llama.cpp dequantizes rows to float32; so do we.
    for key in ("model.embed_tokens.scales", "model.embed_tokens.biases"):
        if key in weights:
            weights[key] = weights[key].astype(mx.float32)
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:  # missing/extra/mis-shaped tensors: metadata and tensors disagree
        raise ModelLoadError(f"{path.name}: weights do not fit a {arch} model built from its metadata: {e}") from None
    mx.eval(model.parameters())
    model.eval()
    return model


# ---------------------------------------------------------------- tokenizer


def _build_tokenizer(metadata: dict, path: Path):
    """mlx-lm TokenizerWrapper around a PreTrainedTokenizerFast rebuilt from `tokenizer.ggml.*`."""
    from mlx_lm.tokenizer_utils import (
        BPEStreamingDetokenizer,
        SPMStreamingDetokenizer,
        TokenizerWrapper,
    )
    from transformers import PreTrainedTokenizerFast

    from .gguf_tokenizer import BOS_BY_DEFAULT, build_backend, pre_tokenizer_type, set_special_template

    prefix = "tokenizer.ggml."
    vocab = {
        key[len(prefix):]: value.tolist() if isinstance(value, mx.array) else value
        for key, value in metadata.items()
        if key.startswith(prefix)
    }
    backend = build_backend(vocab, path.name)
    kind, tokens = vocab["model"], vocab["tokens"]

    def token(key):
        token_id = vocab.get(f"{key}_token_id")
        return (token_id, tokens[token_id]) if token_id is not None and token_id < len(tokens) else (None, None)

    (bos_id, bos), (eos_id, eos), (_, unk), (_, pad) = token("bos"), token("eos"), token("unknown"), token("padding")
    # llama.cpp's default when the file does not say: BOS for sentencepiece and llama-3 vocabularies.
    bos_default = kind == "llama" or pre_tokenizer_type(vocab, path.name) in BOS_BY_DEFAULT
    add_bos = bool(vocab.get("add_bos_token", bos_default)) and bos is not None
    add_eos = bool(vocab.get("add_eos_token", False)) and eos is not None
    set_special_template(backend, (bos_id, bos) if add_bos else None, (eos_id, eos) if add_eos else None)
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos,
        unk_token=unk,
        pad_token=pad,
        add_bos_token=add_bos,  # what the post-processor above does, so the attributes say it too
        add_eos_token=add_eos,
        chat_template=_value(metadata, "tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,  # decode must give back the text, spaces and all
    )

    if kind == "gpt2":
        detokenizer = BPEStreamingDetokenizer
    else:  # "llama" (build_backend refused the rest)
        # SPM: strip the leading space only when the tokenizer adds one.
        trim = bool(vocab.get("add_space_prefix", True))
        detokenizer = lambda tok: SPMStreamingDetokenizer(tok, trim_space=trim)  # noqa: E731
    # End of generation: EOS, and the end-of-turn token where the file names one (llama-3's <|eot_id|>).
    eot_id = vocab.get("eot_token_id")
    eos_ids = [i for i in (eos_id, eot_id) if i is not None]
    return TokenizerWrapper(hf_tokenizer, detokenizer, eos_token_ids=eos_ids)
