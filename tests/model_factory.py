"""Tiny random models written to disk in the real mlx-lm / Hugging Face format.

`make_model_dir(path, arch="llama")` writes config.json, model.safetensors and a byte-level BPE
tokenizer (trained here on a few sentences) so the real loader (`mlxspec.loading.load`) reads it
exactly as it would read a downloaded model.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

CORPUS = [
    "Once upon a time there was a little robot who loved to count.",
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. The dog sleeps.",
    "Speculative decoding drafts tokens and the target verifies them in one pass.",
    "Hello world! How are you today? I am fine, thank you.",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

ARCH_CONFIGS = {
    "llama": {"model_type": "llama", "rope_traditional": False, "tie_word_embeddings": False},
    "qwen2": {"model_type": "qwen2", "tie_word_embeddings": True},
    # Qwen3-Next's hybrid: gated delta-net layers (a recurrent state, mlx-lm's ArraysCache) between
    # attention layers (every 2nd here), mixture-of-experts FFNs
    "qwen3_next": {"model_type": "qwen3_next", "linear_num_value_heads": 4, "linear_num_key_heads": 2,
                   "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
                   "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
                   "shared_expert_intermediate_size": 64, "mlp_only_layers": [], "moe_intermediate_size": 64,
                   "partial_rotary_factor": 0.25, "head_dim": 16, "full_attention_interval": 2},
    # Granite 4.0-H's hybrid: Mamba-2 mixers (mlx-lm's ssm_update) between attention layers, experts; 4 layers
    "granitemoehybrid": {"model_type": "granitemoehybrid", "attention_bias": False, "embedding_multiplier": 2.0,
                         "attention_multiplier": 0.125, "logits_scaling": 4.0, "residual_multiplier": 0.5,
                         "layer_types": ["mamba", "attention", "mamba", "attention"], "num_local_experts": 4,
                         "num_experts_per_tok": 2, "shared_intermediate_size": 64, "mamba_n_heads": 8,
                         "mamba_d_head": 16, "mamba_proj_bias": False, "mamba_d_state": 16, "mamba_d_conv": 4,
                         "mamba_n_groups": 1, "mamba_conv_bias": True, "mamba_expand": 2},
}


def write_tokenizer(path: Path, vocab_size: int = 320) -> int:
    """Train a byte-level BPE on CORPUS and save it as an HF fast tokenizer; returns its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token=None,
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))
    return tok.get_vocab_size()


def make_model_dir(
    path: str | Path,
    arch: str = "llama",
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    seed: int = 0,
    scale: float = 0.6,
) -> Path:
    """A random `arch` model with a real tokenizer at `path`; returns the path.

    `scale` multiplies the random weights: larger values give peakier (more decisive) logits,
    so greedy ties between near-equal logits are rare.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(path)
    eos_id = SPECIAL.index("<|im_end|>")  # trainers put special tokens first, in order
    config = {
        **ARCH_CONFIGS[arch],
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "max_position_embeddings": 1024,
        "rope_theta": 10000.0,
        "eos_token_id": eos_id,
    }
    write_weights(path, config, seed, scale)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5, "max_position_embeddings": 1024,
         "rope_theta": 10000.0}


def config_dir(path: Path, **config) -> Path:
    """A random mlx-lm model of SMALL's size and this config (model_type and its own keys) at `path`."""
    path.mkdir(parents=True, exist_ok=True)
    config = SMALL | config | {"vocab_size": write_tokenizer(path), "eos_token_id": 1}
    if "text_config" in config:  # a multimodal wrapper: its text model reads its own vocabulary size
        config["text_config"] = {"vocab_size": config["vocab_size"]} | config["text_config"]
    write_weights(path, config, 3, 0.6)
    (path / "config.json").write_text(json.dumps(config))
    return path


ARCHITECTURES = {  # name -> a function of a folder that writes a random model of that kind there and returns it
    "qwen3_next": lambda d: make_model_dir(d, "qwen3_next", layers=4, seed=3),  # gated delta nets + attention
    "granite-h": lambda d: make_model_dir(d, "granitemoehybrid", layers=4, seed=3),  # Mamba-2 + attention
    "gemma3": lambda d: config_dir(d, model_type="gemma3_text", sliding_window=8, sliding_window_pattern=2,
                                   query_pre_attn_scalar=16, rope_local_base_freq=1e4),
    "gpt_oss": lambda d: config_dir(d, model_type="gpt_oss", num_local_experts=4, num_experts_per_tok=2,
                                    sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
    "qwen3_moe": lambda d: config_dir(d, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                                      decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
                                      moe_intermediate_size=32, tie_word_embeddings=False),
    "glm4_moe": lambda d: config_dir(d, model_type="glm4_moe", moe_intermediate_size=32, norm_topk_prob=True, n_group=2,
                                     topk_group=1, n_shared_experts=1, n_routed_experts=8, routed_scaling_factor=1.5,
                                     num_experts_per_tok=2, first_k_dense_replace=1, rope_scaling=None,
                                     use_qk_norm=True, tie_word_embeddings=False, attention_bias=True,
                                     partial_rotary_factor=0.5),  # a raw-weight router (kernels/rowwise.py)
}


def build_model(config: dict, seed: int = 0, scale: float = 0.6):
    """An mlx-lm model of `config` with seeded random weights (mlx-lm's own classes)."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    mx.random.seed(seed)
    params = tree_flatten(model.parameters())
    model.load_weights(
        [(k, (mx.random.normal(v.shape) * scale / (v.shape[-1] if v.ndim else 1) ** 0.25).astype(mx.float32))
         for k, v in params]
    )
    mx.eval(model.parameters())
    return model


def write_weights(path: Path, config: dict, seed: int, scale: float) -> None:
    model = build_model(config, seed, scale)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))


# Qwen3.5 as its original checkpoints come (Qwen/Qwen3.5-*): a multi-token-prediction block beside the
# model (`mtp.*`), RMSNorm weights zero-centred (the norm multiplies by 1 + w), conv1d as (C, 1, K), MoE
# experts fused (`experts.gate_up_proj`), the mtp tensors in a shard of their own behind an index.
QWEN35_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 32, "linear_num_value_heads": 4, "linear_num_key_heads": 2,
               "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
               "full_attention_interval": 2, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
               "max_position_embeddings": 1024, "mtp_num_hidden_layers": 1,
               "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}}
QWEN35_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
              "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1, "norm_topk_prob": True}
ZERO_CENTRED = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight",
                "model.norm.weight", "mtp.norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")


def make_qwen35_checkpoint(path: str | Path, moe: bool = False, seed: int = 0, scale: float = 0.6,
                           dtype: mx.Dtype | None = None) -> Path:
    """A random Qwen3.5 (dense or MoE) in the original checkpoint's layout, with its mtp block; returns the path.
    `dtype`: bfloat16 as released, but float32 for MoE by default (MLX's CPU gather_mm takes only float32)."""
    dtype = dtype or (mx.float32 if moe else mx.bfloat16)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(path)
    kind = "qwen3_5_moe" if moe else "qwen3_5"
    text = {**QWEN35_TEXT, **(QWEN35_MOE if moe else {}), "model_type": f"{kind}_text", "vocab_size": vocab}
    config = {"model_type": kind, "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text,
              "tie_word_embeddings": False, "eos_token_id": SPECIAL.index("<|im_end|>")}
    model = build_model(config, seed, scale)
    trunk = {_original_name(k): v.astype(dtype) for k, v in tree_flatten(model.parameters())}
    shards = {"model-00001-of-00002.safetensors": _fused_experts(trunk),
              "model-00002-of-00002.safetensors": _fused_experts(random_block(model, seed + 1, scale, dtype))}
    for name, tensors in shards.items():
        tensors = {k: (v - 1.0 if k.endswith(ZERO_CENTRED) else v) for k, v in tensors.items()}
        mx.save_safetensors(str(path / name), tensors, metadata={"format": "pt"})
    _write_index(path, shards)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def add_original_mtp_block(path: Path, seed: int = 1, scale: float = 0.6) -> Path:
    """Beside a make_model_dir("qwen3_next") model, a block as Qwen3-Next's original checkpoint holds it:
    mtp.* in a shard of its own (zero-centred norms, one tensor per expert), both files behind an index."""
    config = json.loads((path / "config.json").read_text())
    block = {}
    for k, v in random_block(build_model(config), seed, scale, mx.float32).items():
        if ".switch_mlp." in k:  # (experts, out, in) -> one (out, in) tensor per expert
            prefix, proj = k.split(".switch_mlp.")
            block.update({f"{prefix}.experts.{e}.{proj}": v[e] for e in range(v.shape[0])})
        else:
            block[k] = v - 1.0 if k.endswith(ZERO_CENTRED) else v
    mx.save_safetensors(str(path / "mtp.safetensors"), block, metadata={"format": "pt"})
    _write_index(path, {"model.safetensors": mx.load(str(path / "model.safetensors")), "mtp.safetensors": block})
    return path


def random_block(model, seed: int, scale: float, dtype) -> dict:
    """A random mtp block for `model` under the original checkpoint's names (mtp.*), mlx-lm's expert layout."""
    from mlxspec.heads.mtp import MtpHead, attention_layer

    index, layer = attention_layer(model)
    args = getattr(model, "language_model", model).args
    block = MtpHead(args.hidden_size, args.rms_norm_eps, type(layer)(args, layer_idx=index), args.vocab_size)
    mx.random.seed(seed)
    block.load_weights([(k, (mx.random.normal(v.shape) * scale / (v.shape[-1] ** 0.25)).astype(dtype))
                        for k, v in tree_flatten(block.parameters())])
    return {"mtp." + _original_block_name(k): v for k, v in tree_flatten(block.parameters())}


def _write_index(path: Path, shards: dict) -> None:
    weight_map = {k: name for name, tensors in shards.items() for k in tensors}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _original_name(key: str) -> str:
    """mlx-lm's name -> the checkpoint's (conv1d reshaped by _fused_experts' caller)."""
    if key.startswith("language_model.model."):
        return "model.language_model." + key[len("language_model.model."):]
    return key.removeprefix("language_model.")


def _original_block_name(key: str) -> str:
    """MtpHead's name -> the checkpoint's, without the mtp. prefix."""
    names = {"eh_proj": "fc", "enorm": "pre_fc_norm_embedding", "hnorm": "pre_fc_norm_hidden", "norm": "norm"}
    first, _, rest = key.partition(".")
    return f"layers.0.{rest}" if first == "layer" else f"{names[first]}.{rest}"


def _fused_experts(tensors: dict) -> dict:
    """mlx-lm's SwitchGLU experts -> the checkpoint's fused ones; conv1d (C, K, 1) -> (C, 1, K)."""
    out = {}
    for k, v in tensors.items():
        if ".switch_mlp." in k:
            prefix, proj = k.split(".switch_mlp.")
            if proj.startswith("gate_proj"):
                up = tensors[f"{prefix}.switch_mlp.up_proj.weight"]
                out[f"{prefix}.experts.gate_up_proj"] = mx.concatenate([v, up], axis=-2)
            elif proj.startswith("down_proj"):
                out[f"{prefix}.experts.down_proj"] = v
        elif k.endswith("conv1d.weight"):
            out[k] = v.moveaxis(1, 2)
        else:
            out[k] = v
    return out


def split_mtp_folder(checkpoint: Path, path: str | Path, bits: int | None = None, group_size: int = 32) -> Path:
    """The checkpoint's mtp block as mlx-vlm's splitter writes a drafter folder (model_type qwen3_5_mtp): the
    prefix off, norms made 1 + w, experts as SwitchGLU's, quantized when `bits` is given."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = json.loads((checkpoint / "config.json").read_text())
    raw = mx.load(str(checkpoint / "model-00002-of-00002.safetensors"))
    tensors = {}
    for k, v in raw.items():
        k = k.removeprefix("mtp.")
        v = v + 1.0 if k.endswith(("norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")) else v
        if k.endswith("experts.gate_up_proj"):
            gate, up = mx.split(v, 2, axis=-2)
            stem = k[: -len("experts.gate_up_proj")]
            tensors[stem + "switch_mlp.gate_proj.weight"], tensors[stem + "switch_mlp.up_proj.weight"] = gate, up
        elif k.endswith("experts.down_proj"):
            tensors[k[: -len("experts.down_proj")] + "switch_mlp.down_proj.weight"] = v
        else:
            tensors[k] = v
    draft = {"model_type": "qwen3_5_mtp", "text_config": config["text_config"], "block_size": 3,
             "tie_word_embeddings": False}
    if bits:
        for k in [k for k in tensors if k.endswith(".weight") and tensors[k].ndim >= 2]:
            wq, scales, biases = mx.quantize(tensors[k], group_size=group_size, bits=bits)
            stem = k[: -len(".weight")]
            tensors[k], tensors[stem + ".scales"], tensors[stem + ".biases"] = wq, scales, biases
        draft["quantization"] = {"group_size": group_size, "bits": bits, "mode": "affine"}
    mx.save_safetensors(str(path / "model.safetensors"), tensors, metadata={"format": "mlx"})
    (path / "config.json").write_text(json.dumps(draft, indent=1))
    return path


def make_gemma4_dir(path: str | Path, layers: int = 8, seed: int = 1, moe: bool = False) -> Path:
    """A random Gemma 4 text model (mlx-lm's gemma4: sliding and global layers, KV-shared last layers,
    per-layer inputs, final logit softcapping; MoE blocks when `moe`), saved as mlx-lm saves one."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(path)
    text = {"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": layers, "intermediate_size": 128,
            "num_attention_heads": 4, "head_dim": 16, "global_head_dim": 32, "num_key_value_heads": 2,
            "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": vocab,
            "sliding_window": 16, "sliding_window_pattern": 3, "max_position_embeddings": 1024}
    if moe:
        text |= {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32}
    config = {"model_type": "gemma4", "text_config": text, "vocab_size": vocab, "eos_token_id": SPECIAL.index("<|im_end|>")}
    model = build_model(config, seed, 0.6)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def random_head(model, path, seed: int = 0, vocab: int | None = None) -> Path:
    """An untrained EAGLE head (random weights) for `model`, saved at `path`: exactness must not depend on
    training (tests, benchmarks/fuzz_exactness.py)."""
    from mlxspec.heads import eagle, files

    mx.random.seed(seed)
    head = eagle.EagleHead(eagle.block_config(model))
    rows = eagle.DraftHead(model, mx.arange(1)).module_rows
    ids = mx.arange(rows if vocab is None else vocab, dtype=mx.int32)
    config = {"target_sha256": files.identity(model), "target": "test", "block": eagle.block_config(model)}
    return eagle.save(path, head, ids, config)

