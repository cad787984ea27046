"""Structured output: the grammar masks every row the target scores, so speculation stays exact.

On the 4-token model of test_decode_sampling a small grammar ("never repeat the previous token")
has a computable law: sampled sequences with speculation must fit it (chi-square), greedy output
must equal plain decoding. With the real grammar engine (llguidance) on a tiny model with a real
tokenizer: JSON that follows the schema, identical with draft length 0 and 4.
"""

from __future__ import annotations

import itertools
import json

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare
from test_decode_sampling import LENGTH, PROMPT, V, models  # noqa: F401  (the fixture)

from mlxspec.constraints import FormatError, format_grammar
from mlxspec.decode import Decoder
from mlxspec.drafters import ModelDrafter, NoDrafter
from mlxspec.engine import Engine
from mlxspec.options import GenerateOptions
from mlxspec.sampling import Sampling, probabilities
from mlxspec.stats import Stats


class NoRepeat:
    """A grammar on the 4-token vocabulary: a token may not repeat the one before it."""

    def __init__(self, last: int):
        self.last = last

    def masks(self, drafts: list[int]) -> np.ndarray:
        rows = np.ones((len(drafts) + 1, V), dtype=bool)
        for i, prev in enumerate([self.last, *drafts]):
            rows[i, prev] = False
        return rows

    def commit(self, tokens: list[int]) -> None:
        self.last = tokens[-1] if tokens else self.last


def generate(target, drafter, options, k):
    dec = Decoder(target, drafter, PROMPT, options, draft_length=k, eos_ids=set(), context_length=64, stats=Stats(),
                  constraint=NoRepeat(PROMPT[-1]))
    return [t for r in dec for t in r.tokens]


def law(target, options) -> dict[tuple, float]:
    s = Sampling.from_options(options)
    out = {}
    for seq in itertools.product(range(V), repeat=LENGTH):
        rows = target(mx.array(PROMPT + list(seq[:-1]))[None])[0, len(PROMPT) - 1 :]
        allowed = mx.array(NoRepeat(PROMPT[-1]).masks(list(seq[:-1])))
        probs = np.array(probabilities(mx.where(allowed, rows, -float("inf")), s))
        out[seq] = float(np.prod([probs[i, t] for i, t in enumerate(seq)]))
    return out


@pytest.mark.parametrize("k", [0, 2])
def test_sampling_under_a_grammar_matches_the_masked_law(models, k):  # noqa: F811
    target, draft = models
    n, counts = 1200, {}
    drafter = ModelDrafter(draft) if k else NoDrafter()
    for seed in range(n):
        seq = tuple(generate(target, drafter, GenerateOptions(max_tokens=LENGTH, temperature=1.0, seed=seed), k))
        counts[seq] = counts.get(seq, 0) + 1
    exact = law(target, GenerateOptions(temperature=1.0))
    assert all(exact[s] > 0 for s in counts), "drew a sequence the grammar forbids"
    cells = [c for c in exact if exact[c] * n >= 5]
    obs = [counts.get(c, 0) for c in cells] + [n - sum(counts.get(c, 0) for c in cells)]
    exp = [exact[c] * n for c in cells] + [n - sum(exact[c] * n for c in cells)]
    exp = np.array(exp) * sum(obs) / sum(exp)
    assert chisquare(obs, exp).pvalue > 1e-3


def test_greedy_under_a_grammar_equals_plain(models):  # noqa: F811
    target, draft = models
    opts = GenerateOptions(max_tokens=16)
    plain = generate(target, NoDrafter(), opts, 0)
    assert plain == generate(target, ModelDrafter(draft), opts, 3)
    assert all(a != b for a, b in zip([PROMPT[-1], *plain], plain))  # the grammar held


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9},
                                           "tag": {"enum": ["red", "green", "blue"]}},
          "required": ["ok", "n", "tag"], "additionalProperties": False}


@pytest.mark.parametrize("drafter", ["lookup", "draft-model"])
def test_json_schema_output_is_identical_with_and_without_speculation(tiny_llama, drafter):
    pytest.importorskip("llguidance")
    draft = str(tiny_llama) if drafter == "draft-model" else None
    engine = Engine.load(str(tiny_llama), drafter=drafter, draft=draft, quantize="q4g32", draft_quantize="q4g32")
    texts = {}
    for k in (0, 4):
        events = list(engine.generate("Once upon a time", GenerateOptions(max_tokens=120, draft_length=k), format=SCHEMA))
        texts[k] = "".join(e.text for e in events)
        assert events[-1].finish_reason == "stop", texts[k]
    assert texts[0] == texts[4]
    value = json.loads(texts[0])
    assert set(value) == {"ok", "n", "tag"} and value["tag"] in ("red", "green", "blue") and 0 <= value["n"] <= 9


def test_bad_formats_are_the_callers_mistake():
    pytest.importorskip("llguidance")
    for bad in ({"type": "nonsense"}, "yaml", 5):
        with pytest.raises(FormatError):
            format_grammar(bad)
    assert format_grammar("json") and format_grammar(SCHEMA)


def test_drafts_past_the_grammars_end_leave_its_state_alone(tiny_qwen2):
    """Drafts that complete the JSON and go on (EOS after it) are walked without moving the request's grammar:
    llguidance's matcher stops at the closing brace and does not count the EOS consumed after it, so rolling back
    as many tokens as were validated undid one token too many (the '{' already emitted)."""
    pytest.importorskip("llguidance")
    from mlxspec.constraints import Constraint

    engine = Engine.load(str(tiny_qwen2))
    (eos,) = engine.tokenizer.eos_token_ids
    brace, close = engine.encode("{"), engine.encode("}")
    constraint = Constraint(engine.grammar_tokenizer(), format_grammar("json"))
    constraint.commit(brace)
    after_brace = constraint.masks([])
    rows = constraint.masks(close + [eos, eos])
    assert rows[0].tolist() == after_brace[0].tolist() and rows[1].sum() == 1 and rows[1][eos]  # '}': only EOS
    assert constraint.masks([]).tolist() == after_brace.tolist()  # still just after '{'


@pytest.mark.parametrize("repeats", [3, 4])
def test_lookup_drafting_the_end_of_the_json_keeps_plain_output(tiny_qwen2, repeats):
    """The prompt '{}<EOS>' repeated: lookup drafts '}', EOS right after the '{' the grammar forces first, the target
    wants ' ' there. Before, the grammar's state went back to before '{', the ' ' broke it and output ended at '{ '."""
    pytest.importorskip("llguidance")
    plain, drafted = Engine.load(str(tiny_qwen2)), Engine.load(str(tiny_qwen2), drafter="lookup", lookup_memory=0)
    (eos,) = plain.tokenizer.eos_token_ids
    prompt = (plain.encode("{}") + [eos]) * repeats
    want = "".join(e.text for e in plain.generate(prompt, GenerateOptions(max_tokens=30), format="json"))
    for k in (2, 4):
        events = list(drafted.generate(prompt, GenerateOptions(max_tokens=30, draft_length=k, adaptive=False),
                                       format="json"))
        assert "".join(e.text for e in events) == want and events[-1].stats.drafted > 0
    assert json.loads(want) == {}
