"""Tiny random models of mlx-lm's architectures, from one generic config: the keys each ModelArgs declares
are taken from COMMON, and EXTRA adds what an architecture needs besides (its own required keys, layer
patterns that put a sliding window or a recurrent layer among two to four layers).

    path = architecture_dir(tmp_path, "falcon_h1")   # config.json, random weights, a real tokenizer

tests/test_architectures.py runs some through speculation; benchmarks/sweep_architectures.py runs all.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from pathlib import Path

from model_factory import SMALL, config_dir, make_gemma4_dir

COMMON = SMALL | {
    "num_layers": 2, "n_layer": 2, "n_head": 4, "n_embd": 64, "d_model": 64, "n_positions": 1024, "n_inner": 128,
    "layer_norm_epsilon": 1e-5, "norm_eps": 1e-5, "layer_norm_eps": 1e-5, "tie_word_embeddings": False,
    "rope_scaling": None, "num_experts": 4, "num_experts_per_tok": 2, "num_local_experts": 4,
    "moe_intermediate_size": 32, "n_routed_experts": 4, "n_shared_experts": 1, "shared_expert_intermediate_size": 64,
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
    "sliding_window": 8, "partial_rotary_factor": 0.5, "attention_bias": False, "mlp_bias": False, "rotary_dim": 8,
    "num_kv_heads": 2, "hidden_act": "silu", "bos_token_id": 0, "pad_token_id": 0,
}

WINDOWS = ["sliding_attention", "full_attention"]
MOE_ROUTING = {"norm_topk_prob": True, "routed_scaling_factor": 1.5, "first_k_dense_replace": 1}
EXTRA = {  # model_type -> what COMMON does not give it
    "gemma3_text": {"sliding_window_pattern": 2, "query_pre_attn_scalar": 16, "rope_local_base_freq": 1e4},
    "cohere2": {"sliding_window_pattern": 2},
    "olmo3": {"layer_types": WINDOWS},
    "ministral3": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "llama_4_scaling_beta": 0.1,
                                       "original_max_position_embeddings": 1024}},
    "deepseek_v2": {"first_k_dense_replace": 1, "rope_scaling": {
        "type": "yarn", "factor": 1.0, "original_max_position_embeddings": 1024, "mscale": 1.0, "mscale_all_dim": 1.0,
        "beta_fast": 32, "beta_slow": 1}},
    "granite": {"logits_scaling": 4.0, "attention_multiplier": 0.125, "embedding_multiplier": 2.0,
                "residual_multiplier": 0.5},
    "granitemoe": {"logits_scaling": 4.0, "attention_multiplier": 0.125, "embedding_multiplier": 2.0,
                   "residual_multiplier": 0.5},
    "stablelm": {"use_qkv_bias": False},
    "gpt2": {"n_ctx": 1024},
    "gpt_neox": {"rotary_emb_base": 10000, "rotary_pct": 0.25},
    "minicpm": {"dim_model_base": 32, "scale_depth": 1.4, "scale_emb": 12.0},
    "mamba": {"state_size": 16, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True, "time_step_rank": 8},
    "mamba2": {"num_heads": 8, "head_dim": 16, "state_size": 16, "conv_kernel": 4, "n_groups": 1, "use_bias": False,
               "use_conv_bias": True, "time_step_limit": [0.0, 1e6], "time_step_rank": 8},
    "lfm2": {"conv_bias": False, "conv_L_cache": 3, "block_dim": 64, "block_multiple_of": 32,
             "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": False, "block_ff_dim": 128,
             "full_attn_idxs": [1]},
    "lfm2_moe": {"use_expert_bias": True, "num_dense_layers": 1, "conv_bias": False, "conv_L_cache": 3,
                 "full_attn_idxs": [1], "norm_topk_prob": True},
    "recurrent_gemma": {"conv1d_width": 4, "logits_soft_cap": 30.0, "attention_window_size": 8,
                        "block_types": ["recurrent", "attention"]},
    "jamba": {"attn_layer_offset": 1, "attn_layer_period": 2, "expert_layer_offset": 1, "expert_layer_period": 2,
              "mamba_d_conv": 4, "mamba_d_state": 16, "mamba_expand": 2},
    "nemotron_h": {"mamba_num_heads": 8, "mamba_head_dim": 16, "mamba_proj_bias": False, "ssm_state_size": 16,
                   "conv_kernel": 4, "n_groups": 1, "use_bias": False, "use_conv_bias": True,
                   "hybrid_override_pattern": ["M", "*", "-", "M"], "num_hidden_layers": 4},
    "ernie4_5": {"use_bias": False},
    "ernie4_5_moe": {"use_bias": False, "moe_num_experts": 4, "moe_k": 2, "moe_layer_start_index": 1},
    "rwkv7": {"a_low_rank_dim": 16, "v_low_rank_dim": 16, "gate_low_rank_dim": 16, "decay_low_rank_dim": 16},
    "llama4_text": {"intermediate_size_mlp": 128, "no_rope_layers": [1, 0], "use_qk_norm": True,
                    "num_experts_per_tok": 1, "interleave_moe_layer_step": 2},
    "minimax": {"shared_intermediate_size": 0},
    "dbrx": {"ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2}, "n_layers": 2, "n_heads": 4,
             "attn_config": {"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 10000}},
    "Klear": {"mlp_only_layers": [], "decoder_sparse_step": 1, "norm_topk_prob": True},
    "bailing_moe": {"num_shared_experts": 1, "norm_topk_prob": True, "first_k_dense_replace": 1},
    "dots1": MOE_ROUTING,
    "solar_open": MOE_ROUTING,
    "qwen3_moe": {"decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True},
    "glm4_moe": MOE_ROUTING | {"n_group": 2, "topk_group": 1, "use_qk_norm": True, "n_routed_experts": 8},
    "exaone_moe": {"num_shared_experts": 1, "layer_types": WINDOWS, "is_moe_layer": [False, True]},
    "afmoe": {"layer_types": WINDOWS},
    "gear": {"layer_types": WINDOWS},
    "qwen3_next": {"linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
                   "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "decoder_sparse_step": 1,
                   "mlp_only_layers": [], "full_attention_interval": 2},
    "olmo_hybrid": {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
                    "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": False,
                    "layer_types": ["linear_attention", "full_attention"]},
    "granitemoehybrid": {"logits_scaling": 4.0, "attention_multiplier": 0.125, "embedding_multiplier": 2.0,
                         "residual_multiplier": 0.5, "layer_types": ["mamba", "attention"], "mamba_n_heads": 8,
                         "mamba_d_head": 16, "mamba_proj_bias": False, "mamba_d_state": 16, "mamba_d_conv": 4,
                         "mamba_n_groups": 1, "mamba_conv_bias": True, "mamba_expand": 2, "shared_intermediate_size": 64},
    "minicpm3": {"dim_model_base": 32, "scale_depth": 1.4, "scale_emb": 12.0, "rope_scaling": {
        "original_max_position_embeddings": 1024, "short_factor": [1.0] * 4, "long_factor": [1.0] * 4}},
    "hunyuan": {"moe_topk": 2, "num_shared_expert": 1, "use_mixed_mlp_moe": True, "use_qk_norm": True,
                "use_cla": False, "cla_share_factor": 2, "rope_scaling": {"alpha": 1.0, "factor": 1.0, "type": "dynamic"}},
    # (mlx-lm's Hunyuan reads its head from the embedding table whatever tie_word_embeddings says: COMMON's False)
    "mistral4": MOE_ROUTING | {"topk_group": 1, "n_group": 1, "rope_parameters": {
        "rope_type": "default", "rope_theta": 1e4, "llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 1024}},
    "mellum": {"norm_topk_prob": True, "layer_types": WINDOWS, "rope_parameters": {
        "sliding_attention": {"rope_theta": 1e4}, "full_attention": {"rope_theta": 1e4}}},
    "baichuan_m1": {"sliding_window_layers": [0], "conv_window": 2},
    "kimi_linear": {"model_max_length": 1024, "linear_attn_config": {"num_heads": 4, "head_dim": 16, "kda_layers": [1]}},
    "bailing_moe_linear": {"num_shared_experts": 1, "norm_topk_prob": True, "first_k_dense_replace": 1,
                           "layer_group_size": 2, "group_norm_size": 1},
    "bailing_hybrid": {"num_shared_experts": 1, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
                       "layer_group_size": 2, "group_norm_size": 1, "routed_scaling_factor": 1.0},
    "longcat_flash": {"attention_method": "MLA", "zero_expert_type": "identity", "ffn_hidden_size": 128, "moe_topk": 2,
                      "expert_ffn_hidden_size": 32, "zero_expert_num": 1, "routed_scaling_factor": 1.0,
                      "mla_scale_q_lora": True, "mla_scale_kv_lora": True},
    "step3p5": {"num_attention_groups": 2},
    "plamo": {"n_shared_head": 2},
    "phixtral": {"num_vocab": 320, "model_dim": 64, "num_heads": 4},  # its own names (num_vocab: the tokenizer's)
    "bailing_moe_v3": {"n_group": 2, "topk_group": 1},
    "apertus": {"post_norm": False, "qk_norm": True},
    "exaone4": {"sliding_window_pattern": "LG", "layer_types": WINDOWS},  # mlx-lm reads the string, transformers the list
    "glm_moe_dsa": MOE_ROUTING | {"index_head_dim": 16, "index_n_heads": 2, "index_topk": 4, "topk_method": "noaux_tc",
                                  "scoring_func": "sigmoid", "n_group": 1, "topk_group": 1, "moe_layer_freq": 1,
                                  "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
    "mimo_v2_flash": MOE_ROUTING | {
        "hybrid_layer_pattern": [1, 0], "moe_layer_freq": [0, 1], "add_swa_attention_sink_bias": True,
        "add_full_attention_sink_bias": False, "sliding_window_size": 8, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "n_group": 1, "topk_group": 1, "layernorm_epsilon": 1e-5, "swa_rope_theta": 1e4,
        "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2, "swa_head_dim": 16, "swa_v_head_dim": 16},
    "nemotron-nas": {"block_configs": [  # Nemotron Super/Ultra's pruned blocks: a skipped attention, a linear FFN
        {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.0}},
        {"attention": {"no_op": True}, "ffn": {"replace_with_linear": True}},
        {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_mult": 2.0}}], "num_hidden_layers": 3},
    "openelm": {"num_transformer_layers": 2, "model_dim": 64, "ffn_dim_divisor": 16, "num_query_heads": [4, 4],
                "num_kv_heads": [2, 2], "ffn_multipliers": [2.0, 2.0]},
    "afm7": {"hidden_dim": 64, "num_layers": 3, "num_kv_reuse_layers": 1, "num_heads": 4},
    "lille-130m": {"block_size": 1024, "n_kv_heads": 2},
    "spark2_5": {"hidden_act": "gelu", "layer_types": WINDOWS, "rope_parameters": {"sliding_attention": {"rope_theta": 1e4},
                                                             "full_attention": {"rope_theta": 1e4}}},
    "longcat_flash_ngram": {"ffn_hidden_size": 128, "moe_topk": 2, "expert_ffn_hidden_size": 32, "zero_expert_num": 1,
                            "routed_scaling_factor": 1.0, "mla_scale_q_lora": True, "mla_scale_kv_lora": True,
                            "ngram_vocab_size_ratio": 4},
    "muse_spark": {"audio_config": {"out_hidden_size": 64}},  # transformers checks it against the text model's width
    # the multimodal wrappers' text models (WRAPPERS), keyed as WRAPPERS names them
    "llama4.TextArgs": {"num_hidden_layers": 4, "attention_chunk_size": 8, "interleave_moe_layer_step": 2, "intermediate_size_mlp": 128,
                        "use_qk_norm": True, "num_experts_per_tok": 1},
    "qwen3_5.TextModelArgs": {"linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
                              "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "full_attention_interval": 2},
    "gemma3n.TextConfig": {"num_hidden_layers": 4, "num_kv_shared_layers": 2, "vocab_size_per_layer_input": 320,
                           "rope_local_base_freq": 1e4, "final_logit_softcapping": 30.0, "layer_types": WINDOWS * 2,
                           "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0], "hidden_size_per_layer_input": 16,
                           "altup_num_inputs": 2, "altup_coef_clip": 120.0, "altup_correct_scale": True,
                           "altup_active_idx": 0, "laurel_rank": 8},
    "kimi_k3.TextArgs": {"hidden_act": "situ", "num_experts_per_token": 2, "first_k_dense_replace": 1,
                         "linear_attn_config": {"num_heads": 4, "head_dim": 16, "kda_layers": [1],
                                                "short_conv_kernel_size": 4}},
    "muse_spark.TextArgs": {"post_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
                            "layer_rope_theta": [1e4, 0], "layer_types": WINDOWS, "final_logit_softcapping": 30.0,
                            "output_multiplier": 1.0, "moe_hidden_size": 64},
}
SKIPPED = {  # model_type -> why the sweep leaves it out
    "olmo": "needs the ai2-olmo package", "bitnet": "a Metal kernel (no CPU path)",
    "muse_spark": "a Metal kernel of mlx-lm's (qk_norm_rope: no CPU path)",
    "phi3small": "its head writes -inf at ids from 100,256 (its real vocabulary's): past a tiny one, unchecked",
    "gemma4_text": "swept as gemma4, its wrapper (made by BUILDERS), as Gemma 4 checkpoints come",
    "qwen": "Qwen (v1)'s sizes mean other things (its intermediate_size is twice its MLP's)",
}
WRAPPERS = {  # model_type -> the text model its text_config describes: a model type, or module.ArgsClass
    "gemma3": "gemma3_text", "mistral3": "ministral3", "pixtral": "llama", "qwen2_vl": "qwen2", "qwen3_vl": "qwen3",
    "qwen3_vl_moe": "qwen3_moe", "lfm2-vl": "lfm2", "kimi_k25": "deepseek_v3", "llama4": "llama4.TextArgs",
    "kimi_vl": "kimi_vl.TextArgs", "qwen3_5": "qwen3_5.TextModelArgs", "qwen3_5_moe": "qwen3_5.TextModelArgs",
    "gemma3n": "gemma3n.TextConfig", "kimi_k3": "kimi_k3.TextArgs", "minimax_m3_vl": "minimax_m3_vl.TextArgs",
    "muse_spark": "muse_spark.TextArgs", "prism_hadamard_qwen35": "qwen3_5.TextModelArgs",
}
NOT_MODELS = {"base", "cache", "rope_utils", "switch_layers", "activations", "pipeline", "ssm", "gated_delta", "mla",
              "bitlinear_layers"}


def architecture_config(model_type: str) -> dict:
    """COMMON's keys that `model_type`'s ModelArgs declares, and its EXTRA (a wrapper's text model's under
    text_config); KeyError naming the required keys neither gives (an architecture this table does not know yet)."""
    if model_type in WRAPPERS:
        inner = WRAPPERS[model_type]
        text = _config(inner) | {"model_type": f"{model_type}_text" if "." in inner else inner}
        return {"text_config": text} | EXTRA.get(model_type, {})
    return _config(model_type)


def _config(spec: str) -> dict:
    module, _, name = spec.partition(".")
    args = getattr(importlib.import_module(f"mlx_lm.models.{module}"), name or "ModelArgs")
    fields = {f.name for f in dataclasses.fields(args)}
    config = {k: v for k, v in COMMON.items() if k in fields} | EXTRA.get(spec, {})
    missing = [f.name for f in dataclasses.fields(args) if f.name not in config and f.name != "model_type"
               and f.name != "vocab_size" and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise KeyError(f"{spec}: no value for {', '.join(missing)}")
    return config


BUILDERS = {  # model_type -> a function making one at a path, where one config of the table cannot say enough
    "gemma4": make_gemma4_dir,  # its wrapper's defaults are a full-size model; its layer pattern, KV-shared layers
}


def architecture_dir(path: str | Path, model_type: str) -> Path:
    """A random `model_type` model of the table's size at `path` (config_dir: a real tokenizer, seeded weights)."""
    if model_type in BUILDERS:
        return BUILDERS[model_type](Path(path))
    return config_dir(Path(path), model_type=model_type, **architecture_config(model_type))


def mlx_lm_model_types() -> list[str]:
    """Every model file of the installed mlx-lm (some are wrappers or need more than the table gives)."""
    import mlx_lm.models

    return sorted(m.name for m in pkgutil.iter_modules(mlx_lm.models.__path__) if m.name not in NOT_MODELS)
