"""Per-family pieces of the mlx-lm config a GGUF's metadata gives, one function per architecture name
(FAMILY_CONFIGS; gguf_archs.model_config builds what they share, then calls the file's). Each reads
the file through `File` and returns the config keys it adds or replaces (a few pop a shared key the
family's module names otherwise). A missing key without a default is a ModelLoadError; so is a variant
the family's mlx-lm module cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import gguf_delta_net, gguf_gemma4
from .errors import ModelLoadError

PARTIAL_ROTARY = ("phi3", "glm4", "nemotron", "stablelm", *gguf_delta_net.ARCHS)  # rope on rope.dimension_count dims of each head


@dataclass(frozen=True)
class File:
    name: str  # the file's architecture (general.architecture)
    get: Callable[..., Any]  # get(key, default): `{name}.key`
    path: Path
    attention_bias: bool = False  # the q/k/v projections have biases
    qk_norms: bool = False  # the attention has q/k norms
    tensors: frozenset = frozenset()  # the mlx-lm names of the file's weights

    def refuse(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path.name}: {what} is not supported")


def rotary(f: File, config: dict) -> dict:
    """partial_rotary_factor where the family's module takes one; elsewhere rope must cover the head."""
    head_dim = config["head_dim"]
    rope_dims = f.get("rope.dimension_count", head_dim)
    if f.name not in PARTIAL_ROTARY:
        if rope_dims != head_dim:
            raise f.refuse(f"partial rotary embedding (rope on {rope_dims} of {head_dim} dims) for {f.name}")
        return {}
    if f.name == "phi3" and head_dim != config["hidden_size"] // config["num_attention_heads"]:
        raise f.refuse(f"phi3 with head_dim {head_dim} != hidden/heads")
    return {"partial_rotary_factor": rope_dims / head_dim}


def rope_scaling(f: File) -> dict:
    name, get = f.name, f.get
    scaling = get("rope.scaling.type", "none")
    if scaling == "none" or (scaling == "longrope" and name == "phi3"):  # phi3's: its factor tensors (gguf_rope.py)
        return {}
    if scaling == "linear" and name != "phi3":
        return {"rope_scaling": {"rope_type": "linear", "type": "linear", "factor": float(get("rope.scaling.factor"))}}
    if scaling == "yarn" and name in ("gpt-oss", "mistral3"):  # llama.cpp's defaults: beta_fast 32, beta_slow 1
        tuned = {"yarn_ext_factor": (get("rope.scaling.yarn_ext_factor", -1.0), (-1.0, 1.0)),
                 "yarn_attn_factor": (get("rope.scaling.yarn_attn_factor", 1.0), (1.0,))}
        if name == "gpt-oss":  # mistral3's graph sets its own magnitude factor: the multiplier changes nothing there
            tuned["yarn_log_multiplier"] = (get("rope.scaling.yarn_log_multiplier", 0.0), (0.0,))
        odd = [f"{key}={value}" for key, (value, usual) in tuned.items() if value not in usual]
        if odd:  # mlx-lm's YaRN has no such knobs
            raise f.refuse(f"YaRN with {', '.join(odd)}")
        return {"rope_scaling": {"rope_type": "yarn", "factor": float(get("rope.scaling.factor")),
                                 "original_max_position_embeddings": get("rope.scaling.original_context_length"),
                                 "beta_fast": float(get("rope.scaling.yarn_beta_fast", 32.0)),
                                 "beta_slow": float(get("rope.scaling.yarn_beta_slow", 1.0))}}
    raise f.refuse(f"rope scaling {scaling!r} for {name}")


def qwen2(f: File, config: dict) -> dict:
    if config["head_dim"] != config["hidden_size"] // config["num_attention_heads"]:
        raise f.refuse(f"qwen2 with head_dim {config['head_dim']} != hidden/heads")
    return {}


def gemma(f: File, config: dict) -> dict:
    get = f.get
    big = config["num_hidden_layers"] == {"gemma2": 46, "gemma3": 62}[f.name]  # the 27B sizes
    scalar = config["hidden_size"] // config["num_attention_heads"] if big else config["head_dim"]
    extra = {"query_pre_attn_scalar": scalar}
    if f.name == "gemma2":
        # mlx-lm's gemma2 attends over the whole context (no sliding window): the same as
        # llama.cpp up to `sliding_window` (4096) tokens.
        extra["attn_logit_softcapping"] = get("attn_logit_softcapping", 50.0)
        extra["final_logit_softcapping"] = get("final_logit_softcapping", 30.0)
        extra["sliding_window"] = get("attention.sliding_window", 4096)
    else:
        extra["sliding_window"] = get("attention.sliding_window")
        extra["sliding_window_pattern"] = window_pattern(get("attention.sliding_window_pattern", 6),
                                                          config["num_hidden_layers"], f)
        extra["rope_local_base_freq"] = get("rope.freq_base_swa", 10000.0)
    return extra


def window_pattern(pattern, layers: int, f: File) -> int:
    """gemma3's sliding-window pattern as mlx-lm's period (every n-th layer global). Ollama's converter
    writes it per layer (true: sliding), as Hugging Face's layer_types; a period must describe it."""
    if not isinstance(pattern, list):
        return pattern
    period = next((i + 1 for i, sliding in enumerate(pattern) if not sliding), len(pattern) + 1)
    if len(pattern) != layers or any(bool(sliding) != ((i + 1) % period != 0) for i, sliding in enumerate(pattern)):
        raise f.refuse("a sliding-window pattern that is not every n-th layer global")
    return period


def moe(f: File, config: dict) -> dict:
    """qwen3moe: every layer sparse, softmax router, top-k weights renormalized (as llama.cpp builds it)."""
    get = f.get
    return {"num_experts": get("expert_count"), "num_experts_per_tok": get("expert_used_count"),
            "moe_intermediate_size": get("expert_feed_forward_length"), "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": True}


def gpt_oss(f: File, config: dict) -> dict:
    """gpt-oss: experts, the sliding window on even layers (llama.cpp's swa pattern 2)."""
    get, layers = f.get, config["num_hidden_layers"]
    return {"num_local_experts": get("expert_count"), "num_experts_per_tok": get("expert_used_count"),
            "intermediate_size": get("expert_feed_forward_length"), "sliding_window": get("attention.sliding_window"),
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]}


def mistral3(f: File, config: dict) -> dict:
    """mlx-lm's ministral3 `rope_parameters`. YaRN's magnitude is 1, as Ministral's config has it
    (mscale = mscale_all_dim) and as llama.cpp's mistral3 graph set it (attn_factor = 1 / (1 + 0.1 ln
    factor) against ggml's own factor); a file meaning otherwise is not told apart."""
    if config.get("num_local_experts") or f.get("expert_count", 0):
        raise f.refuse("mistral3 with experts")
    if "rope_scaling" in config and config["rope_scaling"]["rope_type"] != "yarn":
        raise f.refuse(f"mistral3 with {config['rope_scaling']['rope_type']} rope scaling")
    yarn = config.pop("rope_scaling", None)
    original = yarn["original_max_position_embeddings"] if yarn else config["max_position_embeddings"]
    rope = {"rope_type": "default"} if yarn is None else {**yarn, "mscale": 1.0, "mscale_all_dim": 1.0}
    return {"rope_parameters": {**rope, "rope_theta": config["rope_theta"], "original_max_position_embeddings": original,
                                "llama_4_scaling_beta": float(f.get("attention.temperature_scale", 0.0))}}


def deepseek2(f: File, config: dict) -> dict:
    """mlx-lm's deepseek_v2 from llama.cpp's deepseek2 keys. The head sizes are the _mla keys where the
    file has them (llama.cpp's newer converter, which also splits kv_b: gguf.py joins it again) and
    key/value_length otherwise; YaRN's
    yarn_log_multiplier is 0.1 * mscale_all_dim, and llama.cpp takes mscale = mscale_all_dim (its rope
    magnitude is then 1, and the attention scale grows by mscale squared, as mlx-lm's module does).
    Its rope and scaling are its own: model_config calls this in place of rotary and rope_scaling."""
    get = f.get
    if get("expert_gating_func", 1) != 1 or get("expert_weights_norm", False):
        raise f.refuse("deepseek2 with sigmoid gating or renormalized expert weights (DeepSeek-V3 and later)")
    qk = get("attention.key_length_mla", config["head_dim"])
    rope_dims = get("rope.dimension_count")
    scaling = {"factor": 1.0, "original_max_position_embeddings": config["max_position_embeddings"]}
    if get("rope.scaling.type", "none") == "yarn":
        mscale = float(get("rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
        scaling = {"type": "yarn", "factor": float(get("rope.scaling.factor")),
                   "original_max_position_embeddings": get("rope.scaling.original_context_length"),
                   "beta_fast": float(get("rope.scaling.yarn_beta_fast", 32.0)),
                   "beta_slow": float(get("rope.scaling.yarn_beta_slow", 1.0)), "mscale": mscale, "mscale_all_dim": mscale}
    elif get("rope.scaling.type", "none") != "none":
        raise f.refuse(f"deepseek2 with {get('rope.scaling.type')} rope scaling")
    return {
        "intermediate_size": get("feed_forward_length"), "moe_intermediate_size": get("expert_feed_forward_length"),
        "n_routed_experts": get("expert_count"), "num_experts_per_tok": get("expert_used_count"),
        "n_shared_experts": get("expert_shared_count", 0) or None, "routed_scaling_factor": get("expert_weights_scale", 1.0),
        "first_k_dense_replace": get("leading_dense_block_count", 0), "moe_layer_freq": 1, "topk_method": "greedy",
        "kv_lora_rank": get("attention.kv_lora_rank"), "q_lora_rank": get("attention.q_lora_rank", 0) or None,
        "qk_rope_head_dim": rope_dims, "qk_nope_head_dim": qk - rope_dims,
        "v_head_dim": get("attention.value_length_mla", get("attention.value_length", qk)),
        "rope_scaling": scaling, "rope_traditional": True,
        "num_key_value_heads": config["num_attention_heads"],  # MLA files say 1 (the absorbed form's one latent head)
    }


def cohere2(f: File, config: dict) -> dict:
    """Command R7B / Command A: a parallel block (attention and MLP read one bias-free LayerNorm), rope
    on the sliding layers only (three of every four: llama.cpp's pattern, mlx-lm's default), the logits
    times logit_scale, the head tied to the embeddings."""
    return {"layer_norm_eps": config.pop("norm_epsilon"), "logit_scale": f.get("logit_scale", 1.0),
            "sliding_window": f.get("attention.sliding_window", 0), "sliding_window_pattern": 4,
            "layer_norm_bias": False, "attention_bias": f.attention_bias}


def command_r(f: File, config: dict) -> dict:
    """Command R / R+ / Aya: cohere2's block without windows; q/k norms where the file has them."""
    extra = cohere2(f, config)
    del extra["sliding_window"], extra["sliding_window_pattern"]
    return extra | {"use_qk_norm": f.qk_norms}


def granite(f: File, config: dict) -> dict:
    get, head_dim = f.get, config["head_dim"]
    if head_dim != config["hidden_size"] // config["num_attention_heads"] or "rope_scaling" in config:
        raise f.refuse("granite with head_dim != hidden/heads or rope scaling")
    return {"embedding_multiplier": get("embedding_scale", 1.0), "residual_multiplier": get("residual_scale", 1.0),
            # llama.cpp: an attention.scale of 0 (or none) means 1/sqrt(head_dim)
            "attention_multiplier": get("attention.scale", 0.0) or head_dim**-0.5,
            "logits_scaling": get("logit_scale", 1.0), "attention_bias": False, "mlp_bias": False}


def granitemoe(f: File, config: dict) -> dict:
    """granite's, and experts: mlx-lm's softmax over the top k router logits is llama.cpp's softmax
    with the top k renormalized."""
    get = f.get
    return granite(f, config) | {"num_local_experts": get("expert_count"), "num_experts_per_tok": get("expert_used_count"),
                                 "intermediate_size": get("expert_feed_forward_length", config["intermediate_size"])}


def glm4(f: File, config: dict) -> dict:
    if f.get("rope.dimension_sections", 0):  # GLM-4.1V's multimodal rope
        raise f.refuse("glm4 with sectioned (multimodal) rope")
    return {"attention_bias": f.attention_bias}


def nemotron(f: File, config: dict) -> dict:
    return {"norm_eps": config.pop("norm_epsilon"), "hidden_act": "relu2", "attention_bias": f.attention_bias}


def stablelm(f: File, config: dict) -> dict:
    """The sequential block (the 12B's parallel one and per-head q/k norms: refused by the loader)."""
    return {"layer_norm_eps": config.pop("norm_epsilon"), "use_qkv_bias": f.attention_bias, "use_parallel_residual": False}


def olmo2(f: File, config: dict) -> dict:
    if f.get("attention.sliding_window", 0):
        raise f.refuse("olmo2 with sliding-window layers (OLMo 3)")
    return {}


FAMILY_CONFIGS: dict[str, Callable[[File, dict], dict]] = {
    "qwen2": qwen2, "qwen2vl": qwen2, "qwen25vl": qwen2,
    "gemma2": gemma, "gemma3": gemma,
    "qwen3moe": moe, "qwen3vlmoe": moe,
    "gpt-oss": gpt_oss,
    "mistral3": mistral3,
    "smollm3": lambda f, config: {"no_rope_layer_interval": 4},  # llama.cpp's n_no_rope_layer_step, fixed at 4
    "cohere2": cohere2, "command-r": command_r,
    "olmo2": olmo2,
    "granite": granite, "granitemoe": granitemoe,
    "glm4": glm4,
    "exaone": lambda f, config: {"attention_bias": f.attention_bias},  # EXAONE 3.5 has none; the format allows them
    "nemotron": nemotron,
    "stablelm": stablelm,
    **dict.fromkeys(gguf_delta_net.ARCHS, gguf_delta_net.config),
    "gemma4": gguf_gemma4.config,
}
