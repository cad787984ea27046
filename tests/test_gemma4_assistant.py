"""Gemma 4's assistant drafter (heads/gemma4_assistant.py, drafters/assistant.py) on a tiny random Gemma 4:
the keys and values it reads are the target's (all of the last full-attention layer's, the window of the
last sliding one's, in time order), its first draft is the assistant's graph at the last cached position,
and speculation with it, greedy or sampled, keeps the target's output. A random assistant: acceptance is
not the point."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache

from model_factory import make_gemma4_dir
from mlxspec.cache import exact_windows
from mlxspec.drafters import AssistantDrafter
from mlxspec.engine import Engine
from mlxspec.errors import MlxspecError
from mlxspec.features import decoder_body
from mlxspec.heads.gemma4_assistant import Gemma4Assistant
from mlxspec.options import GenerateOptions
from mlxspec.sampling import Sampling
from speculation_checks import assert_drafts_keep_plain_tokens

PROMPTS = ["the world and the world and the world and the world and the", "Once upon a time"]
WINDOW = 16  # make_gemma4_dir's sliding window: the first prompt is longer


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_gemma4_dir(tmp_path_factory.mktemp("gemma4"), layers=8)


def write_assistant(path, target_dir, seed: int = 3, ordered: bool = False, **extra):
    """A random 2-layer assistant (a sliding and a full-attention layer) for the tiny Gemma 4 at target_dir;
    `ordered`: an E2B / E4B one's head (8 clusters of tokens, the top 2 scored)."""
    from mlx_lm.models import gemma4_text

    vocab = json.loads((target_dir / "config.json").read_text())["vocab_size"]
    text = {"model_type": "gemma4_text", "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
            "num_attention_heads": 4, "head_dim": 16, "global_head_dim": 32, "num_key_value_heads": 2,
            "hidden_size_per_layer_input": 0, "sliding_window": WINDOW, "vocab_size": vocab,
            "layer_types": ["sliding_attention", "full_attention"], "num_kv_shared_layers": 2}
    config = {"model_type": "gemma4_assistant", "backbone_hidden_size": 64, "tie_word_embeddings": True,
              "use_ordered_embeddings": ordered, "num_centroids": 8, "centroid_intermediate_top_k": 2,
              "text_config": text, **extra}
    head = Gemma4Assistant(gemma4_text.ModelArgs.from_dict(text), 64, True, (8, 2) if ordered else None)
    mx.random.seed(seed)
    weights = {k: mx.random.normal(v.shape) * 0.6 / v.shape[-1] ** 0.25 for k, v in tree_flatten(head.parameters())}
    if ordered:  # each cluster's tokens, a block of them: a shuffle of the vocabulary, stored as int64
        weights["masked_embedding.token_ordering"] = mx.random.permutation(vocab).astype(mx.int64)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    return path


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("ordered", [False, True], ids=["tied-head", "clustered-head"])
def test_it_reads_the_targets_keys_and_values_and_hidden_state(target, tmp_path, ordered, compiled, monkeypatch):
    """Its draft law is the assistant's by hand over exactly the keys it reads; compiled draft steps read
    the target's whole buffers with the keys that count and the window as a mask, to the same law."""
    monkeypatch.setenv("MLXSPEC_COMPILE", "1" if compiled else "0")
    engine = Engine.load(str(target), drafter=f"mtp:{write_assistant(tmp_path / 'a', target, ordered=ordered)}")
    drafter, model = engine.drafter, engine.target.model
    assert isinstance(drafter, AssistantDrafter) and drafter.name == "mtp"
    assert (drafter._compiled is not None) == compiled
    ids = engine.tokenizer.encode(PROMPTS[0])
    assert len(ids) > WINDOW + 2
    first = [t for e in engine.generate(PROMPTS[0], GenerateOptions(max_tokens=1, temperature=0)) for t in e.tokens]
    cache, context = engine.kv.cache, ids + first  # the cache holds the prompt: every context token but the last
    plain = [KVCache() for _ in cache]  # every position kept: the reference
    hidden = decoder_body(model)(mx.array([ids]), cache=plain)[0]  # (L, Dt)
    for kind, i in drafter.sources.items():
        keys, values = drafter._keys_values(kind, cache[i])
        keep = slice(None) if kind == "full_attention" else slice(len(ids) - WINDOW, len(ids))
        assert mx.allclose(keys, plain[i].keys[..., : len(ids), :][..., keep, :], atol=1e-5).item()  # these rows,
        assert mx.allclose(values, plain[i].values[..., : len(ids), :][..., keep, :], atol=1e-5).item()  # in order
    drafter.bind_cache(cache)
    drafter.start(context, hidden)
    sampling = Sampling.from_options(GenerateOptions(temperature=1.0))
    q = drafter.propose(context, 1, sampling, mx.random.key(0)).probs[0]  # its first draft's law: softmax(logits)
    ref = {kind: (plain[i].keys[..., : len(ids), :], plain[i].values[..., : len(ids), :])
           for kind, i in drafter.sources.items()}
    ref["sliding_attention"] = tuple(a[..., -WINDOW:, :] for a in ref["sliding_attention"])
    embed = model.language_model.model.embed_tokens(mx.array([context[-1]]))[None]

    def law(position, scale):
        """Gemma 4's assistant by hand (mlx-lm's layers, the reference keys and values)."""
        head = drafter.head
        h = head.pre_projection(mx.concatenate([embed * scale, hidden[-1][None, None]], -1))
        for layer in head.model.layers:
            h, _, _ = layer(h, None, None, shared_kv=ref[layer.layer_type], offset=mx.array(position))
        y = head.model.norm(h)[0, 0]
        logits = head.model.embed_tokens.as_linear(y)
        if ordered:  # only the 2 best clusters' tokens scored; the rest: their least score less one
            m = head.masked_embedding
            best = mx.argsort(-m.centroids(y))[:2]
            chosen = m.token_ordering.reshape(8, -1)[best].reshape(-1)
            logits = mx.full(logits.shape, logits[chosen].min() - 1).at[chosen].add(logits[chosen] - logits[chosen].min() + 1)
        return mx.softmax(logits.astype(mx.float32))

    gap = lambda p: mx.abs(mx.log(q) - mx.log(p)).max().item()  # noqa: E731  log-probabilities: logits less a constant
    assert gap(law(len(ids) - 1, 64**0.5)) < 1e-5  # queries at the last cached position (measured 1e-6: rounding)
    assert gap(law(len(ids), 64**0.5)) > 1e-3  # ... not at the new token's (4e-3: one rope step on a random model)
    assert gap(law(len(ids) - 1, 1.0)) > 1e-3  # the embedding scaled as the target's (1.2)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("ordered", [False, True], ids=["tied-head", "clustered-head"])
def test_greedy_speculation_with_the_assistant_is_plain_decoding(target, tmp_path, ordered, compiled, monkeypatch):
    monkeypatch.setenv("MLXSPEC_COMPILE", "1" if compiled else "0")
    folder = write_assistant(tmp_path / "a", target, ordered=ordered)
    plain, drafted = Engine.load(str(target)), Engine.load(str(target), drafter=f"mtp:{folder}", min_confidence=0.0)
    assert_drafts_keep_plain_tokens(plain, drafted, PROMPTS, 24)


def test_unsure_drafts_end_the_chain(target, tmp_path):
    """llama.cpp's p-min for MTP drafters (0.75 by default, as for Qwen's block): 1.0 stops every chain after its
    first draft, 0 never does; the tokens stay plain decoding's either way."""
    folder = write_assistant(tmp_path / "a", target)
    assert Engine.load(str(target), drafter=f"mtp:{folder}").drafter.min_confidence == 0.75
    plain = Engine.load(str(target))
    want = [t for e in plain.generate(PROMPTS[0], GenerateOptions(max_tokens=20, temperature=0)) for t in e.tokens]
    for confidence, deeper in ((1.0, False), (0.0, True)):
        engine = Engine.load(str(target), drafter=f"mtp:{folder}", min_confidence=confidence)
        events = list(engine.generate(PROMPTS[0], GenerateOptions(max_tokens=20, temperature=0, draft_length=3,
                                                                  adaptive=False)))
        assert [t for e in events for t in e.tokens] == want
        stats = events[-1].stats
        assert stats.drafted_per_position[0] > 0 and (sum(stats.drafted_per_position[1:]) > 0) == deeper
        assert (engine.drafter.syncs > 0) == (confidence > 0)


def test_sampling_with_the_assistant_keeps_the_target_law(tmp_path):
    """4 tokens: the law of every 3-token continuation is known (test_decode_sampling.fit)."""
    from model_factory import build_model
    from test_decode_sampling import fit

    text = {"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
            "num_attention_heads": 4, "head_dim": 16, "global_head_dim": 32, "num_key_value_heads": 2,
            "num_kv_shared_layers": 1, "hidden_size_per_layer_input": 0, "sliding_window": WINDOW,
            "sliding_window_pattern": 2, "max_position_embeddings": 256}
    model = build_model({"model_type": "gemma4", "text_config": text, "vocab_size": 4}, seed=2, scale=0.8)
    exact_windows(model)  # as loading does: sliding layers' caches that rewind exactly (and read in time order)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps({"vocab_size": 4}))
    drafter = AssistantDrafter(model, write_assistant(tmp_path / "a", tmp_path / "t"))
    pvalue, acceptance = fit(model, drafter, {"temperature": 1.0}, k=2, n=700)
    assert pvalue > 1e-3 and acceptance > 0.1


def test_what_it_cannot_run_is_refused_by_name(target, tmp_path, tiny_llama):
    odd = write_assistant(tmp_path / "odd", target, ordered=True, num_centroids=7)
    with pytest.raises(MlxspecError, match="do not split into 7 equal clusters"):
        Engine.load(str(target), drafter=f"mtp:{odd}")
    with pytest.raises(MlxspecError, match="drafts for a Gemma 4 model, not llama"):
        Engine.load(str(tiny_llama), drafter=f"mtp:{write_assistant(tmp_path / 'a', target)}")
    wide = write_assistant(tmp_path / "w", target, backbone_hidden_size=96)
    with pytest.raises(MlxspecError, match="assistant of another model: 96 wide"):
        Engine.load(str(target), drafter=f"mtp:{wide}")
