"""An independent reference for GGUF models: a float64 numpy forward pass with llama.cpp's semantics.

    weights = dequantized_weights(path)                  # {gguf name: float32}, via gguf-py alone
    logits = forward(weights, Hparams(arch="gemma3", ...), tokens)

It shares nothing with mlxspec or mlx-lm: the weights come from gguf-py's reader and reference
dequantizer under their GGUF names, the hyperparameters from the test that wrote the file, and
the maths follows llama.cpp's graph (src/models/*.cpp) directly: norms multiply by the stored
weight (gemma's 1 + w as stored), rope is "normal" (interleaved pairs) for llama and NEOX
(halves) for the others, phi3's fused tensors are split here, gemma's GELU is the tanh form.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

import gguf

NEOX_ARCHS = ("qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "qwen3moe", "gpt-oss", "starcoder2", "olmo2",
              "exaone", "nemotron", "qwen2vl", "qwen25vl", "qwen3vl", "qwen3vlmoe", "stablelm", "qwen35", "qwen35moe",
              "qwen35moe-fused", "qwen3next")  # the VL models' M-RoPE on text: NEOX


@dataclass
class Hparams:
    arch: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    rope_base: float = 10000.0
    rope_dims: int | None = None  # partial rotary (phi3)
    rope_scale: float = 1.0  # linear scaling factor (positions divided by it)
    freq_factors: np.ndarray | None = None  # llama-3 rope_freqs, phi3's rope_factors_short/long
    attn_factor: float = 1.0  # rope.scaling.attn_factor: multiplies cos and sin (llama.cpp's rope mscale)
    attn_scale: float | None = None  # default 1/sqrt(head_dim)
    attn_softcap: float | None = None  # gemma2
    final_softcap: float | None = None  # gemma2
    swa_window: int | None = None  # gemma3: sliding layers see this many positions
    swa_pattern: int = 6  # gemma3: every 6th layer is global
    swa_rope_base: float = 10000.0  # gemma3 sliding layers' rope base
    experts_used: int = 2  # qwen3moe, gpt-oss: experts per token
    norm_topk: bool = True  # qwen3moe: the chosen experts' weights renormalized to sum to 1
    yarn: tuple[float, int] | None = None  # gpt-oss, mistral3: YaRN (factor, original context), betas 32 and 1
    yarn_magnitude: bool = True  # YaRN's 1 + 0.1 ln(factor) on cos and sin (mistral3's graph cancels it)
    attn_temp: tuple[float, int] | None = None  # mistral3: queries x 1 + beta ln(1 + floor(pos / original context))
    sinks: bool = True  # gpt-oss: each head's learned sink joins its softmax
    embed_scale: float = 1.0  # granite: embeddings times this
    residual_scale: float = 1.0  # granite: each block's attention and FFN outputs times this
    logit_scale: float = 1.0  # granite: logits divided by this (cohere2: multiplied by its inverse)
    parallel: bool = False  # cohere2: attention and the MLP both read the block's one norm; both added
    nope_global: bool = False  # cohere2: the global (non-sliding) layers take no rope
    nope_step: int = 0  # smollm3: every nope_step-th layer takes no rope
    mla: tuple[int, int, int, int] | None = None  # deepseek2: (q/k no-rope dims, rope dims, v dims, kv latent rank)
    expert_scale: float = 1.0  # deepseek2: the routed experts' weights times this
    delta: tuple[int, int, int, int] | None = None  # qwen35: its delta-net layers' (k heads, v heads, k dim, v dim)
    tiled: bool = True  # qwen35: v head h reads k head h % k_heads (ggml's broadcast; grouped: h // (v / k))
    layers: int | None = None  # the blocks to run (a file's MTP blocks come after them)


def dequantized_weights(path) -> dict[str, np.ndarray]:
    """{GGUF tensor name: float32 array (numpy order)} with gguf-py's reader and dequantizer."""
    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        out[t.name] = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(shape)
    return out


def forward(w: dict[str, np.ndarray], hp: Hparams, tokens: list[int]) -> np.ndarray:
    """Logits (T, vocab), float64."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    gemma = hp.arch.startswith("gemma")
    x = w["token_embd.weight"][tokens] * hp.embed_scale
    if gemma:
        x = x * np.sqrt(hp.hidden)
    n_layers = hp.layers or 1 + max(int(k.split(".")[1]) for k in w if k.startswith("blk."))
    for i in range(n_layers):
        x = _block(w, f"blk.{i}.", hp, i, x)
    x = _norm(w, "output_norm", hp, x)
    logits = x @ w.get("output.weight", w["token_embd.weight"]).T
    if hp.final_softcap:
        logits = np.tanh(logits / hp.final_softcap) * hp.final_softcap
    return logits / hp.logit_scale


def _block(w, p, hp: Hparams, layer: int, x):
    if hp.mla is not None:
        return _mla_block(w, p, hp, x)
    if hp.delta is not None:
        return _qwen35_block(w, p, hp, x)
    T, hd = len(x), hp.head_dim
    olmo2 = hp.arch == "olmo2"  # no norm before attention or the MLP; q/k normed over whole projections
    h = x if olmo2 else _norm(w, p + "attn_norm", hp, x)
    if p + "attn_qkv.weight" in w:  # phi3: q rows, then k, then v
        q, k, v = np.split(h @ w[p + "attn_qkv.weight"].T, [hp.heads * hd, (hp.heads + hp.kv_heads) * hd], axis=-1)
    else:
        q, k, v = (h @ w[p + f"attn_{n}.weight"].T + w.get(p + f"attn_{n}.bias", 0.0) for n in "qkv")
    if olmo2:
        q, k = _rms(q, w[p + "attn_q_norm.weight"], hp.eps), _rms(k, w[p + "attn_k_norm.weight"], hp.eps)
    q, k, v = q.reshape(T, hp.heads, hd), k.reshape(T, hp.kv_heads, hd), v.reshape(T, hp.kv_heads, hd)
    if p + "attn_q_norm.weight" in w and not olmo2:  # command-r: a LayerNorm per head, a weight row each
        norm = _layer_norm if hp.arch == "command-r" else _rms
        q, k = norm(q, w[p + "attn_q_norm.weight"], hp.eps), norm(k, w[p + "attn_k_norm.weight"], hp.eps)

    sliding = hp.swa_window is not None and layer % hp.swa_pattern < hp.swa_pattern - 1
    gemma_local = sliding and hp.arch.startswith("gemma")  # gemma3's local layers: their own rope
    base, scale = (hp.swa_rope_base, 1.0) if gemma_local else (hp.rope_base, hp.rope_scale)
    if not (hp.nope_global and not sliding) and not (hp.nope_step and (layer + 1) % hp.nope_step == 0):
        q, k = (_rope(t, hp, base, scale) for t in (q, k))
    if hp.attn_temp is not None:  # llama.cpp's attn_temp input (mistral3: no position offset)
        beta, context = hp.attn_temp
        q = q * (1 + beta * np.log(1 + np.floor(np.arange(T) / context)))[:, None, None]

    scores = np.einsum("thd,shd->hts", q, np.repeat(k, hp.heads // hp.kv_heads, axis=1))
    scores *= hp.attn_scale or hd**-0.5
    if hp.attn_softcap:
        scores = np.tanh(scores / hp.attn_softcap) * hp.attn_softcap
    pos = np.arange(T)
    allowed = pos[None, :] <= pos[:, None]
    if sliding:
        allowed &= pos[:, None] - pos[None, :] < hp.swa_window
    scores = np.where(allowed, scores, -np.inf)
    sink = w.get(p + "attn_sinks.weight") if hp.sinks else None
    top = scores.max(-1, keepdims=True) if sink is None else np.maximum(scores.max(-1, keepdims=True), sink[:, None, None])
    probs = np.exp(scores - top)
    # a sink adds exp(sink) to the softmax's denominator, no value (llama.cpp's soft_max_add_sinks)
    probs /= probs.sum(-1, keepdims=True) + (0.0 if sink is None else np.exp(sink[:, None, None] - top))
    out = np.einsum("hts,shd->thd", probs, np.repeat(v, hp.heads // hp.kv_heads, axis=1)).reshape(T, -1)
    out = out @ w[p + "attn_output.weight"].T + w.get(p + "attn_output.bias", 0.0)
    if hp.arch == "gpt-oss":  # its post_attention_norm is the experts' input norm
        return x + out + _oai_moe(w, p, hp, _rms(x + out, w[p + "post_attention_norm.weight"], hp.eps))
    if p + "post_attention_norm.weight" in w:
        out = _rms(out, w[p + "post_attention_norm.weight"], hp.eps)
    if hp.parallel:  # the MLP reads the attention's input norm; x, attention and MLP outputs added
        x, out = x + out, 0.0
    x = x + out * hp.residual_scale

    h = h if hp.parallel else x if olmo2 else _norm(w, p + "ffn_norm", hp, x)
    if p + "ffn_gate_inp.weight" in w:
        return x + _moe(w, p, hp, h) * hp.residual_scale
    if hp.arch == "nemotron":  # llama.cpp's LLM_FFN_RELU_SQR, LLM_FFN_SEQ: up, relu squared, down
        return x + np.maximum(h @ w[p + "ffn_up.weight"].T, 0.0) ** 2 @ w[p + "ffn_down.weight"].T
    if hp.arch == "starcoder2":  # llama.cpp's LLM_FFN_GELU, LLM_FFN_SEQ: up, GELU, down, each biased
        up = h @ w[p + "ffn_up.weight"].T + w[p + "ffn_up.bias"]
        return x + _gelu_tanh(up) @ w[p + "ffn_down.weight"].T + w[p + "ffn_down.bias"]
    if p + "ffn_gate.weight" in w:
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
    else:  # phi3: gate rows, then up rows
        gate, up = np.split(h @ w[p + "ffn_up.weight"].T, 2, axis=-1)
    act = _gelu_tanh(gate) if hp.arch.startswith("gemma") else gate / (1 + np.exp(-gate))
    out = (act * up) @ w[p + "ffn_down.weight"].T
    if p + "post_ffw_norm.weight" in w:
        out = _rms(out, w[p + "post_ffw_norm.weight"], hp.eps)
    return x + out * hp.residual_scale


def _mla_block(w, p, hp: Hparams, x):
    """llama.cpp's deepseek2 block without the absorption: q (or its LoRA), the latent kv split into its
    compressed part (normed, then expanded to k_nope and v per head) and one rope key shared by the heads;
    interleaved rope on the rope dims only; the scale hp.attn_scale; then a dense FFN or experts + shared."""
    T, heads = len(x), hp.heads
    nope, rope, vd, kvr = hp.mla
    h = _rms(x, w[p + "attn_norm.weight"], hp.eps)
    if p + "attn_q.weight" in w:
        q = h @ w[p + "attn_q.weight"].T
    else:
        q = _rms(h @ w[p + "attn_q_a.weight"].T, w[p + "attn_q_a_norm.weight"], hp.eps) @ w[p + "attn_q_b.weight"].T
    q = q.reshape(T, heads, nope + rope)
    latent = h @ w[p + "attn_kv_a_mqa.weight"].T
    kv_b = w.get(p + "attn_kv_b.weight")
    if kv_b is None:  # llama.cpp's newer layout: k_b (heads, kv_lora, nope) and v_b (heads, v, kv_lora)
        kv_b = np.concatenate([w[p + "attn_k_b.weight"].transpose(0, 2, 1), w[p + "attn_v_b.weight"]], axis=1).reshape(-1, kvr)
    kv = (_rms(latent[:, :kvr], w[p + "attn_kv_a_norm.weight"], hp.eps) @ kv_b.T).reshape(T, heads, nope + vd)
    rotary = dataclasses.replace(hp, rope_dims=rope)
    q_pe = _rope(q[..., nope:], rotary, hp.rope_base, hp.rope_scale)
    k_pe = _rope(latent[:, None, kvr:], rotary, hp.rope_base, hp.rope_scale)
    q = np.concatenate([q[..., :nope], q_pe], axis=-1)
    k = np.concatenate([kv[..., :nope], np.repeat(k_pe, heads, axis=1)], axis=-1)
    scores = np.einsum("thd,shd->hts", q, k) * (hp.attn_scale or (nope + rope) ** -0.5)
    pos = np.arange(T)
    scores = np.where(pos[None, :] <= pos[:, None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("hts,shd->thd", probs, kv[..., nope:]).reshape(T, -1) @ w[p + "attn_output.weight"].T
    return _swiglu_ffn(w, p, hp, x + out, "ffn_norm")


def _qwen35_block(w, p, hp: Hparams, x):
    """llama.cpp's qwen35 block: a delta-net or gated attention layer, then the FFN (or experts), each
    after an RMS norm and added to the residual."""
    h = _rms(x, w[p + "attn_norm.weight"], hp.eps)
    x = x + (_delta_net(w, p, hp, h) if p + "ssm_a" in w else _gated_attention(w, p, hp, h))
    return _swiglu_ffn(w, p, hp, x, "post_attention_norm")


def _swiglu_ffn(w, p, hp: Hparams, x, norm: str):
    """x plus the SwiGLU FFN (or the experts) of x after the RMS norm `norm`."""
    h = _rms(x, w[p + norm + ".weight"], hp.eps)
    if p + "ffn_gate_inp.weight" in w:
        return x + _moe(w, p, hp, h)
    gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
    return x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T


def mtp_logits(w: dict, hp: Hparams, tokens: list[int], hidden: np.ndarray, p: str, swap: bool = False) -> np.ndarray:
    """llama.cpp's qwen35 MTP graph (the block's tensors under prefix `p`): entry t reads (token t, the target's
    normed hidden state at t - 1); `swap` puts the hidden state first (wrong: the test's teeth)."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    e = _rms(w["token_embd.weight"][tokens], w[p + "nextn.enorm.weight"], hp.eps)
    h = _rms(hidden.astype(np.float64), w[p + "nextn.hnorm.weight"], hp.eps)
    x = np.concatenate([h, e] if swap else [e, h], axis=-1) @ w[p + "nextn.eh_proj.weight"].T
    x = x + _gated_attention(w, p, hp, _rms(x, w[p + "attn_norm.weight"], hp.eps))
    x = _swiglu_ffn(w, p, hp, x, "post_attention_norm")
    return _rms(x, w[p + "nextn.shared_head_norm.weight"], hp.eps) @ w["output.weight"].T


def _gated_attention(w, p, hp: Hparams, h):
    """Each head's q rows followed by its gate rows; q/k RMS-normed per head, NEOX rope on rope_dims, causal
    softmax attention, the output times sigmoid(gate)."""
    T, hd = len(h), hp.head_dim
    qg = (h @ w[p + "attn_q.weight"].T).reshape(T, hp.heads, 2 * hd)
    q, gate = _rms(qg[..., :hd], w[p + "attn_q_norm.weight"], hp.eps), qg[..., hd:].reshape(T, -1)
    k = _rms((h @ w[p + "attn_k.weight"].T).reshape(T, hp.kv_heads, hd), w[p + "attn_k_norm.weight"], hp.eps)
    v = (h @ w[p + "attn_v.weight"].T).reshape(T, hp.kv_heads, hd)
    q, k = _rope(q, hp, hp.rope_base, 1.0), _rope(k, hp, hp.rope_base, 1.0)
    scores = np.einsum("thd,shd->hts", q, np.repeat(k, hp.heads // hp.kv_heads, axis=1)) * hd**-0.5
    pos = np.arange(T)
    scores = np.where(pos[None, :] <= pos[:, None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum("hts,shd->thd", probs, np.repeat(v, hp.heads // hp.kv_heads, axis=1)).reshape(T, -1)
    return (out / (1 + np.exp(-gate))) @ w[p + "attn_output.weight"].T


def _delta_net(w, p, hp: Hparams, h):
    """The gated delta rule as llama.cpp's graph runs it: q/k/v through a causal depthwise conv and SiLU, q/k
    L2-normed (q also by 1/sqrt(k dim)); per v head a (k dim, v dim) state decayed by exp(softplus(alpha + dt)
    * ssm_a), corrected towards v by beta = sigmoid(b), read by q; then an RMS norm times SiLU(z) and out."""
    nk, nv, dk, dv = hp.delta
    T = len(h)
    qkv = h @ w[p + "attn_qkv.weight"].T  # (T, 2 nk dk + nv dv)
    z = (h @ w[p + "attn_gate.weight"].T).reshape(T, nv, dv)
    if p + "ssm_ba.weight" in w:  # Qwen3-Next: per key head, its value heads' beta rows, then their alpha rows
        ba = (h @ w[p + "ssm_ba.weight"].T).reshape(T, nk, 2, nv // nk)
        b, a = ba[:, :, 0].reshape(T, nv), ba[:, :, 1].reshape(T, nv)
    else:
        b, a = h @ w[p + "ssm_beta.weight"].T, h @ w[p + "ssm_alpha.weight"].T
    beta = 1 / (1 + np.exp(-b))  # (T, nv)
    decay = np.exp(np.logaddexp(0, a + w[p + "ssm_dt.bias"]) * w[p + "ssm_a"])
    kernel = w[p + "ssm_conv1d.weight"]  # (channels, width)
    padded = np.concatenate([np.zeros((kernel.shape[1] - 1, qkv.shape[1])), qkv])
    conv = sum(kernel[:, j] * padded[j : j + T] for j in range(kernel.shape[1]))
    conv = conv / (1 + np.exp(-conv))
    q, k = conv[:, : nk * dk].reshape(T, nk, dk), conv[:, nk * dk : 2 * nk * dk].reshape(T, nk, dk)
    v = conv[:, 2 * nk * dk :].reshape(T, nv, dv)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) * dk**-0.5
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    source = np.arange(nv) % nk if hp.tiled else np.arange(nv) // (nv // nk)
    state, out = np.zeros((nv, dk, dv)), np.zeros((T, nv, dv))
    for t in range(T):
        qt, kt = q[t, source], k[t, source]  # (nv, dk)
        state = state * decay[t][:, None, None]
        delta = (v[t] - np.einsum("hk,hkv->hv", kt, state)) * beta[t][:, None]
        state = state + kt[:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hk,hkv->hv", qt, state)
    out = _rms(out, w[p + "ssm_norm.weight"], hp.eps) * (z / (1 + np.exp(-z)))
    return out.reshape(T, -1) @ w[p + "ssm_out.weight"].T


def _moe(w, p, hp: Hparams, h):
    """llama.cpp's build_moe_ffn (softmax gating, SiLU): per token, the top experts' SwiGLU outputs
    weighted by their router probabilities (renormalized over the chosen ones with norm_topk, times
    expert_scale); then any shared experts' SwiGLU (deepseek2) added."""
    logits = h @ w[p + "ffn_gate_inp.weight"].T  # (T, experts)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(len(h)):
        chosen = np.argsort(-probs[t])[: hp.experts_used]
        weights = probs[t, chosen] / (probs[t, chosen].sum() if hp.norm_topk else 1.0) * hp.expert_scale
        for e, weight in zip(chosen, weights):
            if p + "ffn_gate_up_exps.weight" in w:  # fused: gate rows, then up rows
                gate, up = np.split(w[p + "ffn_gate_up_exps.weight"][e] @ h[t], 2)
            else:
                gate, up = w[p + "ffn_gate_exps.weight"][e] @ h[t], w[p + "ffn_up_exps.weight"][e] @ h[t]
            out[t] += weight * (w[p + "ffn_down_exps.weight"][e] @ (gate / (1 + np.exp(-gate)) * up))
    if p + "ffn_gate_shexp.weight" in w:
        gate, up = h @ w[p + "ffn_gate_shexp.weight"].T, h @ w[p + "ffn_up_shexp.weight"].T
        shared = (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down_shexp.weight"].T
        if p + "ffn_gate_inp_shexp.weight" in w:  # qwen35moe: the shared expert's output times its sigmoid gate
            shared = shared / (1 + np.exp(-(h @ w[p + "ffn_gate_inp_shexp.weight"].reshape(-1))))[:, None]
        out += shared
    return out


def _oai_moe(w, p, hp: Hparams, h):
    """gpt-oss (llama.cpp's SOFTMAX_WEIGHT gating, SWIGLU_OAI): the top experts by biased router
    logit, weighted by a softmax over those logits; gate clamped above at 7, up to [-7, 7]."""
    logits = h @ w[p + "ffn_gate_inp.weight"].T + w[p + "ffn_gate_inp.bias"]
    out = np.zeros_like(h)
    for t in range(len(h)):
        chosen = np.argsort(-logits[t])[: hp.experts_used]
        weights = np.exp(logits[t, chosen] - logits[t, chosen].max())
        for e, weight in zip(chosen, weights / weights.sum()):
            gate = np.minimum(w[p + "ffn_gate_exps.weight"][e] @ h[t] + w[p + "ffn_gate_exps.bias"][e], 7.0)
            up = np.clip(w[p + "ffn_up_exps.weight"][e] @ h[t] + w[p + "ffn_up_exps.bias"][e], -7.0, 7.0)
            act = gate / (1 + np.exp(-1.702 * gate)) * (up + 1)
            out[t] += weight * (w[p + "ffn_down_exps.weight"][e] @ act + w[p + "ffn_down_exps.bias"][e])
    return out


def _norm(w, name: str, hp: Hparams, x):
    """llama.cpp's LLM_NORM (LayerNorm: starcoder2 with a bias, cohere2 without) or LLM_NORM_RMS (the others)."""
    if hp.arch not in ("starcoder2", "cohere2", "command-r", "nemotron", "stablelm"):
        return _rms(x, w[name + ".weight"], hp.eps)
    return _layer_norm(x, w[name + ".weight"], hp.eps) + w.get(name + ".bias", 0.0)


def _layer_norm(x, weight, eps):
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt(np.mean(centred * centred, axis=-1, keepdims=True) + eps) * weight


def _rms(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _rope(x, hp: Hparams, base: float, scale: float):
    """x (T, heads, head_dim): rotate the first n_rot dims by pos * base^(-2i/n_rot) / factor_i / scale."""
    n_rot = hp.rope_dims or hp.head_dim
    theta = base ** (-np.arange(0, n_rot, 2) / n_rot)
    if hp.freq_factors is not None:
        theta = theta / hp.freq_factors
    mscale = hp.attn_factor
    if hp.yarn is not None:  # llama.cpp's rope_yarn with ext_factor 1: interpolate the slow dims
        factor, context = hp.yarn
        corr = lambda beta: n_rot * np.log(context / (beta * 2 * np.pi)) / (2 * np.log(base))  # noqa: E731
        low, high = max(0.0, np.floor(corr(32.0))), min(n_rot - 1.0, np.ceil(corr(1.0)))
        ramp = 1 - np.clip((np.arange(n_rot // 2) - low) / max(0.001, high - low), 0, 1)
        theta = theta / factor * (1 - ramp) + theta * ramp
        mscale *= 1 + 0.1 * np.log(factor) if hp.yarn_magnitude else 1.0
    angles = np.arange(len(x))[:, None] * theta[None, :] / scale  # (T, n_rot/2)
    cos, sin = mscale * np.cos(angles)[:, None, :], mscale * np.sin(angles)[:, None, :]
    out = x.copy()
    if hp.arch in NEOX_ARCHS:  # pairs (i, i + n_rot/2)
        a, b = x[..., : n_rot // 2], x[..., n_rot // 2 : n_rot]
        out[..., : n_rot // 2], out[..., n_rot // 2 : n_rot] = a * cos - b * sin, a * sin + b * cos
    else:  # pairs (2i, 2i + 1)
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2], out[..., 1:n_rot:2] = a * cos - b * sin, a * sin + b * cos
    return out
