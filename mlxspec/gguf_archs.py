"""GGUF architectures -> mlx-lm model code: tensor names, config from metadata, per-arch quirks.

Each architecture runs on mlx-lm's own model class (mlx_lm.models.<module>); only names, config
and the conventions llama.cpp's converter applied are mapped here (llama.cpp is the reference for
what the metadata means: src/llama-model.cpp, convert_hf_to_gguf.py):

- rope: llama.cpp's converter permutes llama's q/k rows for its "normal" (interleaved) rope, which
  is MLX's rope_traditional=True, so llama-family weights load unpermuted; qwen2/qwen3/gemma*/phi3
  use NEOX rope (halves), rope_traditional=False.
- Llama 3.x rope scaling is the `rope_freqs` tensor (a divisor per frequency): it replaces the
  rope of every layer with one built from it, as llama.cpp applies it; Phi-3/4's LongRoPE factor
  tensors likewise (gguf_rope.py).
- gemma*: the converter stores RMSNorm weights as 1 + w; mlx-lm's Gemma RMSNorm adds the 1 itself.
- gemma2/gemma3 query scale: 1/sqrt(head_dim), except the 27B sizes' 1/sqrt(hidden/heads), which
  llama.cpp picks by layer count (46 for gemma2, 62 for gemma3); gemma3's local layers use rope base
  10000 and every 6th layer is global unless the file says otherwise.
- phi3: fused qkv and gate_up tensors map onto mlx-lm's fused qkv_proj and gate_up_proj.
- Mixtral: a llama file with experts (llama.expert_count; the stacked ffn_*_exps layout, not the
  first per-expert one) runs on mlx-lm's mixtral; its softmax over the top k logits is llama.cpp's
  softmax over all then renormalized.
- qwen3moe (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): every layer is a mixture of experts, the experts
  stacked per layer (ffn_*_exps: (experts, out, in)) as mlx-lm's SwitchGLU holds them; the router
  is a softmax over all experts whose top k weights are renormalized (llama.cpp's norm_w).
- granite (IBM Granite 3.x dense): llama's tensors and interleaved rope (mlx-lm's granite module
  hard-codes NEOX rope, so its layers get an interleaved one), with four scales from the metadata:
  embeddings times embedding_scale, each block's output times residual_scale before the residual
  add, attention.scale in place of 1/sqrt(head_dim), and logits divided by logit_scale.
- gpt-oss: MXFP4 experts with biases (mlx-lm's gpt_oss SwitchGLU in mxfp4 mode), a biased router
  whose top k logits are softmaxed, attention with biases and a learned sink per head, a 128-token
  window on even layers, YaRN rope (llama.cpp and mlx-lm both truncate its correction range).
- glm4 (GLM-4-0414, GLM-Z1): biased q/k/v, interleaved rope on the first rope.dimension_count dims
  of each head (no q/k permutation: Hugging Face's GLM rope is interleaved already), a norm after
  attention and after the MLP as well as before each, and gate/up fused in ffn_up (gate rows first).
- cohere2 (Command R7B, Command A): one bias-free LayerNorm feeds attention and the MLP side by side,
  interleaved rope on the sliding-window layers only (3 of every 4; the global ones have none), the
  logits scaled by logit_scale, the head tied to the embeddings.
- nemotron (Nemotron-Mini 4B, Minitron): LayerNorms with biases whose weights the converter stored
  as 1 + w (mlx-lm's LayerNorm1P adds the 1 itself), NEOX rope on rope.dimension_count dims of each
  head, an up/down MLP with relu squared between.
- stablelm (StableLM 2 1.6B, Stable Code 3B): llama's tensors with LayerNorms (and biases), q/k/v biases
  where the file has them, NEOX rope on rope.dimension_count dims of each head.
- smollm3 (SmolLM3): llama's tensors and interleaved rope, except every 4th layer, which has none.
- qwen35, qwen35moe (Qwen3.5 / Qwen3.6): gated delta-net layers between gated attention ones, on mlx-lm's
  qwen3_5; what the converter changed in them is undone in gguf_delta_net.py. Blocks past the trunk
  (nextn_predict_layers: a multi-token-prediction head) are not read; fused ffn_gate_up_exps are split.
- exaone (EXAONE 3.0/3.5): llama's tensors and block with NEOX rope (the converter does not permute
  q/k), Llama 3 rope scaling as a rope_freqs tensor; runs on mlx-lm's llama with rope_traditional off.
- gemma4 (Gemma 4 E2B/E4B/31B, 26B-A4B, text): on mlx-lm's gemma4_text; norms stored as w, the global layers'
  rope through rope_freqs, KV-shared layers, per-layer inputs, the 26B-A4B's experts beside the MLP with the
  router's scales as ffn_gate_inp.scale and ffn_down_exps.scale (gguf_gemma4.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from . import gguf_delta_net as delta_net
from . import gguf_gemma4 as gemma4
from .errors import ModelLoadError
from .gguf_families import FAMILY_CONFIGS, File, deepseek2, rope_scaling, rotary

TOP_LEVEL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LLAMA_BLOCK = {
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
QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
GEMMA2_BLOCK = LLAMA_BLOCK | {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
PHI3_BLOCK = {k: v for k, v in LLAMA_BLOCK.items() if k not in ("attn_q", "attn_k", "attn_v", "ffn_gate")} | {
    "attn_qkv": "self_attn.qkv_proj",
    "ffn_up": "mlp.gate_up_proj",  # gate rows then up rows, as mlx-lm splits them
}
# Mixture-of-experts FFN (qwen3moe): the router and the stacked experts, in place of the dense FFN.
MOE_BLOCK = {k: v for k, v in LLAMA_BLOCK.items() if not k.startswith(("ffn_gate", "ffn_up", "ffn_down"))} | {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
    "ffn_up_exps": "mlp.switch_mlp.up_proj",
    "ffn_down_exps": "mlp.switch_mlp.down_proj",
}
MIXTRAL_BLOCK = {k: v for k, v in MOE_BLOCK.items() if not k.startswith("ffn_") or k == "ffn_norm"} | {
    "ffn_gate_inp": "block_sparse_moe.gate",
    "ffn_gate_exps": "block_sparse_moe.switch_mlp.gate_proj",
    "ffn_up_exps": "block_sparse_moe.switch_mlp.up_proj",
    "ffn_down_exps": "block_sparse_moe.switch_mlp.down_proj",
}
GRANITEMOE_BLOCK = {k: v for k, v in MOE_BLOCK.items() if not k.startswith("ffn_") or k == "ffn_norm"} | {
    "ffn_gate_inp": "block_sparse_moe.router.layer",
    "ffn_gate_exps": "block_sparse_moe.switch_mlp.gate_proj",
    "ffn_up_exps": "block_sparse_moe.switch_mlp.up_proj",
    "ffn_down_exps": "block_sparse_moe.switch_mlp.down_proj",
}
DEEPSEEK2_BLOCK = LLAMA_BLOCK | {  # multi-head latent attention; a dense FFN in the leading layers, else experts
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
    "ffn_up_exps": "mlp.switch_mlp.up_proj",
    "ffn_down_exps": "mlp.switch_mlp.down_proj",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
}
GPT_OSS_BLOCK = {k: v for k, v in MOE_BLOCK.items() if k != "ffn_norm"} | {
    "post_attention_norm": "post_attention_layernorm",
    "attn_sinks": "self_attn.sinks",  # a parameter itself, not a module's weight
    "ffn_gate_inp": "mlp.router",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
OLMO2_BLOCK = {  # no norms before attention and the MLP: after them, and q/k norms over whole projections
    **{k: v for k, v in LLAMA_BLOCK.items() if not k.endswith("_norm")},
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
GLM4_BLOCK = {k: v for k, v in LLAMA_BLOCK.items() if k != "ffn_gate"} | {  # a norm after attention and the MLP too
    "post_attention_norm": "post_self_attn_layernorm",
    "ffn_norm": "post_attention_layernorm",  # mlx-lm's name for the norm before the MLP
    "ffn_up": "mlp.gate_up_proj",  # gate rows then up rows (llama.cpp's SWIGLU halves), as mlx-lm splits them
    "post_ffw_norm": "post_mlp_layernorm",
}
NEMOTRON_BLOCK = {k: v for k, v in LLAMA_BLOCK.items() if k != "ffn_gate"}  # up, relu squared, down
COHERE2_BLOCK = {k: v for k, v in LLAMA_BLOCK.items() if k != "ffn_norm"}  # attention and MLP read one norm
STARCODER2_BLOCK = LLAMA_BLOCK | {  # LayerNorms with biases, biased projections, a plain GELU MLP
    "ffn_up": "mlp.c_fc",
    "ffn_down": "mlp.c_proj",
}

QWEN35_BLOCK = {k: v for k, v in LLAMA_BLOCK.items() if k != "ffn_norm"} | QK_NORMS | delta_net.BLOCK
QWEN35MOE_BLOCK = {k: v for k, v in QWEN35_BLOCK.items() if not k.startswith("ffn_")} | delta_net.MOE_BLOCK

# Tensors of a multimodal file's vision tower and projector (Ollama's gemma3): not the text model.
IGNORED_PREFIXES = ("v.", "mm.")


@dataclass(frozen=True)
class Arch:
    module: str  # mlx_lm.models.<module>
    model_type: str
    rope_traditional: bool
    block: dict = field(default_factory=lambda: LLAMA_BLOCK)
    norm_plus_one: bool = False  # GGUF norm weights hold 1 + w (gemma)
    rope_freqs: bool = False  # a `rope_freqs` tensor can replace the layers' rope
    interleaved_rope: bool = False  # the module hard-codes NEOX rope: give its layers an interleaved one
    gelu_tanh: bool = False  # llama.cpp's GELU (the tanh form) where mlx-lm's module uses the erf one
    layer_norm: bool = False  # LayerNorm (eps: attention.layer_norm_epsilon), not RMSNorm
    top_level: dict = field(default_factory=lambda: TOP_LEVEL)  # tensors outside the blocks


ARCHS = {
    "llama": Arch("llama", "llama", True, rope_freqs=True),  # also Mistral, SmolLM, Llama 3.x
    "qwen2": Arch("qwen2", "qwen2", False),
    "qwen3": Arch("qwen3", "qwen3", False, LLAMA_BLOCK | QK_NORMS),
    "gemma": Arch("gemma", "gemma", False, norm_plus_one=True, gelu_tanh=True),  # Gemma 1, CodeGemma
    "gemma2": Arch("gemma2", "gemma2", False, GEMMA2_BLOCK, norm_plus_one=True),
    "gemma3": Arch("gemma3_text", "gemma3_text", False, GEMMA2_BLOCK | QK_NORMS, norm_plus_one=True),
    "phi3": Arch("phi3", "phi3", False, PHI3_BLOCK),
    "qwen3moe": Arch("qwen3_moe", "qwen3_moe", False, MOE_BLOCK | QK_NORMS),
    # The Qwen vision-language models' text: multimodal rope (M-RoPE, Qwen3-VL's interleaved one) gives each
    # section of a text token's rope its own copy of the same position, which is NEOX rope; their deepstack
    # and vision parts only meet image inputs, which mlxspec does not take (a file's v.* tensors are skipped)
    "qwen2vl": Arch("qwen2", "qwen2", False),  # Qwen2-VL, Qwen2.5-VL (llama.cpp's name for both)
    "qwen25vl": Arch("qwen2", "qwen2", False),  # Ollama's converter's name for Qwen2.5-VL (unchecked on a real blob)
    "qwen3vl": Arch("qwen3", "qwen3", False, LLAMA_BLOCK | QK_NORMS),
    "qwen3vlmoe": Arch("qwen3_moe", "qwen3_moe", False, MOE_BLOCK | QK_NORMS),
    "granite": Arch("granite", "granite", True, interleaved_rope=True),
    # IBM Granite 3.x MoE (1B-A400M, 3B-A800M): granite's scales, every FFN a mixture of experts
    "granitemoe": Arch("granitemoe", "granitemoe", True, GRANITEMOE_BLOCK, interleaved_rope=True),
    "gpt-oss": Arch("gpt_oss", "gpt_oss", False, GPT_OSS_BLOCK),
    "starcoder2": Arch("starcoder2", "starcoder2", False, STARCODER2_BLOCK, gelu_tanh=True, layer_norm=True),
    # Ministral 3, Mistral Small 3.1/3.2, Magistral, Devstral 2: llama's tensors and interleaved rope,
    # YaRN, and Llama 4's attention temperature (queries scaled up past each original context length)
    "mistral3": Arch("ministral3", "ministral3", True, interleaved_rope=True),
    "olmo2": Arch("olmo2", "olmo2", False, OLMO2_BLOCK),  # OLMo 2 (OLMo 3's sliding windows: refused)
    "glm4": Arch("glm4", "glm4", True, GLM4_BLOCK),  # GLM-4-0414, GLM-Z1: interleaved rope on half the head
    "exaone": Arch("llama", "llama", False, rope_freqs=True),  # EXAONE 3.0/3.5: llama's block, NEOX rope
    "smollm3": Arch("smollm3", "smollm3", True),  # SmolLM3: llama's, without rope on every 4th layer
    # StableLM 2 (1.6B), Stable Code 3B: LayerNorms with biases, NEOX rope on a quarter of each head
    "stablelm": Arch("stablelm", "stablelm", False, layer_norm=True),
    # Nemotron-Mini, Minitron: LayerNorms stored as 1 + w with biases, NEOX rope on part of each head,
    # an ungated relu-squared MLP
    "nemotron": Arch("nemotron", "nemotron", False, NEMOTRON_BLOCK, norm_plus_one=True, layer_norm=True),
    # DeepSeek-V2 / V2-Lite, DeepSeek-Coder-V2 (llama.cpp's layout with attn_kv_b whole): interleaved rope on
    # the rope part of each head, YaRN folded into the attention scale, softmax-gated experts and shared ones
    "deepseek2": Arch("deepseek_v2", "deepseek_v2", True, DEEPSEEK2_BLOCK),
    "cohere2": Arch("cohere2", "cohere2", True, COHERE2_BLOCK, layer_norm=True),  # Command R7B, Command A
    # Command R (35B), Command R+, Aya Expanse / Aya 23: cohere2's block without windows, rope on every
    # layer; R+'s per-head q/k LayerNorms (one weight row per head)
    "command-r": Arch("cohere", "cohere", True, COHERE2_BLOCK | QK_NORMS, layer_norm=True),
    # Qwen3.5 / Qwen3.6 (dense and MoE), text only: gated delta-net layers between gated attention ones
    # (gguf_delta_net.py); NEOX rope on a quarter of each attention head
    "qwen35": Arch("qwen3_5", "qwen3_5", False, QWEN35_BLOCK),
    "qwen35moe": Arch("qwen3_5_moe", "qwen3_5_moe", False, QWEN35MOE_BLOCK),
    # Qwen3-Next (80B-A3B): Qwen3.5's MoE layers, grouped value heads, beta and alpha fused (gguf_delta_net.py)
    "qwen3next": Arch("qwen3_5_moe", "qwen3_5_moe", False, QWEN35MOE_BLOCK),
    # Gemma 4 (E2B, E4B, 31B, 26B-A4B), text only: sliding and global layers of two head sizes, KV-shared last
    # layers, per-layer inputs, experts beside the MLP (gguf_gemma4.py); norms stored as w
    "gemma4": Arch("gemma4_text", "gemma4_text", False, gemma4.BLOCK, top_level=TOP_LEVEL | gemma4.TOP_LEVEL),
}
# Mixtral is a "llama" file with experts (llama.expert_count): mlx-lm's mixtral model
MIXTRAL = Arch("mixtral", "mixtral", True, MIXTRAL_BLOCK)
# GGUF tensors that are mlx-lm parameters, not modules' weights ("<name>.weight", "<name>.bias" or "<name>")
PARAMETERS = ("self_attn.sinks", *delta_net.PARAMETERS, *gemma4.PARAMETERS)


def arch_for(metadata: dict, path: Path) -> tuple[str, Arch]:
    name = metadata.get("general.architecture")
    if name not in ARCHS:
        raise ModelLoadError(f"{path.name}: architecture {name!r} is not supported (supported: {', '.join(ARCHS)})")
    if name == "llama" and metadata.get("llama.expert_count", 0) > 0:
        return name, MIXTRAL
    return name, ARCHS[name]


def mlx_name(arch: Arch, gguf_name: str) -> str | None:
    """blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight; None when not a model tensor."""
    parts = gguf_name.split(".")
    if len(parts) == 2 and parts[0] in arch.top_level:
        return f"{arch.top_level[parts[0]]}.{parts[1]}"
    if len(parts) == 4 and parts[0] == "blk" and f"{parts[2]}.{parts[3]}" in arch.block:  # gemma4's router scales:
        return f"model.layers.{parts[1]}.{arch.block[f'{parts[2]}.{parts[3]}']}"  # a parameter named by its suffix
    if len(parts) in (3, 4) and parts[0] == "blk" and parts[2] in arch.block:
        if arch.block[parts[2]] in PARAMETERS:
            return f"model.layers.{parts[1]}.{arch.block[parts[2]]}"
        if len(parts) == 4:
            return f"model.layers.{parts[1]}.{arch.block[parts[2]]}.{parts[3]}"
    return None


# Tensors llama.cpp may store fused, and the halves (its SWIGLU order: gate rows, then up rows) they hold.
FUSED = {"ffn_gate_up_exps": ("ffn_gate_exps", "ffn_up_exps"),
         "ssm_ba": ("ssm_beta", "ssm_alpha")}  # Qwen3-Next (its rows grouped first: gguf_delta_net.split_ba)


def unfused(gguf_name: str, arrays: dict | None = None) -> list[tuple[str, dict | None]]:
    """[(name, arrays)] of a tensor's parts: a fused one's halves (split along its rows, codes, scales and
    biases alike), else the tensor itself."""
    parts = gguf_name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in FUSED:
        return [(gguf_name, arrays)]
    names = [".".join([*parts[:2], half, parts[3]]) for half in FUSED[parts[2]]]
    if arrays is None:
        return [(name, None) for name in names]
    rows = next(iter(arrays.values())).shape[-2] // 2
    return [(names[0], {k: a[..., :rows, :] for k, a in arrays.items()}),
            (names[1], {k: a[..., rows:, :] for k, a in arrays.items()})]


def trunk_layers(name: str, metadata: dict) -> int:
    """The layers the model runs: block_count less any multi-token-prediction (nextn) blocks after them."""
    return metadata.get(f"{name}.block_count", 0) - metadata.get(f"{name}.nextn_predict_layers", 0)


def is_trunk(gguf_name: str, trunk: int) -> bool:
    parts = gguf_name.split(".")
    return parts[0] != "blk" or int(parts[1]) < trunk


def model_config(name: str, arch: Arch, metadata: dict, vocab_size: int, tied: bool, path: Path,
                 attention_bias: bool = False, qk_norms: bool = False, tensors: frozenset = frozenset()) -> dict:
    """mlx-lm config (HF config.json keys) from the `{arch}.*` metadata; `attention_bias`, `qk_norms`:
    the file's q/k/v projections have biases, its attention q/k norms (where the module makes them
    optional: glm4, exaone, the cohere family); `tensors`: the mlx-lm names of the file's weights."""

    def get(key, default=None):
        value = metadata.get(f"{name}.{key}", default)
        if value is None:
            raise ModelLoadError(f"{path.name}: metadata key {name}.{key} is missing")
        return value

    hidden, heads = get("embedding_length"), get("attention.head_count")
    head_dim = get("attention.key_length", hidden // heads)
    config = {
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": get("block_count"),
        "intermediate_size": get("feed_forward_length", metadata.get(f"{name}.expert_feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "vocab_size": vocab_size,
        "max_position_embeddings": get("context_length"),
        "rope_theta": get("rope.freq_base", 10000.0),
        "rope_traditional": arch.rope_traditional,
        "tie_word_embeddings": tied,
    }
    if arch.layer_norm:
        config["norm_epsilon"] = get("attention.layer_norm_epsilon")
    else:
        config["rms_norm_eps"] = get("attention.layer_norm_rms_epsilon")
    f = File(name, get, path, attention_bias, qk_norms, tensors)
    if name == "deepseek2":  # its rope and YaRN are its own
        return config | deepseek2(f, config)
    config |= rotary(f, config)
    config |= rope_scaling(f)
    if arch is MIXTRAL:  # experts in place of the FFN; feed_forward_length is an expert's
        if head_dim != hidden // heads:
            raise ModelLoadError(f"{path.name}: mixtral with head_dim {head_dim} != hidden/heads is not supported")
        config |= {"num_local_experts": get("expert_count"), "num_experts_per_tok": get("expert_used_count")}
    family = FAMILY_CONFIGS.get(name)
    if family is not None:  # (some pop a shared key their module names otherwise)
        config |= family(f, config)
    return config


def adapt_tensor(arch: Arch, gguf_name: str, arrays: dict, heads: delta_net.Heads | None) -> dict:
    """Undo the converter's conventions on a loaded tensor's arrays (gemma: norms stored as 1 + w;
    qwen35: gguf_delta_net.adapt, given the file's delta-net `heads`)."""
    if heads is not None:
        return delta_net.adapt(gguf_name, arrays, heads)
    weight = arrays["weight"]
    if arch.norm_plus_one and gguf_name.endswith("norm.weight") and mx.issubdtype(weight.dtype, mx.floating):
        return arrays | {"weight": weight.astype(mx.float32) - 1.0}
    return arrays


class GeluTanhMLP(nn.Module):
    """An mlx-lm MLP (gated gate/up/down, or starcoder2's c_fc/c_proj) with GELU in its tanh form, as
    llama.cpp (and Hugging Face's gelu_pytorch_tanh) compute it; the same children, so the same weights."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        for name, child in mlp.children().items():
            setattr(self, name, child)

    def __call__(self, x: mx.array) -> mx.array:
        if "c_fc" in self:
            return self.c_proj(nn.gelu_approx(self.c_fc(x)))
        return self.down_proj(nn.gelu_approx(self.gate_proj(x)) * self.up_proj(x))


def use_gelu_tanh(arch: Arch, model: nn.Module) -> None:
    """gemma, starcoder2: mlx-lm's modules apply the erf GELU; the files were trained with the tanh
    one, which llama.cpp runs (a ~1e-3 difference per activation). Per model: this instance's layers."""
    if arch.gelu_tanh:
        for layer in model.layers:
            layer.mlp = GeluTanhMLP(layer.mlp)
