"""Qwen3.5 / Qwen3.6 GGUFs (llama.cpp's `qwen35` and `qwen35moe`) and Qwen3-Next's (`qwen3next`) on mlx-lm's
qwen3_5 module (Qwen3-Next's layers are the same math; its converter keeps Hugging Face's grouped value heads,
fuses beta and alpha in ssm_ba, per key head its value heads' betas then their alphas, and writes no M-RoPE
sections: plain NEOX rope).

Three of every four layers are gated delta-net layers (linear attention with a recurrent state),
the fourth gated full attention. What llama.cpp's converter (conversion/qwen.py) changed, undone here:
- A_log is stored as ssm_a = -exp(A_log), dt_bias as ssm_dt.bias, the conv kernel squeezed to
  (channels, width): mlx-lm's Conv1d wants (channels, width, 1).
- V heads are reordered from grouped by K head (Hugging Face's order; mlx-lm repeats each k head
  over its r = nv / nk v heads) to tiled (ggml's broadcast): tiled head j * nk + g is grouped head
  g * r + j. That touches the V rows of attn_qkv and the conv kernel, the rows of attn_gate,
  ssm_alpha and ssm_beta, ssm_a and ssm_dt, and the columns of ssm_out. Whole heads move, and a V head
  is a multiple of 32 values, so quantized rows and column groups move without touching a code.
- Norm weights are stored as 1 + w (all but the gated norm), which mlx-lm's module multiplies by as
  they are (its sanitize adds the 1 to Hugging Face's weights only).
- Multi-token-prediction (nextn) blocks come after the trunk's layers; gguf_archs skips them (the mtp
  drafter reads them: heads/mtp.py).
The attention layers' rope is M-RoPE, whose sections all carry a text token's one position: NEOX rope
on the first rope.dimension_count dims of each head (llama.cpp's interleaved layout leaves a pair outside
the sections unrotated; Qwen3.5's [11, 11, 10] covers its 32 pairs). llama.cpp itself gives a float32
file's logits within 3e-5 of mlxspec's (tests/test_gguf_archs.py, where llama-cpp-python is installed). Ollama's own converter writes another layout
(alpha and beta fused in ssm_ba, Hugging Face's value-head order, per-layer KV head counts): refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from .errors import ModelLoadError
from .gguf_quants import GROUP

ARCHS = ("qwen35", "qwen35moe", "qwen3next")
TILED = ("qwen35", "qwen35moe")  # value heads in ggml's tiled order (Qwen3-Next's stay grouped)
BLOCK = {  # GGUF block tensor -> mlx-lm qwen3_5 name (attention layers: gguf_archs' llama names and q/k norms)
    "post_attention_norm": "post_attention_layernorm",
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
    "ssm_dt": "linear_attn.dt_bias",  # "blk.N.ssm_dt.bias": a parameter
    "ssm_a": "linear_attn.A_log",  # "blk.N.ssm_a", no suffix: a parameter
}
MOE_BLOCK = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
    "ffn_up_exps": "mlp.switch_mlp.up_proj",
    "ffn_down_exps": "mlp.switch_mlp.down_proj",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
PARAMETERS = ("linear_attn.dt_bias", "linear_attn.A_log")


@dataclass(frozen=True)
class Heads:
    k_heads: int  # ssm.group_count
    v_heads: int  # ssm.time_step_rank
    k_dim: int  # ssm.state_size
    v_dim: int  # ssm.inner_size / v_heads
    tiled: bool = True  # value heads in ggml's tiled order (qwen35); Qwen3-Next's are grouped

    @classmethod
    def from_header(cls, name: str, header) -> Heads:
        """The file's delta-net head sizes; Ollama's own conversion of Qwen3.5 is refused by name: it fuses
        alpha and beta (ssm_ba), keeps Hugging Face's value-head order and writes other keys, and no blob of
        it was at hand to check a translation against."""
        if name in TILED and any(t.name.endswith(".ssm_ba.weight") for t in header.tensors):
            raise ModelLoadError(f"{header.path.name}: Ollama's own conversion of Qwen3.5 (fused ssm_ba) is not "
                                 "supported; use a GGUF made by llama.cpp's converter (e.g. unsloth's or bartowski's)")
        heads = cls.from_metadata(name, header.metadata, header.path)
        return heads if name in TILED else cls(heads.k_heads, heads.v_heads, heads.k_dim, heads.v_dim, tiled=False)

    @classmethod
    def from_metadata(cls, name: str, metadata: dict, path: Path) -> Heads:
        keys = [f"{name}.ssm.{key}" for key in ("group_count", "time_step_rank", "state_size", "inner_size")]
        missing = [key for key in keys if not metadata.get(key)]
        if missing:
            raise ModelLoadError(f"{path.name}: metadata key {missing[0]} is missing")
        k_heads, v_heads, k_dim, inner = (metadata[key] for key in keys)
        if v_heads % k_heads or inner % v_heads:
            raise ModelLoadError(f"{path.name}: {v_heads} delta-net value heads over {k_heads} key heads "
                                 f"({inner} values) is not supported")
        if (inner // v_heads) % GROUP:  # heads move as whole quantization groups
            raise ModelLoadError(f"{path.name}: delta-net value heads of {inner // v_heads} dims "
                                 f"(not a multiple of {GROUP}) are not supported")
        return cls(k_heads, v_heads, k_dim, inner // v_heads)

    def grouped(self) -> mx.array:
        """Index of each grouped head's tiled position: grouped head g * r + j sits at j * nk + g."""
        r = self.v_heads // self.k_heads
        return mx.arange(self.v_heads).reshape(r, self.k_heads).T.reshape(-1)


def config(f, config: dict) -> dict:
    """mlx-lm's qwen3_5 / qwen3_5_moe config (a flat one: its ModelArgs takes it as the text config). The
    head sizes were checked when the tensors were read (Heads.from_metadata)."""
    get = f.get
    k_heads, v_heads, inner = get("ssm.group_count"), get("ssm.time_step_rank"), get("ssm.inner_size")
    layers = config["num_hidden_layers"] - get("nextn_predict_layers", 0)
    partial = get("rope.dimension_count", config["head_dim"]) / config["head_dim"]
    extra = {
        "num_hidden_layers": layers, "full_attention_interval": get("full_attention_interval", 4),
        "linear_num_key_heads": k_heads, "linear_num_value_heads": v_heads,
        "linear_key_head_dim": get("ssm.state_size"), "linear_value_head_dim": inner // v_heads,
        "linear_conv_kernel_dim": get("ssm.conv_kernel"), "partial_rotary_factor": partial,
        "rope_parameters": {"type": "default", "rope_theta": config["rope_theta"], "partial_rotary_factor": partial},
    }
    if f.name in ("qwen35moe", "qwen3next"):
        extra |= {"num_experts": get("expert_count"), "num_experts_per_tok": get("expert_used_count"),
                  "moe_intermediate_size": get("expert_feed_forward_length"),
                  "shared_expert_intermediate_size": get("expert_shared_feed_forward_length"),
                  "decoder_sparse_step": 1, "norm_topk_prob": True}
    return extra


def adapt(gguf_name: str, arrays: dict, heads: Heads) -> dict:
    """One converted tensor (MLX arrays: weight, and scales/biases when quantized) back in the layout
    mlx-lm's qwen3_5 reads; other tensors pass through."""
    parts = gguf_name.split(".")
    role = parts[2] if parts[0] == "blk" else None
    order = heads.grouped() if heads.tiled and heads.v_heads != heads.k_heads else None
    qk_rows = 2 * heads.k_heads * heads.k_dim
    if role in ("attn_qkv", "ssm_conv1d") and order is not None:  # q and k rows stay; v rows move by head
        rows = mx.concatenate([mx.arange(qk_rows), qk_rows + _head_rows(order, heads.v_dim)])
        arrays = {key: a[rows] for key, a in arrays.items()}
    elif role in ("attn_gate", "ssm_alpha", "ssm_beta", "ssm_a", "ssm_dt") and order is not None:
        size = heads.v_dim if role == "attn_gate" else 1
        arrays = {key: a[_head_rows(order, size)] for key, a in arrays.items()}
    elif role == "ssm_out" and order is not None:  # columns: each head an equal share of every packed row
        arrays = {key: _move_column_heads(a, order) for key, a in arrays.items()}
    if role == "ssm_a":
        return {"weight": mx.log(-arrays["weight"].astype(mx.float32))}
    if role == "ssm_conv1d":
        return {"weight": arrays["weight"][..., None]}
    if role == "ffn_gate_inp_shexp":  # a vector in the file; mlx-lm's gate is a Linear to one output
        return {key: a.reshape(1, -1) for key, a in arrays.items()}
    return arrays


def split_ba(gguf_name: str, arrays: dict, heads: Heads) -> dict:
    """Qwen3-Next's ssm_ba rows (per key head: its value heads' betas, then their alphas) reordered to all betas,
    then all alphas, so its halves are ssm_beta and ssm_alpha (gguf_archs.unfused); other tensors as they are."""
    if not gguf_name.endswith(".ssm_ba.weight"):
        return arrays
    r = heads.v_heads // heads.k_heads
    rows = mx.arange(2 * heads.v_heads).reshape(heads.k_heads, 2, r).transpose(1, 0, 2).reshape(-1)
    return {key: a[rows] for key, a in arrays.items()}


def _head_rows(order: mx.array, size: int) -> mx.array:
    return (order[:, None] * size + mx.arange(size)[None, :]).reshape(-1)


def _move_column_heads(a: mx.array, order: mx.array) -> mx.array:
    rows, cols = a.shape
    return a.reshape(rows, order.size, cols // order.size)[:, order].reshape(rows, cols)
