"""Tiny random GGUF models for tests, written with the `gguf` package (llama.cpp's own writer).

`write_tiny_llama_gguf(path, qtype="Q4_0")` gives a 2-layer llama (or qwen2) with a small byte-level
BPE vocabulary, a ChatML template, and every 2-D weight stored as `qtype`. Norms stay F32, as
llama.cpp writes them. `read_gguf_reference(path)` reads a file back with the `gguf` package's own
reader and dequantizer: float32 numpy weights under mlx-lm names, independent of `mlxspec.gguf`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

# Shapes: all multiples of 32 (the ggml block size); FFN 256 also fits the 256-wide K-quant blocks.
HIDDEN, LAYERS, FFN, HEADS, KV_HEADS = 64, 2, 256, 4, 2
CONTEXT, ROPE_BASE, RMS_EPS = 256, 10000.0, 1e-5


@dataclass(frozen=True)
class Dims:
    """Model shape; head_dim defaults to hidden / heads, rope_dims to head_dim."""

    hidden: int = HIDDEN
    layers: int = LAYERS
    ffn: int = FFN
    heads: int = HEADS
    kv_heads: int = KV_HEADS
    head_dim: int | None = None
    rope_dims: int | None = None
    experts: int = 8  # qwen3moe only: experts per layer, used per token, each one's FFN width
    experts_used: int = 2
    expert_ffn: int = 64
    nextn: int = 0  # qwen35: multi-token-prediction blocks after the layers (nextn_predict_layers)

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 (as in SmolLM2)
BOS_ID, EOS_ID = 1, 2

# Byte-level BPE merges (GPT-2 spelling: "Ġ" is a space). Each merge joins two existing tokens.
MERGES = [
    "Ġ t", "h e", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "a t", "e n", "Ġ w", "Ġt he", "o r",
    "Ġ o", "e s", "i s", "Ġ b", "a n", "l l", "Ġ c", "i t", "Ġ f", "Ġ m", "o u", "e d", "Ġ p",
    "in g", "Ġ h", "a r", "l o", "Ġ d", "Ġ l", "l e", "Ġ i", "h o", "Ġ n", "Ġa n", "Ġan d",
    "Ġo f", "Ġ is", "Ġw or", "l d", "Ġwor ld",
]

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# GGUF name -> mlx-lm llama name, written out here on purpose (not imported from mlxspec.gguf).
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.switch_mlp.gate_proj", "ffn_up_exps": "mlp.switch_mlp.up_proj",
    "ffn_down_exps": "mlp.switch_mlp.down_proj", "post_attention_norm": "post_attention_layernorm",
}


def byte_level_vocab() -> list[str]:
    """Specials, the 256 byte tokens in GPT-2's printable spelling, then one token per merge."""
    byte_tokens = [_bytes_to_unicode()[b] for b in range(256)]
    tokens = SPECIALS + byte_tokens
    for merge in MERGES:
        left, right = merge.split(" ")
        assert left in tokens and right in tokens, merge
        tokens.append(left + right)
    return tokens


# A sentencepiece ("llama") vocabulary: <unk> <s> </s>, the 256 byte-fallback tokens, then pieces.
SPM_SPECIALS = ["<unk>", "<s>", "</s>"]
SPM_PIECES = ["\u2581"] + list("abdehilnorstw") + [
    "he", "\u2581t", "\u2581the", "\u2581w", "or", "\u2581wor", "ld", "\u2581world",
    "an", "\u2581a", "\u2581an", "is", "\u2581is",
]


def sentencepiece_vocab() -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a small byte-fallback sentencepiece vocabulary."""
    tokens = SPM_SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES
    # Longer pieces score higher, so merges derived from scores build whole words.
    scores = [0.0] * (len(SPM_SPECIALS) + 256) + [float(len(p)) for p in SPM_PIECES]
    # 2 UNKNOWN, 3 CONTROL, 6 BYTE, 1 NORMAL (llama.cpp's token types).
    types = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES)
    return tokens, scores, types


def write_tiny_llama_gguf(
    path: str | Path,
    qtype: str = "Q4_0",
    seed: int = 0,
    *,
    arch: str = "llama",
    embed_qtype: str | None = None,
    output_qtype: str | None = None,
    type_overrides: dict[str, str] | None = None,
    add_bos: bool | None = False,
    tokenizer: str = "gpt2",
    pre: str = "smollm",
    dims: Dims = Dims(),
    metadata: dict[str, Any] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
) -> Path:
    """Write a tiny random GGUF model and return its path.

    qtype: ggml type of every 2-D weight ("Q4_0", "Q4_1", "Q8_0", "F16", "F32").
    embed_qtype: type of token_embd (default qtype). output_qtype: when given, write an untied
    `output.weight` of that type; otherwise the head is tied to the embedding.
    type_overrides: {gguf tensor name: type} for any tensor, e.g. {"blk.0.ffn_down.weight": "Q4_K"};
    types the `gguf` package cannot quantize (K-quants) get random bytes of the right size.
    arch: "llama", "qwen2" (adds q/k/v biases), "qwen3" (q/k norms), "gemma" (llama's tensors),
    "gemma2", "gemma3" (post norms; gemma3 also q/k norms), "starcoder2" (LayerNorms with biases,
    biased projections, an ungated up/down MLP; layer_norm_epsilon), "olmo2" (norms after attention and
    the MLP, none before; q/k norms over the whole projections), "phi3" (fused attn_qkv and gate+up in ffn_up),
    "stablelm" (llama's tensors with biased q/k/v and LayerNorms with biases), "qwen2vl", "qwen3vl", "qwen3vlmoe" (qwen2's, qwen3's and qwen3moe's text tensors; pass the multimodal rope's
    sections in metadata), "glm4" (biased q/k/v, norms before and after attention and the MLP, gate+up in ffn_up), "deepseek2"
    (DeepSeek-V2-Lite's layout: latent attention with attn_kv_b whole, a leading dense layer, then experts with
    shared ones; sizes in MLA; pass YaRN keys in metadata), "cohere2"
    (llama's tensors without ffn_norm, LayerNorms without biases; layer_norm_epsilon), "command-r" (cohere2's
    and Command R+'s per-head q/k LayerNorm weights), "nemotron" (LayerNorms with biases, an ungated up/down
    MLP) or "qwen3moe"
    (qwen3 attention; an F32 router and stacked experts, dims.experts of them, in every layer),
    "mixtral" (a "llama" file with qwen3moe's experts and llama's attention), "granitemoe" (llama's attention,
    qwen3moe's experts), "qwen35" / "qwen35moe" (Qwen3.5: delta-net layers, value heads in llama.cpp's tiled
    order, gated attention every DELTA["interval"]-th layer; the MoE's shared expert with its gate vector;
    "qwen35moe-fused": the experts' gate and up rows in one ffn_gate_up_exps; "qwen3next": qwen35moe's tensors
    with Hugging Face's grouped value heads and beta/alpha in one ssm_ba, plain NEOX rope) or
    "gpt-oss" (biased attention with a sink per head, a biased F32 router, MXFP4 experts with F32
    biases, post_attention_norm before the experts; pass the window and YaRN keys in metadata), with the
    tensors llama.cpp's converter writes for each; any other name writes llama tensors under that
    architecture name (for refusal tests).
    types the `gguf` package cannot quantize (K-quants) get random blocks whose fp16 scales are set
    so the weights have the same spread as the others.
    dims: the model's shape. metadata: extra `{arch}.KEY` values (int, float, str).
    extra_tensors: more F32 tensors by GGUF name, e.g. {"rope_freqs.weight": ...} (Llama 3.x rope scaling).
    tokenizer: "gpt2" (byte-level BPE, as SmolLM2) or "llama" (sentencepiece with byte fallback,
    BOS id 1, EOS id 2, no chat template). add_bos=None leaves the flag out of the file.
    pre: the gpt2 vocabulary's pre-tokenizer name (tokenizer.ggml.pre).
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens = byte_level_vocab() if tokenizer == "gpt2" else sentencepiece_vocab()[0]
    types = _tensor_types(len(tokens), qtype, embed_qtype, output_qtype, arch, type_overrides or {}, dims)

    # Mixtral: a llama file with experts; deepseek2-split: llama.cpp's newer deepseek2 layout (kv_b as k_b, v_b)
    file_arch = {"mixtral": "llama", "deepseek2-split": "deepseek2", "qwen35moe-fused": "qwen35moe"}.get(arch, arch)
    writer = gguf.GGUFWriter(str(path), file_arch)
    writer.add_name(f"tiny-{arch}-{qtype}")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(dims.hidden)
    writer.add_block_count(dims.layers + dims.nextn)  # qwen35: its MTP blocks after the layers
    writer.add_feed_forward_length(dims.expert_ffn if arch == "mixtral" else dims.ffn)  # Mixtral's: an expert's
    writer.add_head_count(dims.heads)
    writer.add_head_count_kv(dims.kv_heads)
    if arch in ("starcoder2", "cohere2", "command-r", "nemotron", "stablelm"):
        writer.add_layer_norm_eps(RMS_EPS)
    else:  # deepseek2: mlx-lm's module fixes its latent norms' epsilon at DeepSeek's 1e-6
        writer.add_layer_norm_rms_eps(1e-6 if arch.startswith("deepseek2") else RMS_EPS)
    writer.add_rope_dimension_count(dims.rope_dims or dims.hd)
    if dims.head_dim:
        writer.add_key_length(dims.head_dim)
        writer.add_value_length(dims.head_dim)
    if arch in ("qwen3moe", "gpt-oss", "mixtral", "granitemoe", "deepseek2", "deepseek2-split", "qwen3vlmoe", "qwen35moe",
                "qwen35moe-fused", "qwen3next"):
        writer.add_expert_count(dims.experts)
        writer.add_expert_used_count(dims.experts_used)
        writer.add_expert_feed_forward_length(dims.expert_ffn)
    if arch in ("deepseek2", "deepseek2-split"):  # DeepSeek-V2-Lite's layout, tiny: no q LoRA, a leading dense layer
        keys = DEEPSEEK2_KEYS | (DEEPSEEK2_SPLIT_KEYS if arch == "deepseek2-split" else {})
        for key, value in keys.items():
            (writer.add_uint32 if isinstance(value, int) else writer.add_float32)(f"deepseek2.{key}", value)
    if file_arch in ("qwen35", "qwen35moe", "qwen3next"):  # the delta-net layers' sizes
        d = DELTA
        metadata = ({"nextn_predict_layers": dims.nextn} if dims.nextn else {}) | {
                    "ssm.group_count": d["k_heads"], "ssm.time_step_rank": d["v_heads"], "ssm.state_size": d["k_dim"],
                    "ssm.inner_size": d["v_heads"] * d["v_dim"], "ssm.conv_kernel": d["conv"],
                    "full_attention_interval": d["interval"]} | (metadata or {})
        if file_arch != "qwen3next":  # Qwen3-Next's rope is plain NEOX rope
            # M-RoPE sections (llama.cpp requires them) under which llama.cpp's interleaved layout gives every
            # rotated pair of a text token its position, as Qwen3.5's [11, 11, 10, 0] does for its 32 pairs
            sections = [-(-((dims.rope_dims or dims.hd) // 2 - j) // 3) for j in range(3)] + [0]
            metadata = {"rope.dimension_sections": sections} | metadata
        if file_arch in ("qwen35moe", "qwen3next"):
            writer.add_uint32(f"{file_arch}.expert_shared_feed_forward_length", dims.expert_ffn)
    metadata = {"rope.freq_base": ROPE_BASE} | (metadata or {})
    for key, value in metadata.items():
        add = {int: writer.add_uint32, float: writer.add_float32, str: writer.add_string, list: writer.add_array}[type(value)]
        add(f"{file_arch}.{key}", value)
    if tokenizer == "gpt2":
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        # 3 is CONTROL (the specials), 1 is NORMAL.
        writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
        writer.add_token_merges(MERGES)
        writer.add_chat_template(CHATML)
    else:
        _, scores, token_types = sentencepiece_vocab()
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(token_types)
        writer.add_unk_token_id(0)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)

    for name, data in (extra_tensors or {}).items():
        writer.add_tensor(name, np.asarray(data, np.float32))
    for name, shape in _tensor_shapes(arch, len(tokens), output_qtype is not None, dims).items():
        # Scale like a trained model's weights so activations stay O(1) through both layers.
        data = rng.standard_normal(shape).astype(np.float32) * (1.0 if len(shape) == 1 else shape[-1] ** -0.5)
        if name.endswith("norm.weight"):
            data = 1.0 + 0.1 * data
        if name.endswith("ssm_a"):  # -exp(A_log): each head's state decays by exp(ssm_a * softplus(...)) a step
            data = -np.exp(rng.uniform(-2.0, 0.5, shape)).astype(np.float32)
        _add_tensor(writer, name, data, types[name], rng)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def read_gguf_reference(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(float32 weights under mlx-lm names, {gguf name: ggml type}) via the `gguf` package alone."""
    reader = gguf.GGUFReader(str(path))
    weights, types = {}, {}
    for t in reader.tensors:
        types[t.name] = t.tensor_type.name
        # ggml lists dims fastest-first; numpy wants them slowest-first.
        shape = tuple(int(d) for d in reversed(t.shape))
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        weights[_mlx_name(t.name)] = values.reshape(shape)
    return weights, types


def _tensor_shapes(arch: str, vocab: int, untied: bool, dims: Dims = Dims()) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> numpy shape (out_features, in_features) for a tiny model."""
    hidden, hd, q_rows, kv_rows = dims.hidden, dims.hd, dims.heads * dims.hd, dims.kv_heads * dims.hd
    shapes = {"token_embd.weight": (vocab, hidden)}
    for i in range(dims.layers):
        b = f"blk.{i}"
        if arch != "olmo2":  # olmo2 norms after attention and the MLP, not before
            shapes[f"{b}.attn_norm.weight"] = (hidden,)
        if arch == "gpt-oss":
            shapes |= _gpt_oss_block(b, dims)
            continue
        if arch in ("deepseek2", "deepseek2-split"):
            shapes |= _deepseek2_block(b, i, dims, split=arch == "deepseek2-split")
            continue
        if arch.startswith(("qwen35", "qwen3next")):  # qwen35moe-fused: its experts' gate and up rows in one tensor
            shapes |= _qwen35_block(b, i, dims, moe=arch != "qwen35", fused=arch.endswith("-fused"),
                                    ba=arch == "qwen3next")
            continue
        if arch == "phi3":
            shapes[f"{b}.attn_qkv.weight"] = (q_rows + 2 * kv_rows, hidden)
        else:
            shapes |= {f"{b}.attn_q.weight": (q_rows, hidden), f"{b}.attn_k.weight": (kv_rows, hidden),
                       f"{b}.attn_v.weight": (kv_rows, hidden)}
        shapes[f"{b}.attn_output.weight"] = (hidden, q_rows)
        if arch in ("qwen2", "starcoder2", "glm4", "qwen2vl", "qwen25vl", "stablelm"):
            shapes |= {f"{b}.attn_q.bias": (q_rows,), f"{b}.attn_k.bias": (kv_rows,), f"{b}.attn_v.bias": (kv_rows,)}
        if arch == "nemotron":  # LayerNorms with biases, an ungated up/down MLP
            shapes |= {f"{b}.attn_norm.bias": (hidden,), f"{b}.ffn_norm.weight": (hidden,), f"{b}.ffn_norm.bias": (hidden,),
                       f"{b}.ffn_up.weight": (dims.ffn, hidden), f"{b}.ffn_down.weight": (hidden, dims.ffn)}
            continue
        if arch == "starcoder2":
            shapes |= {f"{b}.attn_norm.bias": (hidden,), f"{b}.attn_output.bias": (hidden,), f"{b}.ffn_norm.bias": (hidden,),
                       f"{b}.ffn_up.weight": (dims.ffn, hidden), f"{b}.ffn_up.bias": (dims.ffn,),
                       f"{b}.ffn_down.weight": (hidden, dims.ffn), f"{b}.ffn_down.bias": (hidden,),
                       f"{b}.ffn_norm.weight": (hidden,)}
            continue
        if arch in ("qwen3", "gemma3", "qwen3moe", "qwen3vl", "qwen3vlmoe"):
            shapes |= {f"{b}.attn_q_norm.weight": (hd,), f"{b}.attn_k_norm.weight": (hd,)}
        if arch == "command-r":  # Command R+: a LayerNorm per head, one weight row each
            shapes |= {f"{b}.attn_q_norm.weight": (dims.heads, hd), f"{b}.attn_k_norm.weight": (dims.kv_heads, hd)}
        if arch == "olmo2":  # over the whole projections
            shapes |= {f"{b}.attn_q_norm.weight": (q_rows,), f"{b}.attn_k_norm.weight": (kv_rows,)}
        if arch in ("gemma2", "gemma3", "olmo2", "glm4"):
            shapes[f"{b}.post_attention_norm.weight"] = (hidden,)
        if arch == "stablelm":  # LayerNorms with biases
            shapes |= {f"{b}.attn_norm.bias": (hidden,), f"{b}.ffn_norm.bias": (hidden,)}
        if arch not in ("olmo2", "cohere2", "command-r"):  # the cohere family: the MLP reads the attention's norm
            shapes[f"{b}.ffn_norm.weight"] = (hidden,)
        if arch in ("phi3", "glm4"):
            shapes[f"{b}.ffn_up.weight"] = (2 * dims.ffn, hidden)  # gate rows, then up rows
        elif arch in ("qwen3moe", "mixtral", "granitemoe", "qwen3vlmoe"):
            e, f = dims.experts, dims.expert_ffn
            shapes |= {f"{b}.ffn_gate_inp.weight": (e, hidden), f"{b}.ffn_gate_exps.weight": (e, f, hidden),
                       f"{b}.ffn_up_exps.weight": (e, f, hidden), f"{b}.ffn_down_exps.weight": (e, hidden, f)}
            continue
        else:
            shapes |= {f"{b}.ffn_gate.weight": (dims.ffn, hidden), f"{b}.ffn_up.weight": (dims.ffn, hidden)}
        shapes[f"{b}.ffn_down.weight"] = (hidden, dims.ffn)
        if arch in ("gemma2", "gemma3", "olmo2", "glm4"):
            shapes[f"{b}.post_ffw_norm.weight"] = (hidden,)
    for i in range(dims.layers, dims.layers + dims.nextn):  # qwen35's MTP: an attention block and its own tensors
        b = f"blk.{i}"
        shapes |= {f"{b}.attn_norm.weight": (hidden,)} | _qwen35_block(b, DELTA["interval"] - 1, dims, moe=arch != "qwen35")
        shapes |= {f"{b}.nextn.eh_proj.weight": (hidden, 2 * hidden), f"{b}.nextn.enorm.weight": (hidden,),
                   f"{b}.nextn.hnorm.weight": (hidden,), f"{b}.nextn.shared_head_norm.weight": (hidden,)}
    shapes["output_norm.weight"] = (hidden,)
    if arch in ("starcoder2", "nemotron", "stablelm"):
        shapes["output_norm.bias"] = (hidden,)
    if untied:
        shapes["output.weight"] = (vocab, hidden)
    return shapes


# deepseek2 (MLA) sizes, and its keys beyond the common ones: the leading dense layer, shared experts (2 of
# the expert FFN's width, fused as the converter writes them), the latent ranks and the per-head sizes
MLA = dict(kv_lora=64, nope=32, rope=16, v=16, shared=2)
DEEPSEEK2_KEYS = {"leading_dense_block_count": 1, "expert_shared_count": MLA["shared"], "expert_weights_scale": 1.0,
                  "attention.kv_lora_rank": MLA["kv_lora"], "attention.key_length": MLA["nope"] + MLA["rope"],
                  "attention.value_length": MLA["v"]}
# llama.cpp's newer converter: kv_b split for the absorbed form, which its head sizes then describe
DEEPSEEK2_SPLIT_KEYS = {"attention.key_length": MLA["kv_lora"] + MLA["rope"], "attention.value_length": MLA["kv_lora"],
                        "attention.key_length_mla": MLA["nope"] + MLA["rope"], "attention.value_length_mla": MLA["v"]}


def _deepseek2_block(b: str, i: int, dims: Dims, split: bool = False) -> dict[str, tuple[int, ...]]:
    hidden, heads, e, f = dims.hidden, dims.heads, dims.experts, dims.expert_ffn
    qk, kv = MLA["nope"] + MLA["rope"], MLA["kv_lora"]
    shapes = {f"{b}.attn_norm.weight": (hidden,), f"{b}.attn_q.weight": (heads * qk, hidden),
              f"{b}.attn_kv_a_mqa.weight": (kv + MLA["rope"], hidden), f"{b}.attn_kv_a_norm.weight": (kv,),
              f"{b}.attn_output.weight": (hidden, heads * MLA["v"]), f"{b}.ffn_norm.weight": (hidden,)}
    if split:  # k_b transposed per head (kv_lora rows of nope), v_b as kv_b's v rows
        shapes |= {f"{b}.attn_k_b.weight": (heads, kv, MLA["nope"]), f"{b}.attn_v_b.weight": (heads, MLA["v"], kv)}
    else:
        shapes[f"{b}.attn_kv_b.weight"] = (heads * (MLA["nope"] + MLA["v"]), kv)
    if i < DEEPSEEK2_KEYS["leading_dense_block_count"]:
        return shapes | {f"{b}.ffn_gate.weight": (dims.ffn, hidden), f"{b}.ffn_up.weight": (dims.ffn, hidden),
                         f"{b}.ffn_down.weight": (hidden, dims.ffn)}
    sf = f * MLA["shared"]
    return shapes | {f"{b}.ffn_gate_inp.weight": (e, hidden), f"{b}.ffn_gate_exps.weight": (e, f, hidden),
                     f"{b}.ffn_up_exps.weight": (e, f, hidden), f"{b}.ffn_down_exps.weight": (e, hidden, f),
                     f"{b}.ffn_gate_shexp.weight": (sf, hidden), f"{b}.ffn_up_shexp.weight": (sf, hidden),
                     f"{b}.ffn_down_shexp.weight": (hidden, sf)}


# qwen35's gated delta-net layers: key heads, value heads (4 over 2: llama.cpp's tiled order matters), their
# dims (a value head of 32: whole quantization groups), the conv width, and every 2nd layer full attention
DELTA = dict(k_heads=2, v_heads=4, k_dim=32, v_dim=32, conv=4, interval=2)  # llama.cpp: k dim = v dim


def _qwen35_block(b: str, i: int, dims: Dims, moe: bool, fused: bool = False, ba: bool = False) -> dict[str, tuple[int, ...]]:
    """Qwen3.5's layout: a delta-net layer (fused q/k/v rows, the z gate, alpha/beta per value head, the conv,
    A and dt, a gated norm) or a gated attention layer (q rows carry each head's gate), then the FFN.
    `ba`: Qwen3-Next's, beta and alpha in one ssm_ba (per key head: its value heads' betas, then alphas)."""
    hidden, d, hd = dims.hidden, DELTA, dims.hd
    shapes = {f"{b}.post_attention_norm.weight": (hidden,)}
    if (i + 1) % d["interval"]:
        conv, value, v = 2 * d["k_heads"] * d["k_dim"] + d["v_heads"] * d["v_dim"], d["v_heads"] * d["v_dim"], d["v_heads"]
        beta_alpha = ({f"{b}.ssm_ba.weight": (2 * v, hidden)} if ba else
                      {f"{b}.ssm_beta.weight": (v, hidden), f"{b}.ssm_alpha.weight": (v, hidden)})
        shapes |= {f"{b}.attn_qkv.weight": (conv, hidden), f"{b}.attn_gate.weight": (value, hidden),
                   f"{b}.ssm_conv1d.weight": (conv, d["conv"]), f"{b}.ssm_dt.bias": (v,), f"{b}.ssm_a": (v,),
                   **beta_alpha, f"{b}.ssm_norm.weight": (d["v_dim"],), f"{b}.ssm_out.weight": (hidden, value)}
    else:
        shapes |= {f"{b}.attn_q.weight": (2 * dims.heads * hd, hidden), f"{b}.attn_k.weight": (dims.kv_heads * hd, hidden),
                   f"{b}.attn_v.weight": (dims.kv_heads * hd, hidden), f"{b}.attn_output.weight": (hidden, dims.heads * hd),
                   f"{b}.attn_q_norm.weight": (hd,), f"{b}.attn_k_norm.weight": (hd,)}
    if not moe:
        return shapes | {f"{b}.ffn_gate.weight": (dims.ffn, hidden), f"{b}.ffn_up.weight": (dims.ffn, hidden),
                         f"{b}.ffn_down.weight": (hidden, dims.ffn)}
    e, f = dims.experts, dims.expert_ffn
    experts = ({f"{b}.ffn_gate_up_exps.weight": (e, 2 * f, hidden)} if fused else
               {f"{b}.ffn_gate_exps.weight": (e, f, hidden), f"{b}.ffn_up_exps.weight": (e, f, hidden)})
    return shapes | experts | {f"{b}.ffn_gate_inp.weight": (e, hidden), f"{b}.ffn_down_exps.weight": (e, hidden, f),
                     f"{b}.ffn_gate_shexp.weight": (f, hidden), f"{b}.ffn_up_shexp.weight": (f, hidden),
                     f"{b}.ffn_down_shexp.weight": (hidden, f), f"{b}.ffn_gate_inp_shexp.weight": (hidden,)}


def _gpt_oss_block(b: str, dims: Dims) -> dict[str, tuple[int, ...]]:
    hidden, q_rows, kv_rows = dims.hidden, dims.heads * dims.hd, dims.kv_heads * dims.hd
    e, f = dims.experts, dims.expert_ffn
    shapes = {f"{b}.attn_norm.weight": (hidden,)}
    for name, rows in (("attn_q", q_rows), ("attn_k", kv_rows), ("attn_v", kv_rows)):
        shapes |= {f"{b}.{name}.weight": (rows, hidden), f"{b}.{name}.bias": (rows,)}
    shapes |= {f"{b}.attn_output.weight": (hidden, q_rows), f"{b}.attn_output.bias": (hidden,),
               f"{b}.attn_sinks.weight": (dims.heads,), f"{b}.post_attention_norm.weight": (hidden,),
               f"{b}.ffn_gate_inp.weight": (e, hidden), f"{b}.ffn_gate_inp.bias": (e,)}
    for name, shape in (("ffn_gate_exps", (e, f, hidden)), ("ffn_up_exps", (e, f, hidden)),
                        ("ffn_down_exps", (e, hidden, f))):
        shapes |= {f"{b}.{name}.weight": shape, f"{b}.{name}.bias": shape[:2]}
    return shapes


def _tensor_types(vocab, qtype, embed_qtype, output_qtype, arch, overrides, dims=Dims()) -> dict[str, str]:
    types = {}
    for name, shape in _tensor_shapes(arch, vocab, output_qtype is not None, dims).items():
        # routers, norms and biases stay F32, as llama.cpp keeps them; gpt-oss experts come as MXFP4
        plain = len(shape) == 1 or name.endswith(("ffn_gate_inp.weight", "norm.weight", ".bias", "ssm_conv1d.weight"))
        types[name] = "F32" if plain else ("MXFP4" if arch == "gpt-oss" and "_exps." in name else qtype)
    types["token_embd.weight"] = embed_qtype or qtype
    if output_qtype is not None:
        types["output.weight"] = output_qtype
    unknown = set(overrides) - set(types)
    assert not unknown, f"no such tensors: {unknown}"
    return types | overrides


def _add_tensor(writer: gguf.GGUFWriter, name: str, data: np.ndarray, type_name: str, rng) -> None:
    qt = QT[type_name]
    if qt == QT.F32:
        writer.add_tensor(name, data)
    elif qt == QT.F16:
        writer.add_tensor(name, data.astype(np.float16))
    else:
        try:
            raw = gguf.quants.quantize(data, qt)  # uint8 (rows, bytes per row)
        except NotImplementedError:  # no Python quantizer for this type (K-quants, I-quants)
            raw = random_blocks(type_name, data.shape, rng, std=float(np.std(data)))
        writer.add_tensor(name, raw, raw_dtype=qt)


# Byte offsets of the fp16 super-block scales (d, and dmin where there is one) in K-quant blocks.
K_SCALE_OFFSETS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(type_name: str, shape: tuple[int, ...], rng, std: float = 0.1) -> np.ndarray:
    """Random blocks of a type (uint8, gguf's byte shape). Any bytes are valid codes and sub-block
    scales; the fp16 d/dmin of K-quants are then set (varying +-50% per block) so the weights'
    RMS is `std`. Other types (I-quants...) keep random bytes: they are only ever refused."""
    qt = QT[type_name]
    raw = rng.integers(0, 256, size=gguf.quants.quant_shape_to_byte_shape(shape, qt), dtype=np.uint8)
    if type_name not in K_SCALE_OFFSETS:
        return raw
    block_bytes = gguf.GGML_QUANT_SIZES[qt][1]
    blocks = raw.reshape(-1, block_bytes)
    d = (0.5 + rng.random(len(blocks))).astype(np.float16)
    for offset in K_SCALE_OFFSETS[type_name]:
        blocks[:, offset : offset + 2] = d.view(np.uint8).reshape(-1, 2)
    rms = float(np.sqrt(np.mean(gguf.quants.dequantize(raw, qt).astype(np.float64) ** 2)))
    d = (d.astype(np.float32) * std / rms).astype(np.float16)  # dequantization is linear in d, dmin
    for offset in K_SCALE_OFFSETS[type_name]:
        blocks[:, offset : offset + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw


def _mlx_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{parts[3]}"
    top = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
    return f"{top[parts[0]]}.{parts[1]}"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the spelling byte-level BPE vocabularies use)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table
