"""The engine API: lazy rounds (one sync each), cancellation, loading once, refusing bad drafts."""

from __future__ import annotations

import threading

import mlx.core as mx
import pytest
from model_factory import make_model_dir
from test_decode_greedy import run

from mlxspec import loading
from mlxspec.engine import Engine
from mlxspec.errors import IncompatibleDraftError, MlxspecError
from mlxspec.options import GenerateOptions


@pytest.fixture(scope="module")
def spec(tiny_llama):
    return Engine.load(str(tiny_llama), draft=str(tiny_llama), draft_quantize="q4g32", draft_length=4)


def test_one_host_sync_per_round_and_draft_steps_stay_lazy(spec, monkeypatch):
    """Count every mx.eval and mx.async_eval made while generating."""
    evals, async_evals = [], []
    real_eval, real_async = mx.eval, mx.async_eval
    monkeypatch.setattr(mx, "eval", lambda *a: (evals.append(1), real_eval(*a))[1])
    monkeypatch.setattr(mx, "async_eval", lambda *a: (async_evals.append(1), real_async(*a))[1])
    prompt = spec.encode("Once upon a time")
    tokens, _, last = run(spec, prompt, max_tokens=40, draft_length=4, adaptive=False)
    s = last.stats
    prefill_syncs = 2  # one prompt chunk each for the target and the draft model
    assert len(evals) == s.rounds + prefill_syncs
    assert s.host_syncs == s.rounds
    assert s.rounds < len(tokens)  # speculation really produced several tokens per sync
    assert len(async_evals) == s.drafted  # one queued (not awaited) draft step per drafted token


def test_closing_the_stream_early_leaves_the_engine_ready(spec):
    expected, _, _ = run(spec, "The quick brown fox", max_tokens=30)
    stream = spec.generate("Once upon a time", GenerateOptions(max_tokens=30))
    next(stream)
    next(stream)
    stream.close()  # the caller walks away mid-generation
    assert run(spec, "The quick brown fox", max_tokens=30)[0] == expected


def test_cancel_flag_stops_at_the_next_round(spec):
    cancel = threading.Event()
    events = []
    for ev in spec.generate("Once upon a time", GenerateOptions(max_tokens=200), cancel=cancel):
        events.append(ev)
        cancel.set()
    assert events[-1].done and events[-1].finish_reason == "cancelled"
    assert len(events) == 2  # the first round's tokens, then the final event
    assert run(spec, "Hello", max_tokens=5)[2].finish_reason == "length"


def test_weights_load_once_for_many_requests(tiny_llama, monkeypatch):
    calls = []
    real_load = loading.load
    monkeypatch.setattr(loading, "load", lambda *a, **k: (calls.append(a), real_load(*a, **k))[1])
    engine = Engine.load(str(tiny_llama), draft=str(tiny_llama))  # same reference: one copy
    assert len(calls) == 1 and engine.draft is engine.target
    model = engine.target.model
    for prompt in ("a", "b", "c"):
        run(engine, prompt, max_tokens=5)
    assert len(calls) == 1 and engine.target.model is model


def test_a_draft_with_another_tokenizer_is_refused(tiny_llama, tmp_path):
    other = make_model_dir(tmp_path / "other-vocab", "llama")
    # retrain the tokenizer with another size: same format, different vocabulary
    from model_factory import write_tokenizer

    write_tokenizer(other, vocab_size=300)
    with pytest.raises(IncompatibleDraftError, match="tokenizer differs"):
        Engine.load(str(tiny_llama), draft=str(other))


def test_lookup_drafter_greedy_is_exact(tiny_llama):
    plain = Engine.load(str(tiny_llama))
    lookup = Engine.load(str(tiny_llama), drafter="lookup")
    # a prompt that repeats itself gives the n-gram drafter something to copy
    prompt = "The dog sleeps. The quick brown fox jumps over the lazy dog. The dog sleeps. The quick"
    for k in (1, 3, 6):
        tokens, _, last = run(lookup, prompt, max_tokens=40, draft_length=k, adaptive=False)
        assert tokens == run(plain, prompt, max_tokens=40)[0]
        assert last.stats.drafted > 0 and last.stats.drafter == "lookup"


def test_draft_length_zero_turns_speculation_off(spec):
    _, _, last = run(spec, "Once upon a time", max_tokens=10, draft_length=0)
    assert last.stats.drafted == 0 and last.stats.rounds == 10 and last.stats.drafter == "none"


def test_events_carry_text_tokens_and_draft_flags(spec):
    events = list(spec.generate("Once upon a time", GenerateOptions(max_tokens=24)))
    assert events[-1].done and not any(e.done for e in events[:-1])
    body = events[:-1]
    assert all(len(e.tokens) == len(e.from_draft) >= 1 for e in body)
    tokens = [t for e in body for t in e.tokens]
    text = "".join(e.text for e in events)
    detok = spec.tokenizer.detokenizer  # mlx-lm's streaming detokenizer over the whole output at once
    for t in tokens:
        detok.add_token(t)
    detok.finalize()
    assert text == detok.text and len(text) > 0
    assert sum(d for e in body for d in e.from_draft) == events[-1].stats.accepted


def test_chat_prompt_uses_the_models_template(spec):
    ids = spec.chat_prompt([{"role": "user", "content": "hi"}])
    assert spec.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_bad_requests_raise_clear_errors(spec, tiny_llama):
    with pytest.raises(ValueError, match="empty"):
        list(spec.generate([], GenerateOptions()))
    with pytest.raises(ValueError, match="context window"):
        list(spec.generate([1] * 50, GenerateOptions(num_ctx=20)))
    with pytest.raises(MlxspecError, match="unknown drafter"):
        Engine.load(str(tiny_llama), drafter="psychic")
    with pytest.raises(MlxspecError, match="draft"):
        Engine.load(str(tiny_llama), drafter="draft-model")


def test_num_ctx_ends_generation_with_length(spec):
    prompt = spec.encode("Once upon a time")
    tokens, _, last = run(spec, prompt, max_tokens=100, num_ctx=len(prompt) + 7)
    assert len(tokens) == 7 and last.finish_reason == "length"


def test_early_exit_self_draft_shares_weights_and_is_exact(tiny_llama):
    plain = Engine.load(str(tiny_llama))
    ee = Engine.load(str(tiny_llama), drafter="early-exit:1")
    view = ee.drafter.model
    assert len(view.layers) == 1 and view.model.embed_tokens is ee.target.model.model.embed_tokens
    assert view.layers[0] is ee.target.model.layers[0]  # a view, not a copy
    for prompt in ("Once upon a time", "def add(a, b):"):
        tokens, _, last = run(ee, prompt, max_tokens=30, draft_length=3, adaptive=False)
        assert tokens == run(plain, prompt, max_tokens=30)[0] and last.stats.drafted > 0
    with pytest.raises(MlxspecError, match="choose 1..1"):
        Engine.load(str(tiny_llama), drafter="early-exit:2")


def test_requantizing_a_quantized_model_to_fewer_bits(tiny_llama):
    """A 4-bit model asked for q2 (a harder self-draft) is dequantized, then quantized again."""
    import mlx.nn as nn

    m = loading.load(str(tiny_llama), "q4g32")
    loading.quantize_model(m.model, 2, 32)
    bits = {mod.bits for _, mod in m.model.named_modules() if isinstance(mod, nn.QuantizedLinear)}
    assert bits == {2}


def test_a_shared_prompt_prefix_is_reused_and_changes_nothing(tiny_llama):
    """Chat turns resend the history: the KV of the common prefix is kept, output is unchanged."""
    fresh = lambda: Engine.load(str(tiny_llama), draft=str(tiny_llama), draft_quantize="q4g32")  # noqa: E731
    engine = fresh()
    first = engine.encode("Once upon a time there was a little robot")
    tokens1, _, last1 = run(engine, first, max_tokens=12, adaptive=False)
    assert last1.stats.cached_tokens == 0
    follow_up = first + tokens1 + engine.encode(" who loved to count")
    held = engine.drafter.kv.tokens  # the draft model's cache is kept too, with the tokens it holds
    assert held is not None and len(held) >= len(first) and follow_up[: len(held)] == held
    tokens2, _, last2 = run(engine, follow_up, max_tokens=20, adaptive=False)
    assert last2.stats.cached_tokens >= len(first)
    assert tokens2 == run(fresh(), follow_up, max_tokens=20, adaptive=False)[0]
    # a different prompt shares nothing and still matches a fresh engine
    other = engine.encode("def add(a, b):")
    tokens3, _, last3 = run(engine, other, max_tokens=15, adaptive=False)
    assert tokens3 == run(fresh(), other, max_tokens=15, adaptive=False)[0]


def test_a_request_cut_off_mid_stream_does_not_poison_the_cache(spec):
    prompt = spec.encode("The quick brown fox jumps")
    expected = run(spec, prompt, max_tokens=25, adaptive=False)[0]
    stream = spec.generate(prompt, GenerateOptions(max_tokens=25, adaptive=False))
    next(stream)
    stream.close()
    assert run(spec, prompt, max_tokens=25, adaptive=False)[0] == expected
    assert run(spec, prompt + expected[:5], max_tokens=10, adaptive=False)[0] == expected[5:15]


def test_unsure_drafts_stop_early_and_output_stays_exact(tiny_llama, tiny_llama_other):
    plain = Engine.load(str(tiny_llama))
    sure = Engine.load(str(tiny_llama), draft=str(tiny_llama_other), draft_length=6)
    unsure = Engine.load(str(tiny_llama), draft=str(tiny_llama_other), draft_length=6, min_confidence=0.5)
    prompt = "Once upon a time"
    expected = run(plain, prompt, max_tokens=40)[0]
    full = run(sure, prompt, max_tokens=40, adaptive=False)
    cut = run(unsure, prompt, max_tokens=40, adaptive=False)
    assert full[0] == cut[0] == expected
    s_full, s_cut = full[2].stats, cut[2].stats
    assert s_cut.drafted / s_cut.rounds < s_full.drafted / s_full.rounds  # proposals were cut short
    assert s_cut.host_syncs > s_cut.rounds  # the confidence checks are counted as syncs
    for temperature in (0.0, 1.0):  # sampling path with early stops keeps the cache consistent
        again = run(unsure, prompt, max_tokens=30, adaptive=False, temperature=temperature, seed=3)
        assert len(again[0]) == 30


def test_a_draft_with_other_special_tokens_is_refused(tiny_llama, tmp_path):
    """Same vocabulary, but the draft ends its turns with another token: its EOS means other text."""
    import json
    import shutil

    other = tmp_path / "other-eos"
    shutil.copytree(tiny_llama, other)
    cfg = json.loads((other / "tokenizer_config.json").read_text())
    cfg["eos_token"] = "<|endoftext|>"
    (other / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleDraftError, match="eos_token_id"):
        Engine.load(str(tiny_llama), draft=str(other))


def test_seed_minus_one_means_random_and_others_are_checked():
    from mlxspec.options import OptionsError

    assert GenerateOptions.from_dict({"seed": -1}).seed is None
    for bad in (-2, 2**64, "7", 1.5):
        with pytest.raises(OptionsError, match="seed"):
            GenerateOptions.from_dict({"seed": bad})


def test_engine_uses_the_verify_kernels_by_default_where_they_pass(tiny_llama):
    engine = Engine.load(str(tiny_llama), quantize="q4g32")
    layers = engine.kernels["target"]["layers"]
    if not layers["swapped"]:
        pytest.skip(f"no kernel usable on this machine: {layers}")
    assert len(layers["swapped"]) == 15  # 7 linear layers x 2 blocks + the head
    assert Engine.load(str(tiny_llama), quantize="q4g32", kernels=False).kernels == {"disabled": "kernels off"}


def test_fused_acceptance_wiring_keeps_output_exact(spec, monkeypatch):
    """MLXSPEC_FUSED_ACCEPT=1 routes acceptance through the fused kernels (here: their CPU fallback)."""
    from mlxspec.settings import DecodeSettings

    expected = run(spec, "Once upon a time", max_tokens=30, adaptive=False)[0]
    monkeypatch.setattr(spec, "settings", DecodeSettings(fused_accept=True))
    tokens, _, last = run(spec, "Once upon a time", max_tokens=30, adaptive=False)
    assert tokens == expected and last.stats.accepted > 0
    sampled = run(spec, "Once upon a time", max_tokens=30, adaptive=False, temperature=1.0, seed=5)[0]
    assert len(sampled) == 30
