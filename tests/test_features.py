"""Target features for learned drafters: target_forward equals the model's own forward bit for bit,
and a drafter that wants hidden states hears those of every position, in order, once."""

from __future__ import annotations

import mlx.core as mx
import pytest
from test_decode_greedy import run

from mlxspec import loading, step_graph
from mlxspec.adaptive import CostModel
from mlxspec.cache import new_cache
from mlxspec.drafters import ModelDrafter
from mlxspec.engine import Engine
from mlxspec.features import target_forward, vocabulary_size


@pytest.fixture(params=["llama", "qwen2", "llama-q4"])
def model(request, tiny_llama, tiny_qwen2):
    path = tiny_qwen2 if request.param == "qwen2" else tiny_llama
    if request.param == "llama-q4":  # quantized layers, the verify kernels swapped in where they pass
        return Engine.load(str(path), quantize="q4g32").target.model
    return loading.load(str(path)).model


def test_target_forward_is_the_models_forward_bit_for_bit(model):
    ids = mx.array([[5, 17, 42, 7, 99, 3]], dtype=mx.uint32)
    assert mx.array_equal(target_forward(model, ids)[0], model(ids))
    ours, theirs = new_cache(model), new_cache(model)  # with a cache: prefill, then a 3-row verify pass
    target_forward(model, ids, ours)
    model(ids, cache=theirs)
    step = mx.array([[8, 9, 10]], dtype=mx.uint32)
    logits, hidden = target_forward(model, step, ours)
    assert mx.array_equal(logits, model(step, cache=theirs))
    assert hidden.shape == (1, 3, model.args.hidden_size)


GRANITE = {"model_type": "granite", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
           "num_attention_heads": 4, "rms_norm_eps": 1e-5, "vocab_size": 96, "logits_scaling": 4.0,
           "attention_multiplier": 0.125, "embedding_multiplier": 2.0, "residual_multiplier": 0.5,
           "max_position_embeddings": 256, "num_key_value_heads": 2, "attention_bias": False, "mlp_bias": False,
           "rope_theta": 10000.0}


@pytest.mark.parametrize("arch", ["gemma4", "granite"])
def test_what_follows_the_head_is_kept(arch, tmp_path):
    """Gemma 4 softcaps its logits, Granite divides them by logits_scaling: a learned drafter's verify pass must
    still give plain decoding's logits (greedy ties, sampling laws), with the final norm's output as features."""
    from model_factory import build_model, make_gemma4_dir

    from mlxspec.features import decoder_body, head

    model = loading.load(str(make_gemma4_dir(tmp_path))).model if arch == "gemma4" else build_model(GRANITE, seed=2)
    ids = mx.array([[5, 17, 42, 7, 9, 3]], dtype=mx.uint32)
    logits, hidden = target_forward(model, ids)
    assert mx.array_equal(logits, model(ids)).item()
    assert mx.array_equal(hidden, decoder_body(model)(ids)).item()
    assert not mx.allclose(head(model)(hidden), logits, atol=1e-3).item()  # the head alone is not the model's logits


def test_vocabulary_size_is_the_embedding_tables_rows(model):
    assert vocabulary_size(model) == model.args.vocab_size


class HiddenRecorder(ModelDrafter):
    """A model drafter that also asks for the target's features and keeps what it hears."""

    wants_hidden = True

    def start(self, prompt, hidden=None):
        super().start(prompt, hidden)
        self.heard = []  # (n, hidden rows) per accept

    def accept(self, n, hidden=None):
        assert hidden is not None and hidden.shape[0] == n + 1
        self.heard.append((n, hidden))
        super().accept(n)


def full_hidden(model, ids: list[int]) -> mx.array:
    return target_forward(model, mx.array(ids, dtype=mx.uint32)[None])[1][0]


@pytest.mark.parametrize("adaptive", [False, True], ids=["chain-rounds", "with-plain-rounds"])
def test_a_drafter_that_wants_hidden_states_hears_every_position(tiny_llama, adaptive):
    plain = Engine.load(str(tiny_llama))
    spec = Engine.load(str(tiny_llama), draft=str(tiny_llama), draft_quantize="q4g32")
    recorder = spec.drafter = HiddenRecorder(spec.drafter.model)
    if adaptive:  # plain looks cheap, drafting dear: the controller backs off to (pipelined) plain rounds
        spec.costs = CostModel()
        spec.costs.add(0, 1e-4)
        for k in (1, 4):
            spec.costs.add(k, 1.0)
    prompt = spec.encode("Once upon a time")
    tokens, _, last = run(spec, prompt, max_tokens=24, draft_length=4, adaptive=adaptive)
    assert tokens == run(plain, prompt, max_tokens=24)[0]  # asking for features changes no token
    s = last.stats
    assert len(recorder.heard) == s.rounds  # one accept per round, plain rounds included
    drafting_rounds = s.drafted_per_position[0] if s.drafted_per_position else 0
    assert drafting_rounds < s.rounds if adaptive else drafting_rounds == s.rounds
    heard = mx.concatenate([h for _, h in recorder.heard])  # rows of positions len(prompt)-1, len(prompt), ...
    rows = min(heard.shape[0], len(tokens))
    expected = full_hidden(spec.target.model, prompt + tokens)[len(prompt) - 1 : len(prompt) - 1 + rows]
    assert rows >= len(tokens) - 4
    assert mx.allclose(heard[:rows], expected, atol=1e-4).item()


def test_hidden_states_are_computed_only_for_a_drafter_that_wants_them(tiny_llama, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("target_forward called for a drafter that does not want hidden states")

    monkeypatch.setattr(step_graph, "target_forward", refuse)  # where decoding passes call it
    spec = Engine.load(str(tiny_llama), draft=str(tiny_llama), draft_quantize="q4g32")
    tokens, _, last = run(spec, "Once upon a time", max_tokens=12, draft_length=3, adaptive=False)
    assert len(tokens) == 12 and last.stats.drafted > 0
