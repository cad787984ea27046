"""Gemma 4 text models (llama.cpp's "gemma4") on mlx-lm's gemma4_text: names, config, refusals.

What llama.cpp's converter (conversion/gemma.py, Gemma4Model) writes and its graph (src/models/gemma4.cpp) reads:

- norms stored as they are (w, not 1 + w: Gemma 4's RMSNorm multiplies by w), v normed without a scale;
- attention.key_length is the global (full-attention) layers' head size, key_length_swa the sliding ones';
  sliding_window_pattern is one bool per layer (true: sliding);
- the full layers' "proportional" rope is NEOX rope over the whole global head with a `rope_freqs` tensor
  (1 for the rotated pairs, 1e30 for the rest), applied to those layers only (gguf_rope.py);
- feed_forward_length and head_count_kv may be per-layer arrays: the KV-shared layers' double-wide MLP,
  and the 31B's global KV heads (whose layers have no attn_v: values are the keys, attention_k_eq_v);
- the last shared_kv_layers layers reuse the KV of layer n-2 (sliding) or n-1 (full), n the first shared one;
  mlx-lm reuses the last earlier layer of the same type, the same layers when n-2 slides and n-1 is global;
- per-layer inputs (E2B/E4B): per_layer_token_embd, per_layer_model_proj, per_layer_proj_norm, and per block
  inp_gate, proj, post_norm; each block's output times layer_output_scale;
- logits softcapped by final_logit_softcapping where the file has it (llama.cpp: none otherwise);
- mixture of experts (26B-A4B: expert_count > 0), in every layer beside the dense MLP, as mlx-lm's
  enable_moe_block: the router (ffn_gate_inp) reads the block's input rms-normed times ffn_gate_inp.scale
  / sqrt(hidden), softmax over all experts, top expert_used_count renormalized, times ffn_down_exps.scale
  (HF's router.scale and router.per_expert_scale, stored as they are); the experts' gate and up rows fused in
  ffn_gate_up_exps (gate first, split as gguf_archs.FUSED) or apart; pre_ffw_norm_2 before the experts,
  post_ffw_norm_1 and _2 after the MLP and the experts, post_ffw_norm after their sum.
"""

from __future__ import annotations

BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "post_ffw_norm": "post_feedforward_layernorm",
    "layer_output_scale": "layer_scalar",  # a parameter of the block, not a module's weight
    "inp_gate": "per_layer_input_gate",
    "proj": "per_layer_projection",
    "post_norm": "post_per_layer_input_norm",
    # mixture-of-experts blocks (26B-A4B); "<name>.scale": a module's second tensor, an mlx-lm parameter of its
    # own (gguf_archs.mlx_name looks these whole names up first)
    "pre_ffw_norm_2": "pre_feedforward_layernorm_2",
    "post_ffw_norm_1": "post_feedforward_layernorm_1",
    "post_ffw_norm_2": "post_feedforward_layernorm_2",
    "ffn_gate_inp": "router.proj",
    "ffn_gate_inp.scale": "router.scale",
    "ffn_down_exps.scale": "router.per_expert_scale",
    "ffn_gate_exps": "experts.switch_glu.gate_proj",
    "ffn_up_exps": "experts.switch_glu.up_proj",
    "ffn_down_exps": "experts.switch_glu.down_proj",
}
TOP_LEVEL = {
    "per_layer_token_embd": "model.embed_tokens_per_layer",
    "per_layer_model_proj": "model.per_layer_model_projection",
    "per_layer_proj_norm": "model.per_layer_projection_norm",
}
PARAMETERS = ("layer_scalar",)


def config(f, config: dict) -> dict:
    """mlx-lm's gemma4_text config from the file (`f`: gguf_families.File); model_config built the rest."""
    layers = config["num_hidden_layers"]
    layer_types = _layer_types(f, layers)
    shared = f.get("attention.shared_kv_layers", 0)
    _check_kv_reuse(f, layer_types, layers - shared)
    head_dim, global_head_dim = f.get("attention.key_length_swa"), config["head_dim"]
    if (f.get("attention.value_length", global_head_dim), f.get("attention.value_length_swa", head_dim)) != (
            global_head_dim, head_dim):
        raise f.refuse("gemma4 with value heads of another size than the key heads")
    if f.get("rope.dimension_count_swa", head_dim) != head_dim:
        raise f.refuse("gemma4 with partial rope on the sliding layers")
    k_eq_v = _k_eq_v(f, layer_types, layers - shared)
    kv_heads, global_kv_heads = _kv_heads(f, config["num_key_value_heads"], layer_types, k_eq_v)
    ffn, double_wide = _ffn(f, config["intermediate_size"], layers - shared)
    per_layer = f.get("embedding_length_per_layer_input", 0)
    return {
        "head_dim": head_dim, "global_head_dim": global_head_dim,
        "num_key_value_heads": kv_heads, "num_global_key_value_heads": global_kv_heads, "attention_k_eq_v": k_eq_v,
        "intermediate_size": ffn, "use_double_wide_mlp": double_wide,
        "layer_types": layer_types, "sliding_window": f.get("attention.sliding_window"),
        "num_kv_shared_layers": shared,
        "hidden_size_per_layer_input": per_layer, "vocab_size_per_layer_input": config["vocab_size"],
        # the full layers' rope over the whole global head; the rope_freqs tensor then leaves pairs unrotated
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": config["rope_theta"]},
            "sliding_attention": {"rope_type": "default", "rope_theta": f.get("rope.freq_base_swa", 10000.0)},
        },
        "final_logit_softcapping": f.get("final_logit_softcapping", 0.0) or None,
    } | _experts(f, layers)


def _experts(f, layers: int) -> dict:
    """mlx-lm's MoE keys: its enable_moe_block gives every layer a router and experts, so the file's must."""
    experts = f.get("expert_count", 0)
    if not experts:
        return {"enable_moe_block": False}
    if not all(f"model.layers.{i}.router.proj.weight" in f.tensors for i in range(layers)):
        raise f.refuse("gemma4 with experts but not a router (ffn_gate_inp) in every layer")
    return {"enable_moe_block": True, "num_experts": experts, "top_k_experts": f.get("expert_used_count"),
            "moe_intermediate_size": f.get("expert_feed_forward_length")}


def _layer_types(f, layers: int) -> list[str]:
    pattern = f.get("attention.sliding_window_pattern")
    if not isinstance(pattern, list) or len(pattern) != layers:
        raise f.refuse("gemma4 without a sliding-window flag per layer")
    return ["sliding_attention" if sliding else "full_attention" for sliding in pattern]


def _check_kv_reuse(f, layer_types: list[str], first_shared: int) -> None:
    """llama.cpp's shared layers read layer first_shared-2 (sliding) or -1 (full); mlx-lm's the last
    earlier one of their type: the same only when those two are a sliding then a full layer."""
    if first_shared < len(layer_types) and (first_shared < 2 or layer_types[first_shared - 2: first_shared]
                                            != ["sliding_attention", "full_attention"]):
        raise f.refuse("gemma4 whose KV-shared layers follow other than a sliding then a full layer")


def _k_eq_v(f, layer_types: list[str], first_shared: int) -> bool:
    """The 31B's global layers have no attn_v (values are the keys); sliding layers always have one."""
    def has_v(i):
        return f"model.layers.{i}.self_attn.v_proj.weight" in f.tensors

    kv_layers = range(first_shared)
    if not all(has_v(i) for i in kv_layers if layer_types[i] == "sliding_attention"):
        raise f.refuse("gemma4 with sliding layers whose values are their keys (no attn_v)")
    full_v = {has_v(i) for i in kv_layers if layer_types[i] == "full_attention"}
    if len(full_v) > 1:
        raise f.refuse("gemma4 with attn_v in some global layers only")
    return full_v == {False}


def _kv_heads(f, heads, layer_types: list[str], k_eq_v: bool) -> tuple[int, int | None]:
    """(sliding layers' KV heads, global layers' where they differ); a per-layer array must be one count
    per layer type, and mlx-lm takes another global count only with values as keys."""
    if not isinstance(heads, list):
        return heads, None
    by_type = {t: {h for h, lt in zip(heads, layer_types) if lt == t} for t in set(layer_types)}
    if len(heads) != len(layer_types) or any(len(counts) != 1 for counts in by_type.values()):
        raise f.refuse("gemma4 with KV head counts that vary within a layer type")
    sliding = next(iter(by_type.get("sliding_attention", by_type.get("full_attention"))))
    full = next(iter(by_type.get("full_attention", {sliding})))
    if full != sliding and not k_eq_v:
        raise f.refuse("gemma4 with other KV head counts in global layers that have their own attn_v")
    return sliding, full


def _ffn(f, width, first_shared: int) -> tuple[int, bool]:
    """(intermediate_size, use_double_wide_mlp): a per-layer array is one width, doubled in the shared layers."""
    if not isinstance(width, list):
        return width, False
    base = width[0]
    if all(w == base for w in width):
        return base, False
    if width != [base if i < first_shared else 2 * base for i in range(len(width))]:
        raise f.refuse("gemma4 with feed-forward widths other than one width, doubled in the KV-shared layers")
    return base, True
