"""Per-family pieces of the mlx-lm config a GGUF's metadata gives (gguf_archs.model_config calls them):
rope scaling, and what gemma2/3, Ministral 3, gpt-oss, qwen3moe, the cohere family and DeepSeek-V2 add.
`get(key, default)` reads `{arch}.key` from the metadata (a missing key without a default is a ModelLoadError).
"""

from __future__ import annotations

from pathlib import Path

from .errors import ModelLoadError


def mistral3_config(get, config: dict, path: Path) -> dict:
    """mlx-lm's ministral3 `rope_parameters`. YaRN's magnitude is 1, as Ministral's config has it
    (mscale = mscale_all_dim) and as llama.cpp's mistral3 graph set it (attn_factor = 1 / (1 + 0.1 ln
    factor) against ggml's own factor); a file meaning otherwise is not told apart."""
    if config.get("num_local_experts") or get("expert_count", 0):
        raise ModelLoadError(f"{path.name}: mistral3 with experts is not supported")
    if "rope_scaling" in config and config["rope_scaling"]["rope_type"] != "yarn":
        raise ModelLoadError(f"{path.name}: mistral3 with {config['rope_scaling']['rope_type']} rope scaling is not supported")
    yarn = config.pop("rope_scaling", None)
    original = yarn["original_max_position_embeddings"] if yarn else config["max_position_embeddings"]
    rope = {"rope_type": "default"} if yarn is None else {**yarn, "mscale": 1.0, "mscale_all_dim": 1.0}
    return {"rope_parameters": {**rope, "rope_theta": config["rope_theta"], "original_max_position_embeddings": original,
                                "llama_4_scaling_beta": float(get("attention.temperature_scale", 0.0))}}


def deepseek2_config(get, config: dict, metadata: dict, path: Path) -> dict:
    """mlx-lm's deepseek_v2 from llama.cpp's deepseek2 keys. The head sizes are the _mla keys where the
    file has them (llama.cpp's newer converter) and key/value_length otherwise; YaRN's
    yarn_log_multiplier is 0.1 * mscale_all_dim, and llama.cpp takes mscale = mscale_all_dim (its rope
    magnitude is then 1, and the attention scale grows by mscale squared, as mlx-lm's module does)."""
    if get("expert_gating_func", 1) != 1 or get("expert_weights_norm", False):
        raise ModelLoadError(f"{path.name}: deepseek2 with sigmoid gating or renormalized expert weights "
                             "(DeepSeek-V3 and later) is not supported")
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
        raise ModelLoadError(f"{path.name}: deepseek2 with {get('rope.scaling.type')} rope scaling is not supported")
    return {
        "intermediate_size": get("feed_forward_length"), "moe_intermediate_size": get("expert_feed_forward_length"),
        "n_routed_experts": get("expert_count"), "num_experts_per_tok": get("expert_used_count"),
        "n_shared_experts": get("expert_shared_count", 0) or None, "routed_scaling_factor": get("expert_weights_scale", 1.0),
        "first_k_dense_replace": get("leading_dense_block_count", 0), "moe_layer_freq": 1, "topk_method": "greedy",
        "kv_lora_rank": get("attention.kv_lora_rank"), "q_lora_rank": get("attention.q_lora_rank", 0) or None,
        "qk_rope_head_dim": rope_dims, "qk_nope_head_dim": qk - rope_dims,
        "v_head_dim": get("attention.value_length_mla", metadata.get("deepseek2.attention.value_length", qk)),
        "rope_scaling": scaling, "rope_traditional": True,
    }


def cohere2_config(get, config: dict, attention_bias: bool) -> dict:
    """Command R7B / Command A: a parallel block (attention and MLP read one bias-free LayerNorm), rope
    on the sliding layers only (three of every four: llama.cpp's pattern, mlx-lm's default), the logits
    times logit_scale, the head tied to the embeddings."""
    return {"layer_norm_eps": config.pop("norm_epsilon"), "logit_scale": get("logit_scale", 1.0),
            "sliding_window": get("attention.sliding_window", 0), "sliding_window_pattern": 4,
            "layer_norm_bias": False, "attention_bias": attention_bias}


def gpt_oss_config(get, config: dict) -> dict:
    """gpt-oss: experts, the sliding window on even layers (llama.cpp's swa pattern 2)."""
    layers = config["num_hidden_layers"]
    return {
        "num_local_experts": get("expert_count"),
        "num_experts_per_tok": get("expert_used_count"),
        "intermediate_size": get("expert_feed_forward_length"),
        "sliding_window": get("attention.sliding_window"),
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
    }


def moe_config(get) -> dict:
    """qwen3moe: every layer sparse, softmax router, top-k weights renormalized (as llama.cpp builds it)."""
    return {
        "num_experts": get("expert_count"),
        "num_experts_per_tok": get("expert_used_count"),
        "moe_intermediate_size": get("expert_feed_forward_length"),
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
    }


def rope_scaling(name: str, get, path: Path) -> dict:
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
            raise ModelLoadError(f"{path.name}: YaRN with {', '.join(odd)} is not supported")
        return {"rope_scaling": {"rope_type": "yarn", "factor": float(get("rope.scaling.factor")),
                                 "original_max_position_embeddings": get("rope.scaling.original_context_length"),
                                 "beta_fast": float(get("rope.scaling.yarn_beta_fast", 32.0)),
                                 "beta_slow": float(get("rope.scaling.yarn_beta_slow", 1.0))}}
    raise ModelLoadError(f"{path.name}: rope scaling {scaling!r} is not supported for {name}")


def gemma_config(name: str, get, config: dict, path: Path) -> dict:
    big = config["num_hidden_layers"] == {"gemma2": 46, "gemma3": 62}[name]  # the 27B sizes
    scalar = config["hidden_size"] // config["num_attention_heads"] if big else config["head_dim"]
    extra = {"query_pre_attn_scalar": scalar}
    if name == "gemma2":
        # mlx-lm's gemma2 attends over the whole context (no sliding window): the same as
        # llama.cpp up to `sliding_window` (4096) tokens.
        extra["attn_logit_softcapping"] = get("attn_logit_softcapping", 50.0)
        extra["final_logit_softcapping"] = get("final_logit_softcapping", 30.0)
        extra["sliding_window"] = get("attention.sliding_window", 4096)
    else:
        extra["sliding_window"] = get("attention.sliding_window")
        extra["sliding_window_pattern"] = window_pattern(get("attention.sliding_window_pattern", 6),
                                                          config["num_hidden_layers"], path)
        extra["rope_local_base_freq"] = get("rope.freq_base_swa", 10000.0)
    return extra


def window_pattern(pattern, layers: int, path: Path) -> int:
    """gemma3's sliding-window pattern as mlx-lm's period (every n-th layer global). Ollama's converter
    writes it per layer (true: sliding), as Hugging Face's layer_types; a period must describe it."""
    if not isinstance(pattern, list):
        return pattern
    period = next((i + 1 for i, sliding in enumerate(pattern) if not sliding), len(pattern) + 1)
    if len(pattern) != layers or any(bool(sliding) != ((i + 1) % period != 0) for i, sliding in enumerate(pattern)):
        raise ModelLoadError(f"{path.name}: a sliding-window pattern that is not every n-th layer global is not supported")
    return period
