"""RowInvariance: the engine measures whether verify rows equal one-row steps, and says so per request."""

from __future__ import annotations

from mlxspec.engine import Engine
from mlxspec.exactness import RowInvariance
from mlxspec.loading import load
from mlxspec.options import GenerateOptions
from speculation_checks import RowCountDependent


def test_cpu_model_is_row_invariant(tiny_llama):
    check = RowInvariance(load(str(tiny_llama), "q4g32").model)
    assert check.holds(6) and check.failures() == {}
    assert sorted(check.results) == [("", m) for m in (2, 3, 4, 5, 6)]  # (pass, rows): the forward alone here


def test_a_row_count_dependent_layer_is_caught_from_its_row_count_on(tiny_llama):
    model = load(str(tiny_llama)).model
    block = model.model.layers[0].mlp
    block.down_proj = RowCountDependent(block.down_proj)
    check = RowInvariance(model)
    assert check.holds(2)  # two rows still take the one-row arithmetic
    assert not check.holds(5)
    failures = check.failures()
    assert sorted(failures) == [3, 4, 5] and "differs from the one-row step" in failures[3]


def test_every_response_says_whether_it_was_exact(tiny_llama):
    engine = Engine.load(str(tiny_llama), drafter="lookup", draft_length=3)
    last = list(engine.generate("Once upon a time", GenerateOptions(max_tokens=8)))[-1]
    assert last.stats.exact is True and last.stats.to_dict()["exact"] is True
    assert "exact: yes" in last.stats.summary()
    mlp = engine.target.model.model.layers[0].mlp
    mlp.down_proj = RowCountDependent(mlp.down_proj)
    engine.rows = RowInvariance(engine.target.model)  # the model changed: measure again
    last = list(engine.generate("Once upon a time", GenerateOptions(max_tokens=8)))[-1]
    assert last.stats.exact is False and "exact: no" in last.stats.summary()
    plain = list(engine.generate("Once upon a time", GenerateOptions(max_tokens=8, draft_length=0)))[-1]
    assert plain.stats.exact is True  # one-row steps only: plain decoding is its own reference
