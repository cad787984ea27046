"""mlxspec/bench/ceiling.py: drafts that are always right measure the verify path alone, and show inexactness.

With the kernels (row-invariant here, as on a GPU), every oracle draft is kept, a pass of k + 1 rows yields
k + 1 tokens and the tokens are plain decoding's. A layer whose arithmetic changes with the row count (as
MLX's GPU matmuls do) makes the target refuse drafts plain decoding chose, or give other tokens: the report
says so rather than hiding it."""

from __future__ import annotations

import math

from mlxspec.bench.ceiling import Oracle, speculation_ceiling
from mlxspec.kernels.install import install_kernels
from mlxspec.loading import load
from mlxspec.sampling import Sampling
from mlxspec.step_graph import StepGraphs
from speculation_checks import RowCountDependent

PROMPT = [5, 17, 42, 9, 120, 33, 7, 64]


def test_the_oracle_proposes_what_follows_in_plain_decoding():
    oracle = Oracle([10, 11, 12, 13])
    oracle.start([1, 2, 3])
    assert oracle.propose([1, 2, 3], 2, Sampling(), None).tokens.tolist() == [10, 11]
    assert oracle.propose([1, 2, 3, 10, 11], 3, Sampling(), None).tokens.tolist() == [12, 13]
    assert oracle.propose([1, 2, 3, 10, 11, 12, 13], 3, Sampling(), None).count == 0


def test_with_invariant_rows_every_draft_is_kept_and_the_tokens_are_plain_decodings(tiny_llama):
    model = load(str(tiny_llama), "q4g32").model
    install_kernels(model, fuse=False)  # the per-op kernels: what a GPU runs
    report = speculation_ceiling(model, PROMPT, StepGraphs(model), tokens=16, lengths=(1, 3, 7), repeats=1)
    assert report["plain_same_tokens"] and report["plain_tok_s"] > 0
    for k in (1, 3, 7):
        row = report[f"k={k}"]
        assert row["kept"] == 1.0 and row["same_tokens"], (k, row)
        assert row["passes"] == math.ceil(16 / (k + 1)) and row["tok_s"] > 0  # k + 1 tokens a pass


def test_rows_that_change_with_the_row_count_show_as_refused_drafts_or_other_tokens(tiny_llama):
    model = load(str(tiny_llama)).model
    for layer in model.model.layers:
        layer.mlp.down_proj = RowCountDependent(layer.mlp.down_proj, factor=1.5)
    report = speculation_ceiling(model, PROMPT, None, tokens=16, lengths=(3,), repeats=1)
    row = report["k=3"]
    assert row["kept"] < 1.0 or not row["same_tokens"], row


def test_the_script_measures_a_model_as_the_engine_loads_it(tiny_llama, tmp_path, monkeypatch):
    import json
    import sys

    from benchmark_scripts import load as load_script

    out = tmp_path / "ceiling.json"
    monkeypatch.setattr(sys, "argv", ["bench_ceiling.py", str(tiny_llama), "--tokens", "8", "--repeats", "1",
                                      "--out", str(out)])
    load_script("bench_ceiling").main()
    report = json.loads(out.read_text())
    assert report["model"] == str(tiny_llama) and report["plain_same_tokens"]
    assert all(report[f"k={k}"]["kept"] == 1.0 and report[f"k={k}"]["same_tokens"] for k in (1, 3, 7, 15))
