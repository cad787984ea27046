"""The mtp drafter from safetensors checkpoints: Qwen3.5's original checkpoint (its `mtp.*` tensors, which
mlx-lm's conversions drop), and a drafter folder split from it (mlx-vlm's `qwen3_5_mtp` format), beside a
target loaded from the same checkpoint, quantized or not. The block's logits are checked against a numpy
forward of the MTP graph made from the checkpoint's own tensors, and greedy speculation with it gives plain
decoding's tokens."""

from __future__ import annotations

import json
import re

import mlx.core as mx
import numpy as np
import pytest

from gguf_reference import Hparams, mtp_logits
from model_factory import (ARCH_CONFIGS, random_block, add_original_mtp_block, build_model, make_model_dir,
                           make_qwen35_checkpoint, split_mtp_folder)
from mlxspec.drafters import MtpDrafter
from mlxspec.engine import Engine
from mlxspec.errors import MlxspecError
from mlxspec.features import head as target_head
from mlxspec.features import target_forward
from mlxspec.heads import mtp
from mlxspec.loading import load
from mlxspec.options import GenerateOptions
from speculation_checks import assert_drafts_keep_plain_tokens

PROMPTS = ["the world and the world and the world and the", "Once upon a time"]
TOKENS = [5, 77, 271, 12, 9, 150, 44, 260]
HP = Hparams(arch="qwen35", hidden=64, heads=4, kv_heads=2, head_dim=32, eps=1e-6, rope_dims=8, experts_used=2)
NEXT_HP = Hparams(arch="qwen35", hidden=64, heads=4, kv_heads=2, head_dim=16, eps=1e-5, rope_dims=4, experts_used=2,
                  norm_topk=False)  # model_factory's qwen3_next: mlx-lm's default


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return make_qwen35_checkpoint(tmp_path_factory.mktemp("qwen35") / "dense")


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return make_qwen35_checkpoint(tmp_path_factory.mktemp("qwen35") / "moe", moe=True)


@pytest.fixture(params=["dense", "moe"])
def checkpoint(request):
    """Qwen3.5's original checkpoint, dense and MoE (bfloat16 and float32)."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def qwen3_next(tmp_path_factory):
    """An MLX-written Qwen3-Next with its block as the original checkpoint holds it (one tensor per expert)."""
    return add_original_mtp_block(make_model_dir(tmp_path_factory.mktemp("next"), "qwen3_next", layers=4, seed=3))


@pytest.fixture(params=["dense", "moe", "qwen3_next"])
def original(request):
    """(checkpoint, the reference's hyperparameters): Qwen3.5 dense and MoE, Qwen3-Next."""
    return request.getfixturevalue(request.param), NEXT_HP if request.param == "qwen3_next" else HP


# the checkpoint's names -> the numpy reference's (llama.cpp's), norms made 1 + w as Qwen3.5's RMSNorm is
LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_proj": "attn_k", "self_attn.k_norm": "attn_k_norm", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "post_attention_layernorm": "post_attention_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
         "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
         "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
TOP = {"fc": "nextn.eh_proj", "pre_fc_norm_embedding": "nextn.enorm", "pre_fc_norm_hidden": "nextn.hnorm",
       "norm": "nextn.shared_head_norm"}


def reference_weights(checkpoint) -> dict:
    raw = {}
    for shard in sorted(checkpoint.glob("*.safetensors")):
        raw.update(mx.load(str(shard)))
    embed = raw.get("model.language_model.embed_tokens.weight", raw.get("model.embed_tokens.weight"))
    w, experts = {"token_embd.weight": embed, "output.weight": raw["lm_head.weight"]}, {}
    for key, value in raw.items():
        if not key.startswith("mtp."):
            continue
        stem = key[len("mtp."):]
        if stem.startswith("layers.0."):
            stem = stem[len("layers.0."):]
            if stem in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):  # Qwen3.5: fused
                w[f"blk.mtp.ffn_{stem.split('.')[-1].removesuffix('_proj')}_exps.weight"] = value
                continue
            if match := re.fullmatch(r"mlp\.experts\.(\d+)\.(\w+)_proj\.weight", stem):  # Qwen3-Next: per expert
                experts.setdefault(f"blk.mtp.ffn_{match[2]}_exps.weight", {})[int(match[1])] = value
                continue
            module, _, _ = stem.rpartition(".")
            name = LAYER[module]
        else:
            name = TOP[stem.rpartition(".")[0]]
        w[f"blk.mtp.{name}.weight"] = value + 1.0 if "norm" in stem else value
    w.update({name: mx.stack([by[e] for e in sorted(by)]) for name, by in experts.items()})
    return {k: np.array(v.astype(mx.float32)) for k, v in w.items()}


def test_the_checkpoints_block_is_the_mtp_graph(original):
    """Read from the original checkpoint: renamed, its zero-centred norms made 1 + w, the fused experts
    split (Qwen3.5), the per-expert ones stacked (Qwen3-Next). Dropping the + 1 or swapping the concat order
    moves the logits."""
    checkpoint, hp = original
    model = load(str(checkpoint)).model
    head = mtp.from_checkpoint(checkpoint, model)
    _, hidden = target_forward(model, mx.array([TOKENS]))
    features = head(model.model.embed_tokens(mx.array([TOKENS[1:]])), hidden[:, :-1], None, "causal")
    got = np.array(target_head(model)(features)[0].astype(mx.float32))
    w, h = reference_weights(checkpoint), np.array(hidden[0, :-1].astype(mx.float32))
    want = mtp_logits(w, hp, TOKENS[1:], h, "blk.mtp.")
    scale = np.abs(want).max()
    tolerance = 0.03 if model.model.embed_tokens.weight.dtype == mx.bfloat16 else 1e-4  # bfloat16's 8 bits
    np.testing.assert_allclose(got, want, atol=tolerance * scale, rtol=0)
    assert np.abs(got - mtp_logits(w, hp, TOKENS[1:], h, "blk.mtp.", swap=True)).max() > 0.2 * scale
    unshifted = {k: v - 1.0 if k.endswith("nextn.enorm.weight") else v for k, v in w.items()}
    assert np.abs(got - mtp_logits(unshifted, hp, TOKENS[1:], h, "blk.mtp.")).max() > 0.1 * scale


@pytest.mark.parametrize("bits", [None, 4])
def test_a_drafter_folder_holds_the_same_block(checkpoint, tmp_path, bits):
    """mlx-vlm's split of the same block (prefix off, norms already 1 + w), float or 4-bit, gives the
    checkpoint's logits (the 4-bit one within its rounding)."""
    model = load(str(checkpoint)).model
    folder = split_mtp_folder(checkpoint, tmp_path / "mtp", bits=bits)
    ours, theirs = mtp.from_checkpoint(checkpoint, model), mtp.from_checkpoint(folder, model)
    assert (theirs.layer.self_attn.q_proj.bits == 4) if bits else "scales" not in theirs.layer.self_attn.q_proj
    _, hidden = target_forward(model, mx.array([TOKENS]))
    embeds = model.model.embed_tokens(mx.array([TOKENS[1:]]))
    a, b = (np.array(target_head(model)(m(embeds, hidden[:, :-1], None, "causal")).astype(mx.float32))
            for m in (ours, theirs))
    if bits is None:
        np.testing.assert_array_equal(a, b)
    else:
        assert 0 < np.abs(a - b).max() < 0.25 * np.abs(a).max()


def test_a_float_block_is_quantized_as_the_target(checkpoint):
    target = load(str(checkpoint), quantize="q4g32").model
    head = mtp.from_checkpoint(checkpoint, target)
    _, twin = mtp.attention_layer(target)
    assert (head.layer.self_attn.q_proj.bits, head.layer.self_attn.q_proj.group_size) == (4, 32)
    assert head.eh_proj.bits == twin.self_attn.q_proj.bits
    if "switch_mlp" in head.layer.mlp:  # the router as the target's router is (mlx-lm quantizes it too here)
        assert head.layer.mlp.switch_mlp.gate_proj.bits == twin.mlp.switch_mlp.gate_proj.bits


@pytest.mark.parametrize("quantize", [None, "q4g32"])
def test_greedy_speculation_with_the_block_is_plain_decoding(original, quantize):
    checkpoint, _ = original
    plain = Engine.load(str(checkpoint), quantize=quantize)
    drafted = Engine.load(str(checkpoint), quantize=quantize, drafter="mtp", min_confidence=0.0)
    assert drafted.drafter.name == "mtp" and drafted.drafter.config["file"] == str(checkpoint)
    assert_drafts_keep_plain_tokens(plain, drafted, PROMPTS, 24)


def test_a_separate_source_serves_a_target_without_the_block(checkpoint, tmp_path):
    """An MLX conversion has no mtp.* tensors: 'mtp' alone says where to get them, 'mtp:PATH' reads them
    from the original checkpoint or a drafter folder."""
    converted = tmp_path / "converted"
    converted.mkdir()
    for f in checkpoint.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            (converted / f.name).write_bytes(f.read_bytes())
    model = load(str(checkpoint)).model
    mx.save_safetensors(str(converted / "model.safetensors"),
                        dict(_flatten(model.parameters())), metadata={"format": "mlx"})
    with pytest.raises(MlxspecError, match="no multi-token-prediction block.*mtp:ORG/REPO"):
        Engine.load(str(converted), drafter="mtp")
    folder = split_mtp_folder(checkpoint, tmp_path / "mtp")
    plain = Engine.load(str(converted))
    want = [t for e in plain.generate(PROMPTS[0], GenerateOptions(max_tokens=16, temperature=0)) for t in e.tokens]
    for source in (checkpoint, folder):
        engine = Engine.load(str(converted), drafter=f"mtp:{source}", min_confidence=0.0)
        assert engine.drafter.config["file"] == str(source)
        events = list(engine.generate(PROMPTS[0], GenerateOptions(max_tokens=16, temperature=0, draft_length=2,
                                                                  adaptive=False)))
        assert [t for e in events for t in e.tokens] == want and events[-1].stats.drafted > 0


def _flatten(params):
    from mlx.utils import tree_flatten

    return tree_flatten(params)


def test_blocks_that_do_not_fit_are_refused_by_name(checkpoint, tmp_path):
    model = load(str(checkpoint)).model
    other = make_qwen35_checkpoint(tmp_path / "wide", seed=1)
    config = json.loads((other / "config.json").read_text())
    config["text_config"] = {**config["text_config"], "hidden_size": 96}
    folder = split_mtp_folder(other, tmp_path / "mtp")
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_5_mtp", "text_config": config["text_config"]}))
    mx.save_safetensors(str(folder / "model.safetensors"), {"fc.weight": mx.zeros((96, 192)),
                                                            "norm.weight": mx.ones((96,))})
    with pytest.raises(MlxspecError, match="works on 96 hidden dimensions, the model on 64"):
        mtp.from_checkpoint(folder, model)
    deep = split_mtp_folder(checkpoint, tmp_path / "deep")
    tensors = mx.load(str(deep / "model.safetensors"))
    tensors["layers.1.input_layernorm.weight"] = tensors["layers.0.input_layernorm.weight"]
    mx.save_safetensors(str(deep / "model.safetensors"), tensors, metadata={"format": "mlx"})
    with pytest.raises(MlxspecError, match="one-layer blocks"):
        mtp.from_checkpoint(deep, model)
    (tmp_path / "empty").mkdir()
    with pytest.raises(MlxspecError, match="is not a checkpoint: it has no config.json"):
        Engine.load(str(checkpoint), drafter=f"mtp:{tmp_path / 'empty'}")
    (tmp_path / "empty" / "config.json").write_text("{not json")
    with pytest.raises(MlxspecError, match="config.json cannot be read"):
        Engine.load(str(checkpoint), drafter=f"eagle3:{tmp_path / 'empty'}")


@pytest.mark.parametrize("confidence", [0.75, 0.0], ids=["p-min", "whole-chains"])
def test_sampling_with_the_block_keeps_the_target_law(tmp_path, confidence):
    """On a 4-token vocabulary the law of every 3-token continuation is known (test_decode_sampling.fit):
    sampled drafts from a Qwen3-Next block, with chains cut where the block is unsure or not, fit it."""
    from test_decode_sampling import fit

    config = {**ARCH_CONFIGS["qwen3_next"], "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 4,
              "max_position_embeddings": 64, "rope_theta": 10000.0}
    target = build_model(config, seed=3, scale=0.8)
    folder = tmp_path / "block"  # a drafter folder: the block under its names, norms as 1 + w
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_5_mtp", "text_config": config}))
    block = {k.removeprefix("mtp."): v for k, v in random_block(target, seed=5, scale=0.8, dtype=mx.float32).items()}
    mx.save_safetensors(str(folder / "model.safetensors"), block, metadata={"format": "mlx"})
    drafter = MtpDrafter(target, None, min_confidence=confidence, source=folder)
    pvalue, acceptance = fit(target, drafter, {"temperature": 1.0}, k=2, n=700)
    assert pvalue > 1e-3 and acceptance > 0.1  # drafts were really in play
    assert (drafter.syncs > 0) == (confidence > 0)
