"""The mtp drafter: a Qwen3.5 GGUF's own multi-token-prediction block, read from the file and run as an
EAGLE head. Its logits are checked against a numpy forward of llama.cpp's qwen35 MTP graph, and greedy
speculation with it (an untrained, random block here) gives plain decoding's tokens."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import gguf_fixtures as fx
from gguf_fixtures import Dims, write_tiny_llama_gguf
from gguf_reference import Hparams, dequantized_weights, mtp_logits
from mlxspec.engine import Engine
from mlxspec.errors import MlxspecError
from mlxspec.features import head as target_head
from mlxspec.features import target_forward
from mlxspec.gguf import load_gguf
from mlxspec.heads import mtp
from mlxspec.options import GenerateOptions
from speculation_checks import assert_drafts_keep_plain_tokens

DIMS = Dims(layers=2, head_dim=32, rope_dims=8, experts=8, experts_used=3, nextn=1)
PROMPTS = ["the world and the world and the world and the", "Once upon a time", "def add(a, b):"]


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe"])
def qwen35(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("mtp") / f"{request.param}.gguf"
    return write_tiny_llama_gguf(path, "Q8_0", arch=request.param, dims=DIMS, pre="qwen35", output_qtype="Q8_0")


def test_the_block_is_llama_cpps_mtp_graph(qwen35):
    model, _, _ = load_gguf(qwen35)
    head = mtp.from_gguf(qwen35, model)
    tokens = [5, 77, 271, 12, 9, 150, 44, 260]
    _, hidden = target_forward(model, mx.array([tokens]))
    features = head(model.model.embed_tokens(mx.array([tokens[1:]])), hidden[:, :-1], None, "causal")
    got = np.array(target_head(model)(features)[0])
    hp = Hparams(arch="qwen35", hidden=DIMS.hidden, heads=DIMS.heads, kv_heads=DIMS.kv_heads, head_dim=DIMS.hd,
                 eps=fx.RMS_EPS, rope_dims=8, experts_used=3)
    w, h = dequantized_weights(qwen35), np.array(hidden[0, :-1])
    want = mtp_logits(w, hp, tokens[1:], h, f"blk.{DIMS.layers}.")
    np.testing.assert_allclose(got, want, atol=5e-5, rtol=0)
    assert np.abs(got - mtp_logits(w, hp, tokens[1:], h, f"blk.{DIMS.layers}.", swap=True)).max() > 0.05  # the concat order matters


def test_greedy_speculation_with_the_block_is_plain_decoding(qwen35):
    plain, drafted = Engine.load(str(qwen35)), Engine.load(str(qwen35), drafter="mtp")
    assert drafted.drafter.name == "mtp" and "drafter0" in drafted.kernels  # the block's projections run the kernels
    assert_drafts_keep_plain_tokens(plain, drafted, PROMPTS, 30)


def test_unsure_drafts_end_the_chain(qwen35):
    """llama.cpp's p-min (default 0.75 for mtp): a chain stops after a draft the block gives less than that
    probability. 1.0 stops every chain after its first draft; 0 never stops one. Tokens stay plain's."""
    assert Engine.load(str(qwen35), drafter="mtp").drafter.min_confidence == 0.75
    plain = Engine.load(str(qwen35))
    options = dict(max_tokens=24, temperature=0, draft_length=3, adaptive=False)
    want = [t for e in plain.generate(PROMPTS[0], GenerateOptions(max_tokens=24, temperature=0)) for t in e.tokens]
    for confidence, deeper in ((1.0, False), (0.0, True)):
        engine = Engine.load(str(qwen35), drafter="mtp", min_confidence=confidence)
        events = list(engine.generate(PROMPTS[0], GenerateOptions(**options)))
        assert [t for e in events for t in e.tokens] == want
        stats = events[-1].stats
        assert stats.drafted_per_position[0] > 0 and (sum(stats.drafted_per_position[1:]) > 0) == deeper
        assert (engine.drafter.syncs > 0) == (confidence > 0)


def test_sampling_runs_with_the_block(qwen35):
    engine = Engine.load(str(qwen35), drafter="mtp")
    options = GenerateOptions(max_tokens=20, temperature=0.8, seed=3, draft_length=2, adaptive=False)
    events = list(engine.generate(PROMPTS[0], options))
    assert sum(len(e.tokens) for e in events) == 20 and events[-1].stats.drafted > 0


def test_a_model_without_a_block_is_refused_clearly(tmp_path, tiny_llama):
    bare = write_tiny_llama_gguf(tmp_path / "bare.gguf", "Q8_0", arch="qwen35", dims=Dims(head_dim=32, rope_dims=8))
    with pytest.raises(MlxspecError, match="carries no multi-token-prediction block"):
        Engine.load(str(bare), drafter="mtp")
    with pytest.raises(MlxspecError, match="runs the multi-token-prediction blocks of Qwen3.5"):
        Engine.load(str(tiny_llama), drafter="mtp")
