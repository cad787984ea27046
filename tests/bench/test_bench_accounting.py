"""Bytes read per token follow the parameters; bandwidth and prompt sets load."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from mlxspec import loading
from mlxspec.bench.accounting import bytes_per_token, model_bytes
from mlxspec.bench.bandwidth import measure_bandwidth
from mlxspec.bench.prompts import CATEGORY_SETS, available_sets, load_prompt_set
from mlxspec.errors import MlxspecError


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return loading.load(str(tiny_llama))


def test_model_bytes_match_the_parameters(tiny):
    params = dict(tree_flatten(tiny.model.parameters()))
    total = sum(v.nbytes for v in params.values())
    table = params["model.embed_tokens.weight"]  # tiny llama is untied: one row read per token
    mb = model_bytes(tiny.model)
    assert mb.parameter_bytes == total == tiny.info["weight_bytes"]
    assert mb.embedding_table_bytes == table.nbytes
    assert mb.weights_read_per_step == total - table.nbytes + table.nbytes // table.shape[0]
    cfg = tiny.config
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    assert mb.kv_bytes_per_position == 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 4


def test_quantized_model_bytes_count_scales_and_biases(tiny_llama):
    q = loading.load(str(tiny_llama), "q4g32")
    assert model_bytes(q.model).parameter_bytes == sum(v.nbytes for _, v in tree_flatten(q.model.parameters()))
    assert model_bytes(q.model).parameter_bytes < model_bytes(loading.load(str(tiny_llama)).model).parameter_bytes


def test_a_token_reads_only_its_experts(tmp_path):
    """qwen3moe: 8 experts, 3 used per token: a step reads 3/8 of the stacked experts, all else whole."""
    from gguf_fixtures import Dims, write_tiny_llama_gguf

    path = write_tiny_llama_gguf(tmp_path / "moe.gguf", "Q4_0", arch="qwen3moe", dims=Dims(experts=8, experts_used=3))
    model = loading.load(str(path)).model
    params = dict(tree_flatten(model.parameters()))
    experts = sum(v.nbytes for k, v in params.items() if ".switch_mlp." in k)
    mb = model_bytes(model)
    assert experts > mb.parameter_bytes / 2  # the experts are most of this model
    assert mb.weights_read_per_step == pytest.approx(mb.parameter_bytes - experts * 5 / 8, abs=1)


def test_bytes_per_token_of_speculative_rounds(tiny):
    mb = model_bytes(tiny.model)
    plain = bytes_per_token(mb, None, tokens=10, target_passes=10, draft_passes=0, context=50)
    assert plain == pytest.approx(mb.step_bytes(50))
    # 10 tokens from 4 target passes and 12 drafted tokens of a draft half the size
    half = type(mb)(mb.parameter_bytes // 2, mb.weights_read_per_step // 2, 0, mb.kv_bytes_per_position)
    spec = bytes_per_token(mb, half, tokens=10, target_passes=4, draft_passes=12, context=50)
    assert spec == pytest.approx((4 * mb.step_bytes(50) + 12 * half.step_bytes(50)) / 10)
    assert bytes_per_token(mb, None, tokens=0, target_passes=0, draft_passes=0, context=0) == 0


def test_bandwidth_is_positive():
    bw = measure_bandwidth(mib=4, repeats=1)
    assert bw.copy_gbs > 0 and bw.read_gbs > 0 and bw.mlx_copy_gbs > 0
    on_cpu = dataclasses.replace(bw, device="cpu")  # a CPU decodes: the larger host rate
    assert on_cpu.roofline_gbs == max(bw.copy_gbs, bw.read_gbs)
    assert bw.device == ("cpu" if mx.default_device() == mx.cpu else "gpu")  # the device MLX decodes on
    on_gpu = dataclasses.replace(bw, device="gpu")  # the device that decodes sets the roofline there
    assert on_gpu.roofline_gbs == bw.mlx_copy_gbs and on_gpu.to_dict()["roofline_gbs"] == bw.mlx_copy_gbs


def test_shipped_prompt_sets_document_their_source():
    names = available_sets()
    assert {"default", "stories", "all", *CATEGORY_SETS} <= set(names)
    for name in names:
        s = load_prompt_set(name)
        assert s.source and s.prompts
    categories = {p.category for p in load_prompt_set("default").prompts}
    assert categories == {"input-grounded", "code", "prose", "chat"}


def test_bad_prompt_sets_are_one_line_errors(tmp_path):
    with pytest.raises(MlxspecError, match="not found"):
        load_prompt_set("no-such-set")
    bad = tmp_path / "bad.json"
    bad.write_text('{"prompts": [{"text": "x"}]}')
    with pytest.raises(MlxspecError, match="source"):
        load_prompt_set(str(bad))
    bad.write_text('{"source": "test", "prompts": [{"id": 1}]}')
    with pytest.raises(MlxspecError, match="needs 'text'"):
        load_prompt_set(str(bad))
