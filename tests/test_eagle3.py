"""EAGLE-3 heads as published (heads/eagle3.py): the target's tapped layer inputs, the head's graph against a
numpy forward of EAGLE's own (eagle/model/cnets.py), both file conventions, greedy and sampled speculation
exact, and heads that do not fit refused by name. The heads here are random: acceptance is not the point."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

from model_factory import build_model, make_gemma4_dir, make_model_dir
from mlxspec.drafters import Eagle3Drafter
from mlxspec.engine import Engine
from mlxspec.errors import MlxspecError
from mlxspec.features import tap, tapped, target_forward
from mlxspec.loading import load
from speculation_checks import assert_drafts_keep_plain_tokens

PROMPTS = ["the world and the world and the world and the", "Once upon a time"]
TOKENS = [5, 77, 271, 12, 9, 150, 44, 260]
LAYERS = 8  # EAGLE's layers for 8: the inputs of 2, 4 and 5


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("llama8"), "llama", layers=LAYERS, seed=2)


def write_head(path, dims: int, vocab: int, draft_vocab: int | None = None, width: int | None = None,
               convention: str = "eagle", seed: int = 0, layer_ids=None, extra: dict | None = None):
    """A random one-layer EAGLE-3 head for a `dims`-wide, `vocab`-token target, as EAGLE's repository writes
    one (midlayer.*, a llama config) or as the speculators library does (layers.0.*, transformer_layer_config)."""
    width = width or dims
    draft_vocab = draft_vocab or vocab
    heads, kv_heads, head_dim, inner = 4, 2, width // 4, 2 * width
    keys = iter(mx.random.split(mx.random.key(seed), 24))
    rand = lambda *shape: mx.random.normal(shape, key=next(keys)) * 0.6 / shape[-1] ** 0.25  # noqa: E731
    ones = lambda n: 1.0 + 0.1 * mx.random.normal((n,), key=next(keys))  # noqa: E731
    layer = "midlayer." if convention == "eagle" else "layers.0."
    t = {"fc.weight": rand(width, 3 * dims), "norm.weight": ones(width), "lm_head.weight": rand(draft_vocab, width),
         layer + "input_layernorm.weight": ones(width), layer + "hidden_norm.weight": ones(width),
         layer + "post_attention_layernorm.weight": ones(width),
         layer + "self_attn.q_proj.weight": rand(heads * head_dim, 2 * width),
         layer + "self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * width),
         layer + "self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * width),
         layer + "self_attn.o_proj.weight": rand(width, heads * head_dim),
         layer + "mlp.gate_proj.weight": rand(inner, width), layer + "mlp.up_proj.weight": rand(inner, width),
         layer + "mlp.down_proj.weight": rand(width, inner), "t2d": mx.zeros((vocab,), mx.bool_)}
    if convention != "eagle":  # its training copy of the target's output norm, kept in some files
        t["verifier_norm.weight"] = ones(width)
    if convention == "speculators-qwen3":  # newer speculators heads for Qwen3: Qwen3's per-head q/k norms
        t[layer + "self_attn.q_norm.weight"], t[layer + "self_attn.k_norm.weight"] = ones(head_dim), ones(head_dim)
    if draft_vocab != vocab:  # draft token i is i + d2t[i]: every other token of the first 2 V'
        t["d2t"] = mx.arange(draft_vocab, dtype=mx.int64) * (1 if 2 * draft_vocab <= vocab else 0)
    if width != dims:
        t["embed_tokens.weight"] = rand(vocab, width)
    block = {"hidden_size": width, "intermediate_size": inner, "num_attention_heads": heads,
             "num_key_value_heads": kv_heads, "rms_norm_eps": 1e-5, "vocab_size": vocab, "rope_theta": 10000.0,
             "max_position_embeddings": 1024}
    if convention == "eagle":
        config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **block,
                  "draft_vocab_size": draft_vocab}
    else:
        kind = "qwen3" if convention == "speculators-qwen3" else "llama"
        config = {"speculators_model_type": "eagle3", "transformer_layer_config": {"model_type": kind, **block},
                  "draft_vocab_size": draft_vocab, "norm_before_residual": True}
    if layer_ids is not None:
        config["eagle_aux_hidden_state_layer_ids"] = list(layer_ids)
    config.update(extra or {})
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(path / "model.safetensors"), t)
    return path


def layer_inputs(model, x, layers):
    """The inputs of `layers` by running the decoder's layers one by one (no taps)."""
    h, seen = model.model.embed_tokens(x), {}
    for i, layer in enumerate(model.layers):
        seen[i] = h
        h = layer(h, "causal", None)
    return mx.concatenate([seen[i] for i in layers], axis=-1)


def test_taps_give_the_inputs_of_the_layers_and_leave_logits_alone(target_dir):
    model = load(str(target_dir)).model
    x = mx.array([TOKENS])
    want_logits, want = model(x), layer_inputs(model, x, (2, 4, 5))
    tap(model, (2, 4, 5))
    logits, got = target_forward(model, x, None, (2, 4, 5))
    assert mx.array_equal(logits, want_logits).item() and mx.array_equal(got, want).item()
    assert got.shape == (1, len(TOKENS), 3 * 64)
    with pytest.raises(RuntimeError, match="has not run since it was read"):  # read once: never a stale pass
        tapped(model, (2, 4, 5))


def rms(x, w, eps=1e-5):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def neox(x, base=10000.0):
    """(T, heads, d): llama's rope as mlx-lm runs it (non-traditional: pairs (i, i + d/2)), positions 0..T-1."""
    d = x.shape[-1]
    theta = base ** (-np.arange(0, d, 2) / d)
    angles = np.arange(len(x))[:, None, None] * theta[None, None, :]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * np.cos(angles) - b * np.sin(angles), a * np.sin(angles) + b * np.cos(angles)], -1)


def reference_logits(w, embeds, features, swap=False, heads=4, kv_heads=2, p="midlayer.", norm_before_residual=False):
    """EAGLE's cnets.py: fc, then LlamaDecoderLayeremb (hidden_norm / input_layernorm, cat(emb, hidden),
    attention, residual from the un-normed hidden), then lm_head(norm(.)). Qwen3's attention where the
    head has q/k norms (speculators)."""
    w = {k: np.array(v.astype(mx.float32), dtype=np.float64) for k, v in w.items()}
    g = features @ w["fc.weight"].T
    e, hn = rms(embeds, w[p + "input_layernorm.weight"]), rms(g, w[p + "hidden_norm.weight"])
    x = np.concatenate([hn, e] if swap else [e, hn], -1)
    T = len(x)
    q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(T, heads, -1)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(T, kv_heads, -1)
    if p + "self_attn.q_norm.weight" in w:
        q, k = rms(q, w[p + "self_attn.q_norm.weight"], 1e-5), rms(k, w[p + "self_attn.k_norm.weight"], 1e-5)
    q, k = neox(q), neox(k)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(T, kv_heads, -1)
    k, v = np.repeat(k, heads // kv_heads, 1), np.repeat(v, heads // kv_heads, 1)
    scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(q.shape[-1])
    scores = np.where(np.tril(np.ones((T, T)))[None] > 0, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    h = (hn if norm_before_residual else g) + np.einsum("hts,shd->thd", probs, v).reshape(T, -1) @ w[p + "self_attn.o_proj.weight"].T
    m = rms(h, w[p + "post_attention_layernorm.weight"])
    gate, up = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
    h = h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms(h, w["norm.weight"]) @ w["lm_head.weight"].T


@pytest.mark.parametrize("convention", ["eagle", "speculators-qwen3"])
def test_the_head_is_eagle3s_graph(target_dir, tmp_path, convention):
    model = load(str(target_dir)).model
    vocab = model.model.embed_tokens.weight.shape[0]
    folder = write_head(tmp_path / "h", 64, vocab, draft_vocab=vocab // 2, convention=convention)
    p = "midlayer." if convention == "eagle" else "layers.0."
    drafter = Eagle3Drafter(model, folder, bits=None)
    assert drafter.feature_layers == (2, 4, 5)
    x = mx.array([TOKENS])
    features = target_forward(model, x, None, drafter.feature_layers)[1][0, :-1]  # positions t-1
    embeds = model.model.embed_tokens(mx.array(TOKENS[1:]))
    got = np.array(drafter.draft_head(drafter.head(embeds[None], features[None], None, "causal"))[0])
    w = mx.load(str(folder / "model.safetensors"))
    e64, f64, before = np.array(embeds, dtype=np.float64), np.array(features, dtype=np.float64), convention != "eagle"
    want = reference_logits(w, e64, f64, p=p, norm_before_residual=before)
    np.testing.assert_allclose(got, want, atol=1e-4 * np.abs(want).max(), rtol=0)
    swapped = reference_logits(w, e64, f64, swap=True, p=p, norm_before_residual=before)
    assert np.abs(got - swapped).max() > 0.05 * np.abs(want).max()  # the concat order matters
    assert drafter.vocab.tolist() == [2 * i for i in range(vocab // 2)]  # draft token i is i + d2t[i]


@pytest.mark.parametrize("convention", ["eagle", "speculators", "speculators-qwen3"])
def test_greedy_speculation_with_a_head_is_plain_decoding(target_dir, tmp_path, convention):
    vocab = load(str(target_dir)).model.model.embed_tokens.weight.shape[0]
    width, ids = (64, None) if convention == "eagle" else (32, [1, 3, 6])  # a narrower head: its own embedding
    folder = write_head(tmp_path / convention, 64, vocab, draft_vocab=vocab // 2, width=width,
                        convention=convention, layer_ids=ids)
    plain = Engine.load(str(target_dir))
    drafted = Engine.load(str(target_dir), drafter=f"eagle3:{folder}")
    assert drafted.drafter.name == "eagle3" and drafted.drafter.feature_layers == tuple(ids or (2, 4, 5))
    assert_drafts_keep_plain_tokens(plain, drafted, PROMPTS, 20)
    from mlxspec.options import GenerateOptions

    options = dict(max_tokens=16, temperature=0)
    want = [t for e in plain.generate(PROMPTS[0], GenerateOptions(**options)) for t in e.tokens]
    tree = list(drafted.generate(PROMPTS[0], GenerateOptions(draft_length=3, draft_width=2, adaptive=False, **options)))
    assert [t for e in tree for t in e.tokens] == want and tree[-1].stats.drafted > 0  # a tree of drafts too


def test_sampling_with_a_head_keeps_the_target_law(tmp_path):
    """4 tokens, 3 of them draftable (d2t: 0, 1, 2 -> 0, 2, 3): the law of 3-token continuations holds."""
    from test_decode_sampling import CONFIG, fit

    target = build_model({**CONFIG, "num_hidden_layers": LAYERS}, seed=3, scale=0.8)
    folder = write_head(tmp_path / "h", 32, 4, draft_vocab=3, seed=4)
    tensors = mx.load(str(folder / "model.safetensors"))
    tensors["d2t"] = mx.array([0, 1, 1], dtype=mx.int64)
    mx.save_safetensors(str(folder / "model.safetensors"), tensors)
    drafter = Eagle3Drafter(target, folder)
    assert drafter.vocab.tolist() == [0, 2, 3]
    pvalue, acceptance = fit(target, drafter, {"temperature": 1.0}, k=2, n=700)
    assert pvalue > 1e-3 and acceptance > 0.1  # drafts were really in play


@pytest.mark.parametrize("change, match", [
    (lambda t, c: t.update({"fc.weight": mx.zeros((64, 3 * 48))}), "for another model: its fc takes 144 features"),
    (lambda t, c: t.update({"d2t": mx.full((8,), 10_000, mx.int64)}), "d2t has 8 entries"),
    (lambda t, c: t.update({"d2t": mx.zeros((t["lm_head.weight"].shape[0],), mx.int64) + 10_000}), "maps outside"),
    (lambda t, c: t.update({"layers.1.mlp.up_proj.weight": mx.zeros((4, 4))}), "more than one layer"),
    (lambda t, c: t.update({"medusa_head.weight": mx.zeros((4, 4))}), "not one of an EAGLE-3 head"),
    (lambda t, c: c.pop("hidden_size"), "lacks its layer's shape"),
    (lambda t, c: c.update({"eagle_aux_hidden_state_layer_ids": [1, 2, 3, 4]}), "its config names 4"),
])
def test_heads_that_do_not_fit_are_refused_by_name(target_dir, tmp_path, change, match):
    model = load(str(target_dir)).model
    vocab = model.model.embed_tokens.weight.shape[0]
    folder = write_head(tmp_path / "h", 64, vocab, draft_vocab=vocab // 2)
    tensors, config = mx.load(str(folder / "model.safetensors")), json.loads((folder / "config.json").read_text())
    change(tensors, config)
    mx.save_safetensors(str(folder / "model.safetensors"), tensors)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(MlxspecError, match=match):
        Eagle3Drafter(model, folder)


def test_pickles_and_shallow_models_are_refused(target_dir, tmp_path):
    model = load(str(target_dir)).model
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(MlxspecError, match="PyTorch pickles are not read"):
        Eagle3Drafter(model, folder)
    shallow = load(str(make_model_dir(tmp_path / "l4", "llama", layers=4))).model
    head = write_head(tmp_path / "h", 64, shallow.model.embed_tokens.weight.shape[0])
    with pytest.raises(MlxspecError, match="three distinct layers"):
        Eagle3Drafter(shallow, head)
    with pytest.raises(MlxspecError, match="needs its head"):
        Engine.load(str(target_dir), drafter="eagle3")


def test_a_gemma4_target_feeds_its_head_too(tmp_path):
    """Gemma 4 (layers returning (h, kv, offset), sliding windows, shared KV, softcapped logits): the taps
    read its layers' outputs, the verify logits are the model's own; greedy speculation is plain decoding."""
    target = make_gemma4_dir(tmp_path / "gemma4", layers=LAYERS)
    model = load(str(target)).model
    vocab = int(model.args.vocab_size)
    x = mx.array([TOKENS])
    tap(model, (2, 4, 5))
    logits, features = target_forward(model, x, None, (2, 4, 5))
    assert mx.array_equal(logits, model(x)).item() and features.shape == (1, len(TOKENS), 3 * 64)
    folder = write_head(tmp_path / "head", 64, vocab, draft_vocab=vocab // 2, convention="speculators")
    plain, drafted = Engine.load(str(target)), Engine.load(str(target), drafter=f"eagle3:{folder}")
    assert_drafts_keep_plain_tokens(plain, drafted, PROMPTS, 20)


def test_a_gpt_oss_gguf_with_a_normed_fc_head(tmp_path):
    """gpt-oss (a GGUF: sinks, sliding windows, MXFP4-free experts here) with a head that norms its three
    features before fc (speculators' norm_before_fc, as gpt-oss heads have it): greedy is plain decoding."""
    from gguf_fixtures import Dims, write_tiny_llama_gguf

    path = write_tiny_llama_gguf(tmp_path / "oss.gguf", "Q8_0", arch="gpt-oss", output_qtype="Q8_0",
                                 dims=Dims(layers=LAYERS, head_dim=32, experts=8, experts_used=3),
                                 metadata={"attention.sliding_window": 4})
    plain = Engine.load(str(path))
    model = plain.target.model
    vocab, dims = model.model.embed_tokens.weight.shape[0], model.args.hidden_size
    folder = write_head(tmp_path / "h", dims, vocab, draft_vocab=vocab // 2, convention="speculators",
                        extra={"norm_before_fc": True})
    tensors = mx.load(str(folder / "model.safetensors"))
    tensors["input_norm.weight"] = 1.0 + 0.1 * mx.random.normal((3 * dims,), key=mx.random.key(9))
    mx.save_safetensors(str(folder / "model.safetensors"), tensors)
    drafted = Engine.load(str(path), drafter=f"eagle3:{folder}")
    assert "input_norm" in drafted.drafter.head
    assert_drafts_keep_plain_tokens(plain, drafted, PROMPTS, 20)
