"""Tiny random Gemma 4 GGUFs in llama.cpp's layout (conversion/gemma.py's Gemma4Model, src/models/gemma4.cpp).

`write_tiny_gemma4_gguf(path, qtype)` writes an E2B-style model: sliding layers (head 32, window 4) and global
ones (head 64, "proportional" rope on a quarter of it through the rope_freqs tensor), the last two layers
sharing the KV of the last sliding and global ones before them with a double-wide MLP, per-layer inputs, a
layer_output_scale per block, a softcapped tied head. `Gemma4(per_layer=0, shared=0, k_eq_v=True)`: the 31B's
shape instead (no per-layer inputs, global layers without attn_v and with their own KV head count); with
`experts=8` the 26B-A4B's: a router and experts beside every layer's MLP, their gate and up rows in one
ffn_gate_up_exps (or apart: `fused_experts=False`).

`ollama_gemma4(src, dst)` rewrites such a file as Ollama's converter lays it out (the same tensor bytes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import gguf
from ollama_gguf import rewrite
from gguf_fixtures import BOS_ID, EOS_ID, CONTEXT, RMS_EPS, _add_tensor, sentencepiece_vocab


@dataclass(frozen=True)
class Gemma4:
    hidden: int = 64
    heads: int = 2
    kv_heads: int = 1
    global_kv_heads: int = 1
    head_dim: int = 32  # sliding layers'
    global_head_dim: int = 64
    ffn: int = 128
    pattern: tuple = (True, True, False, True, False, True, False)  # true: sliding
    shared: int = 2  # the last layers reuse earlier KV
    per_layer: int = 32  # hidden_size_per_layer_input (0: none)
    k_eq_v: bool = False  # global layers without attn_v
    window: int = 4
    rotated_pairs: int = 8  # of the global head's 32: partial_rotary_factor 0.25
    rope_base: float = 1000000.0
    rope_base_swa: float = 10000.0
    softcap: float = 5.0
    experts: int = 0  # per layer, beside the dense MLP (0: none)
    top_k: int = 2
    expert_ffn: int = 32
    fused_experts: bool = True  # gate and up rows in one ffn_gate_up_exps, as the converter writes them

    @property
    def layers(self) -> int:
        return len(self.pattern)

    def ffn_width(self, i: int) -> int:
        return self.ffn * (2 if i >= self.layers - self.shared else 1)

    def kv(self, i: int) -> int:
        return self.kv_heads if self.pattern[i] else self.global_kv_heads

    def head(self, i: int) -> int:
        return self.head_dim if self.pattern[i] else self.global_head_dim


# Gemma 4's own vocabulary kind ("gemma4": BPE with merges over characters, "▁" for spaces, byte fallback),
# tiny: <pad> <eos> <bos> <unk>, two turn markers, the 256 byte tokens, characters, then one token per merge.
GEMMA4_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"]
GEMMA4_CHARS = list("\u2581abdehilnorstw\n")
GEMMA4_MERGES = ["\u2581 t", "h e", "\u2581t he", "\u2581 w", "o r", "\u2581w or", "l d", "\u2581wor ld", "\n \n",
                 "i s", "\u2581 is", "a n", "\u2581 an", "\u2581an d", "t he", "w or", "wor ld"]


def gemma4_vocab() -> tuple[list[str], list[float], list[int], list[str]]:
    """(tokens, scores, token types, merges) as Gemma 4's converter writes them."""
    tokens = GEMMA4_SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + GEMMA4_CHARS
    tokens += ["".join(merge.split(" ")) for merge in GEMMA4_MERGES]
    types = [3] * len(GEMMA4_SPECIALS) + [6] * 256 + [1] * (len(tokens) - len(GEMMA4_SPECIALS) - 256)
    return tokens, [0.0] * len(tokens), types, GEMMA4_MERGES


def write_tiny_gemma4_gguf(path: str | Path, qtype: str = "Q8_0", seed: int = 0, g: Gemma4 = Gemma4(),
                           metadata: dict | None = None, rounded_through: str | None = None,
                           vocabulary: str = "llama") -> Path:
    """Write the model; `metadata`: keys (without "gemma4.") to add or replace, for refusal tests.
    `rounded_through`: store F32 weights holding the values that type gives (the same seed's weights, as a
    file of that type dequantized: a reference without llama.cpp's quantized activations).
    `vocabulary`: "llama" (the sentencepiece fixture's) or "gemma4" (gemma4_vocab, BOS added)."""
    path, rng = Path(path), np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "gemma4")
    writer.add_name(f"tiny-gemma4-{qtype}")
    keys = _metadata(g) | (metadata or {})
    for key, value in keys.items():
        add = {int: writer.add_uint32, float: writer.add_float32, list: writer.add_array}[type(value)]
        add(f"gemma4.{key}", value)
    tokens = _write_vocabulary(writer, vocabulary)
    rope_freqs = [1.0] * g.rotated_pairs + [1e30] * (g.global_head_dim // 2 - g.rotated_pairs)
    writer.add_tensor("rope_freqs.weight", np.array(rope_freqs, np.float32))
    for name, shape in tensor_shapes(g, len(tokens)).items():
        data = rng.standard_normal(shape).astype(np.float32) * (1.0 if len(shape) == 1 else shape[-1] ** -0.5)
        if re.search(r"norm(_\d)?\.weight$", name):  # stored as w: Gemma 4's norms multiply by it
            data = 1.0 + 0.1 * data
        if name.endswith(("attn_q_norm.weight", "attn_k_norm.weight")):  # attention logits O(1) at scale 1
            data *= 0.3
        if name.endswith("ffn_gate_inp.weight"):  # router logits O(1): clear choices, not near ties
            data *= 4.0
        if name.endswith(("layer_output_scale.weight", ".scale")):  # the router's scales too
            data = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        if rounded_through and len(shape) > 1:
            qt = gguf.GGMLQuantizationType[rounded_through]
            data = gguf.quants.dequantize(gguf.quants.quantize(data, qt), qt).astype(np.float32)
        for part, values in _stored(g, name, data):
            _add_tensor(writer, part, values, "F32" if len(shape) == 1 or rounded_through else qtype, rng)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _stored(g: Gemma4, name: str, data: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """The tensors a weight is written as: the fused experts' gate and up rows apart where `fused_experts` is off
    (the same values either way)."""
    if g.fused_experts or not name.endswith("ffn_gate_up_exps.weight"):
        return [(name, data)]
    gate, up = np.split(data, 2, axis=1)
    return [(name.replace("gate_up", "gate"), gate), (name.replace("gate_up", "up"), up)]


def _write_vocabulary(writer: gguf.GGUFWriter, vocabulary: str) -> list[str]:
    if vocabulary == "gemma4":
        tokens, scores, types, merges = gemma4_vocab()
        writer.add_token_merges(merges)
        writer.add_add_space_prefix(False)
        ids = (3, 2, 1, True)  # unk, bos, eos, add BOS
    else:
        (tokens, scores, types), ids = sentencepiece_vocab(), (0, BOS_ID, EOS_ID, False)
    writer.add_tokenizer_model(vocabulary)
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(ids[0])
    writer.add_bos_token_id(ids[1])
    writer.add_eos_token_id(ids[2])
    writer.add_add_bos_token(ids[3])
    return tokens


def _metadata(g: Gemma4) -> dict:
    heads_kv = g.kv_heads if g.kv_heads == g.global_kv_heads else [g.kv(i) for i in range(g.layers)]
    widths = [g.ffn_width(i) for i in range(g.layers)]
    return {
        "context_length": CONTEXT, "embedding_length": g.hidden, "block_count": g.layers,
        "feed_forward_length": widths if len(set(widths)) > 1 else g.ffn,
        "attention.head_count": g.heads, "attention.head_count_kv": heads_kv,
        "attention.layer_norm_rms_epsilon": RMS_EPS,
        "attention.key_length": g.global_head_dim, "attention.value_length": g.global_head_dim,
        "attention.key_length_swa": g.head_dim, "attention.value_length_swa": g.head_dim,
        "attention.sliding_window": g.window, "attention.sliding_window_pattern": list(g.pattern),
        "attention.shared_kv_layers": g.shared, "embedding_length_per_layer_input": g.per_layer,
        "rope.dimension_count": g.global_head_dim, "rope.dimension_count_swa": g.head_dim,
        "rope.freq_base": g.rope_base, "rope.freq_base_swa": g.rope_base_swa,
        "final_logit_softcapping": g.softcap,
    } | ({"expert_count": g.experts, "expert_used_count": g.top_k, "expert_feed_forward_length": g.expert_ffn}
         if g.experts else {})


def tensor_shapes(g: Gemma4, vocab: int) -> dict[str, tuple[int, ...]]:
    """GGUF name -> numpy shape (out, in), as llama.cpp's converter writes them (KV-shared layers keep
    their k/v projections, as the checkpoints have them; llama.cpp and mlx-lm leave them unused)."""
    h, p, n = g.hidden, g.per_layer, g.layers
    shapes = {"token_embd.weight": (vocab, h)}
    if p:
        shapes |= {"per_layer_token_embd.weight": (vocab, n * p), "per_layer_model_proj.weight": (n * p, h),
                   "per_layer_proj_norm.weight": (p,)}
    for i in range(n):
        b, hd, kv, f = f"blk.{i}", g.head(i), g.kv(i) * g.head(i), g.ffn_width(i)
        shapes |= {f"{b}.attn_norm.weight": (h,), f"{b}.attn_q.weight": (g.heads * hd, h), f"{b}.attn_k.weight": (kv, h)}
        if g.pattern[i] or not g.k_eq_v:
            shapes[f"{b}.attn_v.weight"] = (kv, h)
        shapes |= {f"{b}.attn_output.weight": (h, g.heads * hd), f"{b}.attn_q_norm.weight": (hd,),
                   f"{b}.attn_k_norm.weight": (hd,), f"{b}.post_attention_norm.weight": (h,),
                   f"{b}.ffn_norm.weight": (h,), f"{b}.ffn_gate.weight": (f, h), f"{b}.ffn_up.weight": (f, h),
                   f"{b}.ffn_down.weight": (h, f), f"{b}.post_ffw_norm.weight": (h,),
                   f"{b}.layer_output_scale.weight": (1,)}
        if g.experts:
            shapes |= _expert_shapes(g, b)
        if p:
            shapes |= {f"{b}.inp_gate.weight": (p, h), f"{b}.proj.weight": (h, p), f"{b}.post_norm.weight": (h,)}
    shapes["output_norm.weight"] = (h,)
    return shapes


def _expert_shapes(g: Gemma4, b: str) -> dict[str, tuple[int, ...]]:
    """A MoE block's tensors (HF's router.proj, router.scale, experts.gate_up_proj, experts.down_proj,
    router.per_expert_scale and the three extra norms, under the converter's names)."""
    h, e, f = g.hidden, g.experts, g.expert_ffn
    return {f"{b}.pre_ffw_norm_2.weight": (h,), f"{b}.post_ffw_norm_1.weight": (h,),
            f"{b}.post_ffw_norm_2.weight": (h,), f"{b}.ffn_gate_inp.weight": (e, h), f"{b}.ffn_gate_inp.scale": (h,),
            f"{b}.ffn_gate_up_exps.weight": (e, 2 * f, h), f"{b}.ffn_down_exps.weight": (e, h, f),
            f"{b}.ffn_down_exps.scale": (e,)}


# An Ollama blob's towers (convert/convert_gemma4.go's names; model.vision_tower.*: a prefix its compat layer hides)
OLLAMA_TOWERS = {"v.blk.0.attn_q.weight": np.ones((8, 8)), "v.clamp_data": np.ones(32), "mm.input_projection.weight":
                 np.ones((64, 8)), "a.blk.0.attn_q.weight": np.ones((8, 8)), "mm.a.fc.weight": np.ones((8, 8)),
                 "model.vision_tower.std_bias": np.ones(8)}


def ollama_gemma4(src: str | Path, dst: str | Path, **extra) -> Path:
    """`src` (vocabulary="gemma4"; MoE with fused_experts=False) as Ollama publishes it (convert/convert_gemma4.go,
    convert/tokenizer.go; what llama/compat/llama-ollama-compat.cpp's handle_gemma4 undoes): the BPE vocabulary
    named "llama", typed and scored from tokenizer.json (byte tokens NORMAL, scores the ids), EOS ids from
    generation_config; vision and audio keys and towers in the file; the per-expert scale under the router."""
    meta = gguf.GGUFReader(str(src)).fields
    tokens = meta["tokenizer.ggml.tokens"].contents()
    types = [3 if t == 3 else 1 for t in meta["tokenizer.ggml.token_type"].contents()]
    blocks = meta["gemma4.block_count"].contents()
    renames = {f"blk.{i}.ffn_down_exps.scale": f"blk.{i}.ffn_gate_inp.per_expert_scale" for i in range(blocks)}
    keys = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "gemma4", "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": [float(i) for i in range(len(tokens))], "tokenizer.ggml.eos_token_ids": [1, 5],
            "gemma4.vision.block_count": 1, "gemma4.vision.embedding_length": 8, "gemma4.audio.block_count": 1}
    return rewrite(src, dst, renames=renames | extra.pop("renames", {}), set=keys | extra.pop("set", {}),
                   extra_tensors=OLLAMA_TOWERS | extra.pop("extra_tensors", {}), **extra)
