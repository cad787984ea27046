"""benchmarks/fuzz_exactness.py's pieces, small: its cases are valid requests, and its check passes speculation
that keeps plain decoding's output and catches one that does not."""

from __future__ import annotations

import random

import pytest

from benchmark_scripts import load
from mlxspec.engine import Engine
from mlxspec.options import GenerateOptions


TEXT = "the cat sat on the mat the cat sat on the mat the cat sat on the"  # repeats: lookup drafts
CASE = {"draft_length": 4, "adaptive": False, "max_tokens": 24}


@pytest.fixture(scope="module")
def fuzz():
    return load("fuzz_exactness")


@pytest.fixture(scope="module")
def lookup(tiny_llama):
    return Engine.load(str(tiny_llama), drafter="lookup")


def test_every_drawn_case_is_a_valid_request(fuzz):
    rng = random.Random(0)
    cases = [fuzz.draw(rng, 20) for _ in range(300)]
    for case in cases:
        GenerateOptions(**{k: v for k, v in case.items() if k != "format"})  # raises OptionsError if not
    assert {bool(c.get("temperature")) for c in cases} == {False, True}  # greedy and sampled cases
    assert any("draft_width" in c for c in cases) and any(c.get("format") == "json" for c in cases)
    assert all(20 < c["num_ctx"] <= 32 for c in cases if "num_ctx" in c)


def test_prompts_are_sometimes_long_enough_for_a_prompt_chunk_and_fit_the_model(fuzz, lookup):
    from mlxspec.kernels.passes import DECODE_ROWS

    rng = random.Random(0)
    lengths = [len(lookup.encode(fuzz.request_text(rng, lookup))) for _ in range(200)]
    assert max(lengths) <= fuzz.MAX_PROMPT_TOKENS and min(lengths) >= 3
    assert 5 <= sum(n > DECODE_ROWS for n in lengths) <= 40  # ~1 in 10 runs as a prompt chunk


def test_the_check_passes_exact_speculation_and_catches_a_changed_token(fuzz, lookup, monkeypatch):
    rng = random.Random(3)
    why, spec = fuzz.check(lookup, TEXT, dict(CASE), rng)
    assert why is None and spec["drafted"] > 0  # speculation ran, and its output is plain decoding's
    why, _ = fuzz.check(lookup, TEXT, {**CASE, "temperature": 0.9, "seed": 7}, rng)
    assert why is None  # seeded sampling reproduces itself
    real = fuzz.run

    def speculation_drops_a_token(engine, text_, case_):
        out = real(engine, text_, case_)
        if case_["draft_length"]:
            out["tokens"] = out["tokens"][:-1]
        return out

    monkeypatch.setattr(fuzz, "run", speculation_drops_a_token)
    why, _ = fuzz.check(lookup, TEXT, dict(CASE), rng)
    assert why == "tokens differ from plain decoding's"


def test_a_random_eagle_head_makes_tree_rounds_and_keeps_plain_tokens(fuzz, tiny_llama, tmp_path):
    """The fuzz's EAGLE engines (an untrained head) draft favourites trees where draft_width > 1: tree rounds run,
    and the check holds them to plain decoding's output."""
    engine = Engine.load(str(tiny_llama), drafter=f"eagle:{fuzz.random_eagle_head(tiny_llama, tmp_path / 'head')}",
                         quantize=fuzz.EAGLE_QUANTIZE)
    case = {"draft_length": 3, "draft_width": 2, "adaptive": False, "max_tokens": 16}
    why, spec = fuzz.check(engine, "the cat sat on the mat", dict(case), random.Random(1))
    assert why is None and spec["tree_rounds"] > 0 and spec["drafted"] > 0


def test_on_an_emulated_gpu_the_check_passes_exact_kernels_and_catches_mlx_ops(fuzz, tiny_llama):
    """--emulate-gpu: MLX's row-sensitive ops drift with the row count; in exact mode the kernels keep speculation
    to plain decoding's tokens and the run reports exact; with MLX's ops (kernels off) the check sees the drift."""
    with fuzz.emulated_gpu():
        exact = Engine.load(str(tiny_llama), drafter="lookup", kernels="exact")
        assert exact.kernels["target"]["backend"] == "cuda"
        why, spec = fuzz.check(exact, TEXT, dict(CASE), random.Random(0), exact=True)
        assert why is None and spec["drafted"] > 0 and spec["exact"] is True
        mlx_ops = Engine.load(str(tiny_llama), drafter="lookup", kernels=False)
        why, spec = fuzz.check(mlx_ops, TEXT, dict(CASE), random.Random(0), exact=True)
        assert spec["drafted"] > 0 and why is not None, spec


def test_without_a_kernel_family_a_run_may_differ_only_where_it_says_so(fuzz, tiny_llama):
    """--without sdpa: MLX's drifting attention serves verify rows; the run reports exact=false, so its differing
    tokens are flagged, not a mismatch; the same run under the strict check is one."""
    with fuzz.emulated_gpu("cuda", ("sdpa",)):
        engine = Engine.load(str(tiny_llama), drafter="lookup", kernels="exact")
        why, spec = fuzz.check(engine, TEXT, dict(CASE), random.Random(0), flagged=True)
        assert why is None and spec["exact"] is False and spec["drafted"] > 0
        strict, _ = fuzz.check(engine, TEXT, dict(CASE), random.Random(0), exact=True)
        assert strict is not None
    with pytest.raises(ValueError, match="no stand-in to take away"):
        with fuzz.emulated_gpu("cuda", ("attention",)):
            pass
