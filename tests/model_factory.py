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


def build_model(config: dict, seed: int = 0, scale: float = 0.6):
    """An mlx-lm model of `config` with seeded random weights (mlx-lm's own classes)."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    mx.random.seed(seed)
    params = tree_flatten(model.parameters())
    model.load_weights(
        [(k, (mx.random.normal(v.shape) * scale / (v.shape[-1] ** 0.25)).astype(mx.float32)) for k, v in params]
    )
    mx.eval(model.parameters())
    return model


def write_weights(path: Path, config: dict, seed: int, scale: float) -> None:
    model = build_model(config, seed, scale)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
