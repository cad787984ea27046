"""Load a GGUF file (llama.cpp's format) into mlx-lm's own model class and a tokenizer.

    model, tokenizer, config = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")

The header is read by mlxspec.gguf_header; every tensor type is checked before any data is read,
and types MLX cannot hold faithfully (I-quants, ternary...) are refused by name. Then the
tensors are converted one at a time from the memory-mapped file by mlxspec.gguf_quants: floats as
they are, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K code for code into MLX's affine quantization (exact),
Q6_K/Q3_K/Q2_K requantized with their measured error, MXFP4 as MLX's mxfp4 (exact). Only the converted arrays are kept, so the
model is never in memory twice. `config["gguf_conversion"]` says which tensors were exact and the
error of the others.

The architecture runs on mlx-lm's model code; names, config and conventions are mapped by
mlxspec.gguf_archs, after mlxspec.gguf_ollama has read the header of a file from Ollama's own converter
as llama.cpp's layout (as Ollama itself does). The tokenizer is rebuilt from the `tokenizer.ggml.*` metadata by
mlxspec.gguf_tokenizer, as llama.cpp reads it.
"""

from __future__ import annotations

import importlib
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from . import gguf_archs as archs
from . import gguf_delta_net as delta_net
from .errors import ModelLoadError
from .gguf_header import Header, read_header
from .gguf_ollama import translate
from .gguf_rope import ROPE_TENSORS, apply_file_rope, interleave_rope
from .gguf_quants import GROUP, SUPPORTED, TensorReport, convert_tensor

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

_WHY_NOT = {
    "Q8_K": "llama.cpp's intermediate dot-product type, not a storage type",
    "Q8_1": "llama.cpp's intermediate dot-product type, not a storage type",
}


# ---------------------------------------------------------------- header


def gguf_tensor_types(path: str | Path) -> dict[str, str]:
    """Tensor name -> ggml type name ("Q4_0", "F16", ...), read from the file's header."""
    return {t.name: t.type for t in translate(read_header(path)).tensors}


def _check_types(header: Header) -> Counter:
    """Refuse tensor types we cannot load faithfully, naming them; return a count of the types."""
    unsupported: dict[str, list[str]] = {}
    for t in header.tensors:
        if t.type not in SUPPORTED and not t.name.startswith(archs.IGNORED_PREFIXES):
            unsupported.setdefault(t.type, []).append(t.name)
    if unsupported:
        listed = "; ".join(
            f"{t}{f' ({_WHY_NOT[t]})' if t in _WHY_NOT else ''}: {', '.join(names[:3])}"
            f"{f' and {len(names) - 3} more' if len(names) > 3 else ''}"
            for t, names in unsupported.items()
        )
        i_quants = " (I-quants need their codebooks; MLX has no such layer)" if any(
            t.startswith("IQ") for t in unsupported) else ""
        raise ModelLoadError(
            f"{header.path.name} holds tensor types mlxspec cannot load: {listed}{i_quants}. "
            f"Supported: {', '.join(SUPPORTED)}. Use a Q4_K_M, Q5_K_M, Q6_K or Q8_0 GGUF of this model."
        )
    return Counter(t.type for t in header.tensors)


# ---------------------------------------------------------------- model


def load_gguf(path: str | Path, context: int | None = None) -> tuple[nn.Module, TokenizerWrapper, dict]:
    """GGUF file -> (mlx-lm model with weights loaded and evaluated, mlx-lm TokenizerWrapper, config dict).
    `context`: the window to load for, where the file's rope depends on it (gguf_rope.py)."""
    path = Path(path)
    header = translate(read_header(path))  # Ollama's own layouts, as llama.cpp's converter writes them
    type_counts = _check_types(header)  # before any tensor data is read
    name, arch = archs.arch_for(header.metadata, path)
    weights, reports, rope_tensors = _read_weights(header, name, arch)

    tokens = header.metadata.get("tokenizer.ggml.tokens")
    vocab_size = len(tokens) if tokens is not None else weights["model.embed_tokens.weight"].shape[0]
    config = archs.model_config(name, arch, header.metadata, vocab_size, "lm_head.weight" not in weights, path,
                                attention_bias="model.layers.0.self_attn.q_proj.bias" in weights,
                                qk_norms="model.layers.0.self_attn.q_norm.weight" in weights, tensors=frozenset(weights))
    config["quantization"] = _quantization_config(weights)
    config["gguf_architecture"] = name  # what Ollama calls the family: "qwen3moe", "gemma3"
    config["gguf_file_type"] = header.metadata.get("general.file_type")
    config["gguf_tensor_types"] = dict(type_counts)
    config["gguf_conversion"] = conversion_summary(reports)

    model = _build_model(arch, config, weights, path)
    interleave_rope(arch, model, config)
    archs.use_gelu_tanh(arch, model)
    apply_file_rope(name, arch, model, config, rope_tensors, header.metadata, path, context)
    tokenizer = _build_tokenizer(header.metadata, path)
    return model, tokenizer, config


def _read_weights(header: Header, name: str, arch: archs.Arch):
    """Convert the tensors one by one from the memory-mapped file; only MLX arrays are kept. Blocks
    past the trunk (multi-token prediction: a drafter the model ships) are not read."""
    trunk = archs.trunk_layers(name, header.metadata)
    wanted = [t for t in header.tensors if not t.name.startswith(archs.IGNORED_PREFIXES) and archs.is_trunk(t.name, trunk)]
    heads = _delta_heads(name, header)
    unknown = [t.name for t in wanted if any(archs.mlx_name(arch, n) is None for n, _ in archs.unfused(t.name))
               and t.name not in ROPE_TENSORS and not _mla_part(arch, t.name)]
    if unknown:  # e.g. another MoE layout: not a model we can run right
        raise ModelLoadError(f"{header.path.name}: tensors mlxspec does not know how to map: {', '.join(unknown[:5])}")
    data = np.memmap(header.path, dtype=np.uint8, mode="r")
    weights, reports, rope_tensors, mla_parts = {}, {}, {}, {}
    for t in wanted:
        arrays, reports[t.name] = convert_tensor(data[t.offset : t.offset + t.n_bytes], t.type, t.shape)
        if _mla_part(arch, t.name):
            mx.eval(list(arrays.values()))  # before the file's memory map goes
            mla_parts[t.name] = arrays
            continue
        if archs.mlx_name(arch, t.name) is None and t.name in ROPE_TENSORS:  # the model's rope (gguf_rope.py)
            rope_tensors[t.name] = arrays["weight"]
            continue
        for part_name, part in _adapted_parts(arch, t.name, arrays, heads):
            target = archs.mlx_name(arch, part_name)
            stem = target.rsplit(".", 1)[0]
            for key, array in part.items():
                weights[target if key == "weight" else f"{stem}.{key}"] = array
    del data
    weights |= _joined_kv_b(mla_parts, header.path)
    return weights, reports, rope_tensors


def read_nextn_block(path: str | Path) -> tuple[str, archs.Arch, dict[str, dict]] | None:
    """A file's first multi-token-prediction block, the one past its trunk (a drafter trained with the model):
    (architecture name, Arch, {tensor name within the block, e.g. "attn_q.weight" or "nextn.eh_proj.weight":
    converted MLX arrays}); None when the file has none."""
    path = Path(path)
    header = translate(read_header(path))
    _check_types(header)
    name, arch = archs.arch_for(header.metadata, path)
    prefix = f"blk.{archs.trunk_layers(name, header.metadata)}."
    tensors = [t for t in header.tensors if t.name.startswith(prefix)]
    if not header.metadata.get(f"{name}.nextn_predict_layers") or not tensors:
        return None
    heads = _delta_heads(name, header)
    data = np.memmap(header.path, dtype=np.uint8, mode="r")
    block = {}
    for t in tensors:
        arrays, _ = convert_tensor(data[t.offset : t.offset + t.n_bytes], t.type, t.shape)
        for part_name, part in _adapted_parts(arch, t.name, arrays, heads):
            block[part_name[len(prefix):]] = part
    del data
    return name, arch, block


def _delta_heads(name: str, header: Header) -> delta_net.Heads | None:
    return delta_net.Heads.from_header(name, header) if name in delta_net.ARCHS else None


def _adapted_parts(arch: archs.Arch, gguf_name: str, arrays: dict, heads) -> list[tuple[str, dict]]:
    """A converted tensor's parts (a fused one's halves), the converter's conventions undone, evaluated
    before the file's memory map goes."""
    if heads is not None:
        arrays = delta_net.split_ba(gguf_name, arrays, heads)
    parts = [(name, archs.adapt_tensor(arch, name, part, heads)) for name, part in archs.unfused(gguf_name, arrays)]
    mx.eval([a for _, part in parts for a in part.values()])
    return parts


def _mla_part(arch: archs.Arch, name: str) -> bool:
    """llama.cpp's newer deepseek2 layout: each layer's kv_b as attn_k_b (transposed per head) and attn_v_b."""
    return arch.model_type == "deepseek_v2" and name.startswith("blk.") and name.split(".")[2] in ("attn_k_b", "attn_v_b")


def _joined_kv_b(parts: dict, path: Path) -> dict:
    """mlx-lm's kv_b_proj (heads * (nope + v), kv_lora) back from attn_k_b (heads, kv_lora, nope) and
    attn_v_b (heads, v, kv_lora), dequantized exactly into float32: the transpose would cut across
    quantization groups, so the joined projection stays unquantized (heads x (nope + v) x kv_lora values a layer)."""
    joined = {}
    for name in [n for n in parts if ".attn_k_b." in n]:
        v_name = name.replace("attn_k_b", "attn_v_b")
        if v_name not in parts:
            raise ModelLoadError(f"{path.name}: {name} without its {v_name}")
        k_b, v_b = _dense(parts[name]), _dense(parts[v_name])
        if k_b.ndim != 3 or v_b.ndim != 3 or k_b.shape[0] != v_b.shape[0] or k_b.shape[1] != v_b.shape[2]:
            raise ModelLoadError(f"{path.name}: {name} {k_b.shape} and {v_name} {v_b.shape} do not make a kv_b")
        kv_b = mx.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)  # (heads, nope + v, kv_lora)
        joined[f"model.layers.{name.split('.')[1]}.self_attn.kv_b_proj.weight"] = kv_b.reshape(-1, kv_b.shape[-1])
    return joined


def _dense(arrays: dict) -> mx.array:
    """A converted tensor as float32 values: MLX's affine triple dequantized, or the float array as is."""
    if "scales" not in arrays:
        return arrays["weight"].astype(mx.float32)
    if "biases" not in arrays:  # mxfp4
        return mx.dequantize(arrays["weight"], arrays["scales"], group_size=GROUP, bits=4, mode="mxfp4").astype(mx.float32)
    bits = arrays["weight"].shape[-1] * 32 // (arrays["scales"].shape[-1] * GROUP)
    return mx.dequantize(arrays["weight"], arrays["scales"].astype(mx.float32), arrays["biases"].astype(mx.float32),
                         group_size=GROUP, bits=bits)


def conversion_summary(reports: dict[str, TensorReport]) -> dict:
    """What `show` says: how many tensors loaded exactly (by type) and each requantized one's error."""
    exact = Counter(r.type for r in reports.values() if r.exact)
    requantized = {name: r.as_dict() for name, r in reports.items() if not r.exact}
    return {"exact": dict(exact), "requantized": requantized}


def layer_quantization(weights: dict, layer: str) -> dict | None:
    """{"group_size": 32, "bits": b} for a layer that arrived quantized (and "mode": "mxfp4" for
    MXFP4's exponent scales, which come without biases), else None.

    weight is uint32 (out, in * bits / 32) and scales (out, in / 32): so bits = their width ratio.
    """
    if f"{layer}.scales" not in weights:
        return None
    bits = weights[f"{layer}.weight"].shape[-1] // weights[f"{layer}.scales"].shape[-1]
    if weights[f"{layer}.scales"].dtype == mx.uint8:
        return {"group_size": GROUP, "bits": bits, "mode": "mxfp4"}
    return {"group_size": GROUP, "bits": bits}


def _quantization_config(weights: dict) -> dict | None:
    """mlx-lm's "quantization" config: the commonest setting, plus per-layer entries where a layer
    differs (a dict, or False for a plain one), the form mlx-lm's own loader reads back."""
    layers = sorted({k.rsplit(".", 1)[0] for k in weights if k.endswith(".weight") and weights[k].ndim >= 2})
    settings = {layer: layer_quantization(weights, layer) for layer in layers}
    counts = Counter((q["group_size"], q["bits"]) for q in settings.values() if q)
    if not counts:
        return None
    group_size, bits = counts.most_common(1)[0][0]
    main = {"group_size": group_size, "bits": bits}
    overrides = {layer: (q or False) for layer, q in settings.items() if q != main}
    return main | overrides


def _build_model(arch: archs.Arch, config: dict, weights: dict, path: Path) -> nn.Module:
    module = importlib.import_module(f"mlx_lm.models.{arch.module}")
    model = module.Model(module.ModelArgs.from_dict(config))
    # A quantized embedding (the token table; Gemma 4's per-layer one too) returns rows in its scales' dtype:
    # float16 would round the residual stream at its source (tiny-model logits off by ~5e-3). llama.cpp
    # dequantizes rows to float32; so do we.
    for key in [f"model.{t}.{part}" for t in ("embed_tokens", "embed_tokens_per_layer") for part in ("scales", "biases")]:
        if key in weights:
            weights[key] = weights[key].astype(mx.float32)
    if hasattr(model, "sanitize"):  # as mlx-lm's loader does: e.g. gemma3 drops its head when tied (qwen3_5
        weights = model.sanitize(weights)  # moves every name under language_model.)

    # Quantize exactly the layers that arrived quantized, each with its own bits (a quantized
    # token table becomes a QuantizedEmbedding, which also serves as the tied head via as_linear).
    def arrived_quantized(layer_path: str, module: nn.Module) -> dict | bool:
        return hasattr(module, "to_quantized") and layer_quantization(weights, layer_path) or False

    nn.quantize(model, class_predicate=arrived_quantized)
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:  # missing/extra/mis-shaped tensors: metadata and tensors disagree
        raise ModelLoadError(
            f"{path.name}: weights do not fit a {config['model_type']} model built from its metadata: {e}"
        ) from None
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

    from .gguf_tokenizer import (BOS_BY_DEFAULT, NO_BOS, build_backend, end_of_generation, pre_tokenizer_type,
                                 set_special_template)

    prefix = "tokenizer.ggml."
    vocab = {key[len(prefix):]: value for key, value in metadata.items() if key.startswith(prefix)}
    backend = build_backend(vocab, path.name)
    kind, tokens = vocab["model"], vocab["tokens"]

    def token(key):
        token_id = vocab.get(f"{key}_token_id")
        return (token_id, tokens[token_id]) if token_id is not None and token_id < len(tokens) else (None, None)

    (bos_id, bos), (eos_id, eos), (_, unk), (_, pad) = token("bos"), token("eos"), token("unknown"), token("padding")
    # llama.cpp's default when the file does not say: BOS for sentencepiece and llama-3 vocabularies.
    bos_default = kind in ("llama", "gemma4") or pre_tokenizer_type(vocab, path.name) in BOS_BY_DEFAULT
    add_bos = bool(vocab.get("add_bos_token", bos_default)) and bos is not None and vocab.get("pre") not in NO_BOS
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
        chat_template=metadata.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,  # decode must give back the text, spaces and all
    )

    if kind == "gpt2":
        detokenizer = BPEStreamingDetokenizer
    else:  # "llama" (build_backend refused the rest)
        # SPM: strip the leading space only when the tokenizer adds one.
        trim = bool(vocab.get("add_space_prefix", True))
        detokenizer = lambda tok: SPMStreamingDetokenizer(tok, trim_space=trim)  # noqa: E731
    return TokenizerWrapper(hf_tokenizer, detokenizer, eos_token_ids=end_of_generation(vocab))
