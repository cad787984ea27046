"""An EAGLE head is quantized for speed where its layers allow: a layer whose input the group size does not divide
(an MLP's intermediate size, stories260K's 172) stays as it is instead of failing the load."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from model_factory import make_model_dir
from mlxspec.engine import Engine
from mlxspec.heads import eagle, files
from mlxspec.options import GenerateOptions
from speculation_checks import assert_drafts_keep_plain_tokens


def test_a_head_with_an_indivisible_mlp_loads_and_keeps_plain_tokens(tmp_path):
    target = make_model_dir(tmp_path / "target", "llama", intermediate=96)  # hidden 64: groups of 64; 96 is not
    plain = Engine.load(str(target))
    model = plain.target.model
    mx.random.seed(0)
    head = eagle.EagleHead(eagle.block_config(model))
    rows = eagle.DraftHead(model, mx.arange(1)).module_rows
    config = {"target_sha256": files.identity(model), "target": "test", "block": eagle.block_config(model)}
    path = eagle.save(tmp_path / "head", head, mx.arange(rows, dtype=mx.int32), config)

    drafted = Engine.load(str(target), drafter=f"eagle:{path}")
    layers = dict(drafted.drafter.head.named_modules())
    assert isinstance(layers["layer.mlp.down_proj"], nn.Linear)  # input 96: kept in float
    assert isinstance(layers["layer.mlp.gate_proj"], nn.QuantizedLinear)  # input 64: quantized as before
    assert_drafts_keep_plain_tokens(plain, drafted, ["Once upon a time", "def add(a, b):"], 16, lengths=(1, 3))
    width = [t for e in drafted.generate("The quick brown fox", GenerateOptions(max_tokens=16, draft_length=3,
                                                                                  draft_width=2, adaptive=False))
             for t in e.tokens]
    assert width == [t for e in plain.generate("The quick brown fox", GenerateOptions(max_tokens=16)) for t in e.tokens]
