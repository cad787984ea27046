"""Tree verification: every node of a tree pass has the bits of a one-row step over its path, the
cache keeps the accepted path, greedy output with tree rounds is token-identical to plain decoding."""

from __future__ import annotations

import mlx.core as mx
import pytest
from click.testing import CliRunner
from mlx_lm import convert
from mlx_lm.models.cache import make_prompt_cache
from test_eagle import HELD_OUT, random_head
from test_medusa import random_heads

from mlxspec.frontend.cli import cli

from mlxspec.cache import HalfKVCache, new_cache, store_kv_in_half
from mlxspec.decode import Decoder
from mlxspec.engine import Engine
from mlxspec.kernels.fused_layer import tree_ready
from mlxspec.kernels.row_positions import tree_passes_ready
from mlxspec.options import GenerateOptions
from mlxspec.stats import Stats
from mlxspec.tree import TreeRound, keep_path, path_to, tree_forward
from mlxspec.verify import ancestry, tree_greedy_accept

TREES = {  # parents per row; row 0 is the last context token
    "chain": [-1, 0, 1, 2],
    "siblings": [-1, 0, 0, 0, 1, 1, 4],
    "bushy": [-1, 0, 0, 1, 1, 2, 3, 3, 6, 2],
}


@pytest.fixture(scope="module")
def q4(tiny_llama, tiny_qwen2, tmp_path_factory):
    """4-bit copies of the tiny models: the fused CPU kernel (the tree pass) runs quantized blocks."""
    out = {}
    for arch, src in (("llama", tiny_llama), ("qwen2", tiny_qwen2)):
        out[arch] = tmp_path_factory.mktemp(f"q4-{arch}") / "model"
        convert(str(src), mlx_path=str(out[arch]), quantize=True, q_group_size=32, q_bits=4)
    return out


@pytest.fixture(scope="module")
def head(q4, tmp_path_factory):
    """An EAGLE head trained by `mlxspec train-drafter` for the 4-bit tiny llama."""
    home = tmp_path_factory.mktemp("tree-home")
    args = ["train-drafter", str(q4["llama"]), "--kind", "eagle", "--tokens", "1200", "--epochs", "6",
            "--max-answer", "48", "--out", "tiny"]
    result = CliRunner().invoke(cli, args, env={"MLXSPEC_HOME": str(home)})
    assert result.exit_code == 0, result.output
    return home / "drafters" / "tiny.safetensors"


@pytest.fixture(scope="module")
def medusa_heads(q4, tmp_path_factory):
    """Medusa heads trained by `mlxspec train-drafter` for the 4-bit tiny llama."""
    home = tmp_path_factory.mktemp("medusa-tree-home")
    args = ["train-drafter", str(q4["llama"]), "--kind", "medusa", "--tokens", "1200", "--heads", "3", "--epochs", "3",
            "--max-answer", "48", "--out", "tiny"]
    result = CliRunner().invoke(cli, args, env={"MLXSPEC_HOME": str(home)})
    assert result.exit_code == 0, result.output
    return home / "drafters" / "tiny.safetensors"


@pytest.fixture(scope="module", params=["llama", "qwen2", "llama-half-cache", "qwen3-gguf"])
def engine(request, q4, tmp_path_factory):
    """The 4-bit tiny models; "half-cache": float32 keys and values stored as float16 (GGUF models'
    default); a qwen3 GGUF (per-head q/k norms in the fused block, a half cache)."""
    arch, _, half = request.param.partition("-")
    if arch == "qwen3":
        from gguf_fixtures import Dims, write_tiny_llama_gguf

        path = write_tiny_llama_gguf(tmp_path_factory.mktemp("qwen3") / "tiny.gguf", "Q4_0", arch="qwen3",
                                     dims=Dims(head_dim=32))
        e = Engine.load(str(path))
    else:
        e = Engine.load(str(q4[arch]))
    if half == "half-cache":
        store_kv_in_half(e.target.model)
    cache = new_cache(e.target.model)[0]
    assert isinstance(cache, HalfKVCache) == bool(half)  # GGUF models get it at load
    assert tree_ready(e.target.model, mx.float32, cache) or tree_passes_ready(e.target.model, new_cache(e.target.model), mx.float32), e.kernels  # CPU, GPU
    return e


def prefilled(model, prompt: list[int]) -> list:
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array(prompt)[None], cache=cache))
    return cache


@pytest.mark.parametrize("shape", TREES)
def test_every_node_equals_a_one_row_step_over_its_path(engine, shape):
    model, parents = engine.target.model, TREES[shape]
    prompt = engine.encode("Once upon a time there was")
    nodes = [prompt[-1]] + [(7 * m + 3) % 200 + 5 for m in range(1, len(parents))]
    cache = prefilled(model, prompt[:-1])
    logits, hidden = tree_forward(model, mx.array(nodes, dtype=mx.uint32), cache, parents, hidden=True)
    mx.eval(logits, hidden)
    for m in range(len(parents)):
        path = path_to(parents, m)
        step_cache = prefilled(model, prompt[:-1])
        for node in path:  # plain decoding steps, one row each, along the path
            want = model(mx.array([[nodes[node]]]), cache=step_cache)[0, -1]
        assert mx.array_equal(logits[m], want).item(), (shape, m, path)


def test_the_cache_keeps_the_accepted_path_in_order(engine):
    model, parents = engine.target.model, TREES["bushy"]
    prompt = engine.encode("The little fox")
    nodes = [prompt[-1]] + [(11 * m + 2) % 200 + 5 for m in range(1, len(parents))]
    for node in (8, 5, 3):  # paths through siblings, not the first branch
        cache = prefilled(model, prompt[:-1])
        start = cache[0].offset
        mx.eval(tree_forward(model, mx.array(nodes, dtype=mx.uint32), cache, parents, hidden=False)[0])
        path = path_to(parents, node)
        keep_path(cache, start, path)
        want = prefilled(model, prompt[:-1] + [nodes[m] for m in path])
        for got, ref in zip(cache, want):
            assert got.offset == ref.offset and got.keys.dtype == ref.keys.dtype
            assert mx.array_equal(got.keys[..., : got.offset, :], ref.keys[..., : ref.offset, :]).item()
            assert mx.array_equal(got.values[..., : got.offset, :], ref.values[..., : ref.offset, :]).item()


def test_tree_acceptance_keeps_the_deepest_agreeing_path():
    parents = [-1, 0, 0, 1, 1, 2]  # drafts (nodes 1..5): a, b under the root; c, d under a; e under b
    V = 10
    best = [2, 5, 7, 1, 1, 4]  # the target's argmax at each node
    logits = mx.eye(V)[mx.array(best)]
    assert ancestry(parents)[4] == [True, True, False, False, True, False]
    cases = {  # drafts -> (deepest kept node, next token)
        (2, 3, 9, 5, 0): (4, 1),  # a == best[0], d == best[a]
        (3, 2, 9, 9, 7): (5, 4),  # a misses, its sibling b is kept, then e == best[b]
        (3, 4, 9, 9, 9): (0, 2),  # nothing kept: the target's own token
        (2, 3, 5, 9, 9): (3, 1),  # c kept (d is c's sibling)
    }
    for drafts, want in cases.items():
        node, nxt = tree_greedy_accept(logits, mx.array(drafts), parents)
        assert (node.item(), nxt.item()) == want, drafts


def trees_match_plain(plain: Engine, spec: Engine, cases) -> int:
    """Greedy output of `spec` with each (k, width, adaptive) equals plain's; returns drafts made."""
    drafted = 0
    for text in ["Tell a story about a fox.", HELD_OUT[0], "def add(a, b):"]:
        ids = plain.encode(text)
        want = [t for e in plain.generate(ids, GenerateOptions(max_tokens=40)) for t in e.tokens]
        for k, width, adaptive in cases:
            opts = GenerateOptions(max_tokens=40, draft_length=k, draft_width=width, adaptive=adaptive)
            events = list(spec.generate(ids, opts))
            assert [t for e in events for t in e.tokens] == want, (text, k, width, adaptive)
            drafted += events[-1].stats.drafted
    return drafted


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_tree_rounds_are_token_identical_to_plain(arch, q4, head, tmp_path):
    ref = str(q4[arch])
    plain = Engine.load(ref)
    path = head if arch == "llama" else random_head(plain.target.model, tmp_path / "q", vocab=40)
    spec = Engine.load(ref, drafter=f"eagle:{path}")
    cases = ((1, 2, False), (3, 2, False), (4, 3, False), (6, 4, False), (4, 3, True))
    assert trees_match_plain(plain, spec, cases) > 0


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_medusa_trees_are_token_identical_to_plain(arch, q4, medusa_heads, tmp_path):
    ref = str(q4[arch])
    plain = Engine.load(ref)
    model = plain.target.model
    path = medusa_heads if arch == "llama" else random_heads(model, model.args.hidden_size, 3, tmp_path / "m")
    spec = Engine.load(ref, drafter=f"medusa:{path}")
    assert trees_match_plain(plain, spec, ((1, 2, False), (3, 3, False), (5, 2, False), (3, 4, True))) > 0


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_trees_keep_more_than_chains_with_a_trained_head(q4, head, medusa_heads, kind):
    spec = Engine.load(str(q4["llama"]), drafter=f"{kind}:{head if kind == 'eagle' else medusa_heads}")
    kept = {}
    for width in (1, 3):
        tokens = passes = 0
        for text in HELD_OUT:
            ids = spec.chat_prompt([{"role": "user", "content": text}])
            *_, last = spec.generate(ids, GenerateOptions(max_tokens=40, draft_length=3, draft_width=width, adaptive=False))
            tokens, passes = tokens + last.stats.generated_tokens, passes + last.stats.rounds
        kept[width] = tokens / passes
    assert kept[3] > kept[1], kept  # the runners-up are kept where the favourite misses


def test_trees_apply_only_where_they_stay_exact(q4, head):
    def strategy(engine, **options):
        ids = engine.encode("Once upon a time")
        decoder = Decoder(engine.target.model, engine.drafter, ids, GenerateOptions(max_tokens=4, **options),
                          draft_length=3, eos_ids=set(), context_length=512, stats=Stats(), width=3)
        return {type(s) for s in decoder.speculative.values()}

    spec = Engine.load(str(q4["llama"]), drafter=f"eagle:{head}")
    assert spec.draft_width == 1  # on the CPU chains unless asked (a row costs ~16% of a step here)
    assert TreeRound in strategy(spec)
    assert TreeRound not in strategy(spec, temperature=0.8)  # sampling: the chain's rejection sampling
    assert TreeRound not in strategy(spec, repeat_penalty=1.2)  # a penalty reads the drafts as one history
    no_kernels = Engine.load(str(q4["llama"]), drafter=f"eagle:{head}", kernels=False)
    assert TreeRound not in strategy(no_kernels)  # MLX's own ops have no tree mask with one-row bits
    ids = no_kernels.encode("Once upon a time")
    opts = GenerateOptions(max_tokens=24, draft_length=3, draft_width=3)
    want = [t for e in Engine.load(str(q4["llama"]), kernels=False).generate(ids, GenerateOptions(max_tokens=24)) for t in e.tokens]
    events = list(no_kernels.generate(ids, opts))
    assert [t for e in events for t in e.tokens] == want
    assert events[-1].stats.trees.startswith("chains: this model's passes take no trees")  # asked for, said why


def test_a_request_that_asks_for_trees_and_runs_chains_says_why(q4, head):
    spec = Engine.load(str(q4["llama"]), drafter=f"eagle:{head}")
    lookup = Engine.load(str(q4["llama"]), drafter="lookup")
    text, width = "Once upon a time, once upon a time", dict(max_tokens=12, draft_length=3, draft_width=3)

    def trees(engine, **options):
        return list(engine.generate(text, GenerateOptions(**options)))[-1].stats

    assert trees(lookup, **width).trees == "chains: the lookup drafter drafts chains"
    assert trees(spec, logprobs=2, **width).trees == "chains: logprobs (chains report them)"
    ran = trees(spec, adaptive=False, **width)
    assert ran.tree_rounds > 0 and ran.trees is None
    assert trees(lookup, max_tokens=12, draft_length=3).trees is None  # not asked for: nothing to say


def test_requests_use_the_engine_s_load_time_answer_on_trees(q4, head, monkeypatch):
    """Whether the target takes tree passes is asked once, at load (it builds caches and may run a kernel check):
    a request's tree rounds run on that answer."""
    import mlxspec.tree

    spec = Engine.load(str(q4["llama"]), drafter=f"eagle:{head}")
    assert spec.takes_trees

    def asked(_target):
        raise AssertionError("target_takes_trees asked again for a request")

    monkeypatch.setattr(mlxspec.tree, "target_takes_trees", asked)
    events = list(spec.generate("Once upon a time", GenerateOptions(max_tokens=12, draft_length=3, draft_width=3, adaptive=False)))
    assert events[-1].stats.tree_rounds > 0


def test_the_exactness_check_builds_tree_passes_only_where_tree_rounds_run(q4, head, monkeypatch):
    """Tree rounds build their passes eagerly, chains run the compiled steps: the engine holds tree passes (over
    chains) to the compiled one-row steps only where tree rounds can run (a drafter of trees over a target whose
    every block is fused on the CPU, or a GPU's: tests/kernels/test_row_positions.py). Elsewhere (a GPU, where a
    compiled graph may fuse elementwise ops into other last bits than eager ops give: an H200) no such pass
    runs, and none may mark speculation inexact."""
    monkeypatch.setenv("MLXSPEC_COMPILE", "1")
    trees = Engine.load(str(q4["llama"]), drafter=f"eagle:{head}")
    chains = Engine.load(str(q4["llama"]), drafter="lookup")
    unfused = Engine.load(str(q4["llama"]), drafter=f"eagle:{head}", kernels="ops")  # the per-op kernels
    assert all(e.steps.off is None for e in (trees, chains, unfused))
    assert sorted(trees.rows.passes) == ["", " (a tree pass, as tree rounds build it)"]
    assert list(chains.rows.passes) == [""] and list(unfused.rows.passes) == [""]


def test_draft_width_reaches_the_engine_and_bad_values_are_one_line_errors(q4, head, tmp_path):
    env = {"MLXSPEC_HOME": str(tmp_path)}
    args = ["generate", str(q4["llama"]), "Once upon a time", "-n", "12", "--drafter", f"eagle:{head}", "--draft-length", "3"]
    wide = CliRunner().invoke(cli, args + ["--draft-width", "3"], env=env)
    narrow = CliRunner().invoke(cli, args + ["--draft-width", "1"], env=env)
    assert wide.exit_code == 0 and narrow.exit_code == 0, wide.output + narrow.output
    assert wide.output.splitlines()[0] == narrow.output.splitlines()[0]  # the same text
    bad = CliRunner().invoke(cli, args + ["--draft-width", "9"], env=env)
    assert bad.exit_code != 0 and "draft_width" in bad.output and "Traceback" not in bad.output
