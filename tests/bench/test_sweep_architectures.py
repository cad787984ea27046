"""benchmarks/sweep_architectures.py's pieces, small: its verdicts read what a run did, and a row of it runs."""

from __future__ import annotations

import pytest

from benchmark_scripts import load
from mlxspec.stats import Stats


@pytest.fixture(scope="module")
def sweep():
    return load("sweep_architectures")


def test_verdicts_name_what_a_run_did(sweep):
    drafted = dict(drafter="lookup", drafted=5)
    assert sweep.verdict([1, 2], [1, 2], Stats(**drafted, exact=True)) == "exact"
    assert sweep.verdict([1, 2], [1, 2], Stats(**drafted, exact=False)) == "flagged"
    assert sweep.verdict([1, 2], [1, 3], Stats(**drafted, exact=False)) == "flagged"
    assert sweep.verdict([1, 2], [1, 3], Stats(**drafted, exact=True)) == "differs"  # the one that is a bug
    assert sweep.verdict([1, 2], [1, 2], Stats(drafter="lookup", exact=True)) == "no drafts"


def test_a_row_runs_and_the_counts_add_up(sweep, tmp_path):
    rows = {t: sweep.sweep_one(t, tmp_path, gpu=False) for t in ("falcon_h1", "gemma4_text", "not_a_model_type")}
    compiled = "same tokens, same bits"  # its compiled steps (a CacheList a layer) are the model's own
    assert set(rows["falcon_h1"]) == {f"{sweep.DEVICE} float", f"{sweep.DEVICE} q4"}
    for row in rows["falcon_h1"].values():  # logprobs, JSON, prompts that share a prefix: as plain's, as fresh ones'
        assert row.pop("reuse") == "same (prompt tokens reused: 0/56/63 of 33/64/64)"  # its states: 0, extended, checkpoint
        assert row == {"k2": "exact", "k5": "exact", "features": "same", "compiled": compiled}
    assert "skipped" in rows["gemma4_text"] and "skipped" in rows["not_a_model_type"]
    assert sweep.summary(rows) == {"exact": 1, "skipped": 2}
    wrong = {"cpu float": {"k2": "exact", "k5": "exact", "compiled": "differ"}}  # compiled steps of another model
    unlike = {"cpu float": {"k2": "exact", "k5": "exact", "features": "differ: logprobs"}}
    assert sweep.summary({"a": wrong, "b": unlike}) == {"differs": 2}


def test_another_drafter_runs_and_a_refusal_is_counted_apart(sweep, tmp_path):
    """--drafter: the model drafting for itself keeps plain decoding's tokens; early exit, whose cut of AFM does not
    run (its KV-reusing layers), is refused with its reason (a caller's error, not a sweep failure)."""
    drafted = sweep.sweep_one("llama", tmp_path, gpu=False, drafter="draft-model")
    for row in drafted.values():
        assert row.pop("reuse").startswith("same") and row == {"k2": "exact", "k5": "exact", "features": "same"}
    assert set(drafted) == {f"{sweep.DEVICE} float", f"{sweep.DEVICE} q4"}
    refused = sweep.sweep_one("afm7", tmp_path, gpu=False, drafter="early-exit")
    assert "does not run on mlx_lm.models.afm7" in refused["refused"]
    assert sweep.summary({"llama": drafted, "afm7": refused}) == {"exact": 1, "refused": 1}
