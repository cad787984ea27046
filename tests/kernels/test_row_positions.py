"""Draft trees' passes on GPUs (kernels/row_positions.py, tree.py), on this CPU and on an emulated GPU.

RoPE with one position per row equals one-row calls; on an emulated GPU (gpu_emulation.emulate_gpu:
CUDA's wiring, row-invariant stand-ins, MLX's row-sensitive ops drifting with the row count) a tree
pass through mlx-lm's llama blocks gives every node the bits of a one-row decoding step over its path,
the engine's exactness check holds tree passes to one-row steps, and greedy tree rounds keep plain
decoding's tokens. The kernel's own tree mode is tested under the emulator (test_gpu_attention_sources).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from test_eagle import random_head

from gpu_emulation import emulate_gpu
from model_factory import config_dir, make_model_dir
from mlxspec.cache import new_cache
from mlxspec.decode import Decoder
from mlxspec.engine import Engine
from mlxspec.kernels import registry
from mlxspec.kernels.row_positions import RowPositionsRoPE, tree_passes_ready
from mlxspec.options import GenerateOptions
from mlxspec.stats import Stats
from mlxspec.step_graph import StepGraphs
from mlxspec.tree import TreeRound, path_to, target_takes_trees, tree_forward

TREES = {"chain": [-1, 0, 1, 2], "bushy": [-1, 0, 0, 1, 1, 2, 3, 3, 6, 2]}


@pytest.mark.parametrize("rope", [nn.RoPE(16, base=10000.0), nn.RoPE(16, traditional=True, base=500.0, scale=0.5)])
def test_a_position_per_row_equals_one_row_calls(rope):
    x = mx.random.normal((1, 3, 5, 16), key=mx.random.key(1))
    positions = mx.array([7, 8, 8, 9, 12], mx.int32)
    rows = RowPositionsRoPE(rope)(x, offset=positions)
    for m in range(5):
        one = rope(x[:, :, m : m + 1], offset=int(positions[m].item()))
        assert mx.array_equal(rows[:, :, m : m + 1], one).item(), m
    assert mx.array_equal(RowPositionsRoPE(rope)(x, offset=3), rope(x, offset=3)).item()  # other calls: as before
    with pytest.raises(ValueError, match="positions"):
        RowPositionsRoPE(rope)(x, offset=positions[:4])


@pytest.fixture
def gpu(monkeypatch):
    default = mx.default_device()
    mx.set_default_device(mx.cpu)
    emulate_gpu(monkeypatch)
    yield
    registry.reset()
    mx.set_default_device(default)


@pytest.fixture
def llama(tmp_path):
    return make_model_dir(tmp_path / "llama", "llama", seed=3)


OTHER_FAMILIES = {  # TREE_FAMILIES beyond llama: MoE experts through the grouped gather, a fused q/k/v
    "qwen3_moe": lambda d: config_dir(d, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                                      mlp_only_layers=[], norm_topk_prob=True, moe_intermediate_size=32,
                                      tie_word_embeddings=False),
    "phi3": lambda d: config_dir(d, model_type="phi3", tie_word_embeddings=False),
}


@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_other_families_take_trees_on_an_emulated_gpu(gpu, tmp_path, family):
    engine = Engine.load(str(OTHER_FAMILIES[family](tmp_path / family)), kernels="exact")
    model, parents, prompt = engine.target.model, TREES["bushy"], list(range(3, 20))
    assert target_takes_trees(model)
    nodes = mx.array([prompt[-1]] + [(5 * m + 3) % 60 + 5 for m in range(1, len(parents))], dtype=mx.uint32)
    steps = StepGraphs(model)
    logits = tree_forward(model, nodes, prefilled(model, prompt[:-1]), parents, False, steps)[0]
    for m in range(len(parents)):
        cache = prefilled(model, prompt[:-1])
        for node in path_to(parents, m):
            want = steps(nodes[node : node + 1][None], cache)[0, -1]
        assert mx.array_equal(logits[m], want).item(), (family, m)


def prefilled(model, prompt: list[int]) -> list:
    cache = new_cache(model)
    mx.eval(model(mx.array(prompt)[None], cache=cache))
    return cache


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("shape", TREES)
def test_every_node_equals_a_one_row_step_on_an_emulated_gpu(gpu, llama, shape, compiled):
    engine = Engine.load(str(llama), kernels="exact")
    model, parents = engine.target.model, TREES[shape]
    assert engine.kernels["target"]["backend"] == "cuda" and target_takes_trees(model)
    prompt = list(range(3, 20))
    nodes = [prompt[-1]] + [(7 * m + 3) % 60 + 5 for m in range(1, len(parents))]
    steps = StepGraphs(model)  # one-row steps as decoding runs them on a GPU: compiled graphs
    tree_steps = StepGraphs(model) if compiled else None  # a tree pass as a compiled graph, as tree rounds run it
    logits = tree_forward(model, mx.array(nodes, dtype=mx.uint32), prefilled(model, prompt[:-1]), parents, False, tree_steps)[0]
    if compiled:
        assert tree_steps.off is None and any(g[0] == "tree" for g in tree_steps.graphs), tree_steps.status()
    for m in range(len(parents)):
        cache = prefilled(model, prompt[:-1])
        for node in path_to(parents, m):
            want = steps(mx.array([[nodes[node]]]), cache)[0, -1]
        assert mx.array_equal(logits[m], want).item(), (shape, m)
    assert steps.off is None


def test_a_compiled_tree_pass_takes_each_tree_as_an_input(gpu, llama):
    """Trees of the same size replay one compiled graph: its tree and positions are inputs, not constants."""
    engine = Engine.load(str(llama), kernels="exact")
    model, steps, prompt = engine.target.model, StepGraphs(engine.target.model), list(range(3, 20))
    nodes = mx.array([prompt[-1], 7, 9, 11], dtype=mx.uint32)
    for parents in ([-1, 0, 1, 2], [-1, 0, 0, 1], [-1, 0, 0, 0]):
        logits = tree_forward(model, nodes, prefilled(model, prompt[:-1]), parents, False, steps)[0]
        for m in range(4):
            cache = prefilled(model, prompt[:-1])
            for node in path_to(parents, m):
                want = steps(nodes[node : node + 1][None], cache)[0, -1]
            assert mx.array_equal(logits[m], want).item(), (parents, m)
    assert len([g for g in steps.graphs if g[0] == "tree"]) == 1  # one graph for the three trees


def test_a_tree_pass_that_fails_in_a_graph_runs_eagerly_and_steps_stay_compiled(gpu, llama, monkeypatch):
    """A tree pass whose compiled graph fails (an op a trace refuses, say) is built eagerly from then on, with the
    same result; the decoding steps keep their compiled graphs."""
    from mlxspec import tree

    engine = Engine.load(str(llama), kernels="exact")
    model, steps, prompt, parents = engine.target.model, StepGraphs(engine.target.model), list(range(3, 20)), TREES["bushy"]
    nodes = mx.array([prompt[-1]] + [9] * (len(parents) - 1), dtype=mx.uint32)
    want = tree_forward(model, nodes, prefilled(model, prompt[:-1]), parents, False)[0]

    def refuses(*args):
        raise ValueError("not in a graph")

    monkeypatch.setattr(tree, "_tree_graph", refuses)
    got = tree_forward(model, nodes, prefilled(model, prompt[:-1]), parents, False, steps)[0]
    assert mx.array_equal(got, want).item() and "tree" in steps.extra_off and steps.off is None
    assert steps(mx.array([[5]]), prefilled(model, prompt)) is not None and any(g[1] == 1 for g in steps.graphs)
    assert "tree" in steps.status()["passes_off"]


def test_tree_passes_need_the_kernels_and_a_plain_cache(gpu, llama, tmp_path):
    assert not target_takes_trees(Engine.load(str(llama), kernels=False).target.model)  # MLX's attention
    window = config_dir(tmp_path / "g", model_type="gemma3_text", sliding_window=8, sliding_window_pattern=2,
                        query_pre_attn_scalar=16, rope_local_base_freq=1e4)
    gemma = Engine.load(str(window), kernels="exact").target.model
    assert not tree_passes_ready(gemma, new_cache(gemma), mx.float32)  # sliding windows, another family
    model = Engine.load(str(llama), kernels="exact").target.model
    assert tree_passes_ready(model, new_cache(model), mx.float32)
    assert registry.kernel("sdpa").checks  # the model's attention self-checked, tree rows included, first


def test_a_kernel_whose_tree_rows_fail_keeps_its_other_passes(gpu, llama, monkeypatch):
    """On a device whose kernel gets tree rows wrong the self-check turns trees off: chains and plain steps keep
    the kernel, no tree pass is built, and the engine's exactness check holds no tree pass."""
    from gpu_emulation import tree_sdpa
    from mlxspec.kernels import attention
    from mlxspec.kernels.cpu import cpu_sdpa_function

    inner = tree_sdpa(cpu_sdpa_function())

    def sdpa(q, k, v, scale, causal, window=0, tree=None, **kw):  # tree rows a little off
        y = inner(q, k, v, scale, causal, window=window, tree=tree, **kw)
        return y * 1.001 if tree is not None else y

    for name in ("windows", "sinks", "lengths", "mixed", "softcaps", "isa", "trees"):
        setattr(sdpa, name, getattr(inner, name))
    monkeypatch.setattr(registry, "_loaders", dict(registry._loaders, sdpa=lambda backend: (sdpa, "wrong trees")))
    registry.reset()
    head = random_head(Engine.load(str(llama), kernels="exact").target.model, llama.parent / "h", vocab=40)
    spec = Engine.load(str(llama), drafter=f"eagle:{head}", kernels="exact")
    assert sdpa.trees is False and registry.kernel("sdpa").error is None
    assert list(spec.rows.passes) == [""] and spec.rows.holds(4)
    assert attention.attention_status()["active"]


def test_greedy_tree_rounds_keep_plain_tokens_on_an_emulated_gpu(gpu, llama, tmp_path):
    plain = Engine.load(str(llama), kernels="exact")
    head = random_head(plain.target.model, tmp_path / "head", vocab=40)
    spec = Engine.load(str(llama), drafter=f"eagle:{head}", kernels="exact")
    assert spec.rows.holds(8), spec.rows.failures()  # tree passes over chains included
    assert spec.draft_width == 3 and plain.draft_width == 1  # a GPU's default: trees, where a drafter drafts them
    assert " (a tree pass" in next(iter(spec.rows.passes.keys() - {""}))
    ids = list(range(5, 25))
    want = [t for e in plain.generate(ids, GenerateOptions(max_tokens=24)) for t in e.tokens]
    for k, width in ((2, 2), (3, 3), (4, 2)):
        events = list(spec.generate(ids, GenerateOptions(max_tokens=24, draft_length=k, draft_width=width,
                                                         adaptive=False)))
        assert [t for e in events for t in e.tokens] == want, (k, width)
        stats = events[-1].stats
        assert stats.drafted > 0 and stats.exact is True and 0 < stats.tree_rounds <= stats.rounds
        assert f"tree rounds: {stats.tree_rounds}" in stats.summary()
    assert any(g[0] == "tree" for g in spec.steps.graphs)  # tree rounds ran through compiled graphs
    adaptive = list(spec.generate(ids, GenerateOptions(max_tokens=24)))  # the default width: trees, measured
    assert [t for e in adaptive for t in e.tokens] == want and adaptive[-1].stats.exact is True
    fresh = Engine.load(str(llama), drafter=f"eagle:{head}", kernels="exact")  # measured at load: chains of up to
    k = fresh.draft_length  # k + 1 rows, and the trees rounds of up to k use (not every size up to 3 k + 1)
    assert {m for label, m in fresh.rows.results if label == ""} == set(range(2, k + 2))
    assert {m for label, m in fresh.rows.results if label} == {1 + 3 * d for d in range(1, k + 1)}
    decoder = Decoder(spec.target.model, spec.drafter, ids, GenerateOptions(max_tokens=4), draft_length=3, eos_ids=set(),
                      context_length=512, stats=Stats(), width=3)
    assert TreeRound in {type(s) for s in decoder.speculative.values()}  # the rounds above were trees
