"""Compiled decoding steps (step_graph.py): eager steps' bits, on the model's own KV caches.

Checked on a tiny random llama through MLX's ops and through mlxspec's per-op CPU kernels, and on a
GGUF llama (float32 activations, float16 cache) through the kernels (the
attention kernel reads the whole cache buffer with the length that counts, RoPE the position as an
array): every logit and every cached key equals the eager path's, across a 256-position growth of
the cache, multi-row passes and rewinds; rows of a compiled pass equal compiled one-row steps; the
engine with compiled steps decodes the same tokens, speculative or plain. Where a model cannot run
this way it says why and runs eagerly.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import ArraysCache, make_prompt_cache

from mlx_lm_architectures import architecture_dir
from model_factory import config_dir, make_model_dir, make_qwen35_checkpoint
from mlxspec.bench.memory import allocated
from mlxspec.cache import HalfKVCache, KVView, WindowKVCache, layer_caches, restore, rewind, snapshot
from mlxspec.engine import Engine
from mlxspec.exactness import RowInvariance
from mlxspec.features import target_forward
from mlxspec.kernels.fused_layer import fused
from mlxspec.kernels.install import install_kernels
from mlxspec.loading import load
from mlxspec.options import GenerateOptions
from mlxspec.settings import DecodeSettings
from mlxspec.step_graph import StepGraphs, window_capacity

PREFIX = 250  # six positions short of the caches' first 256-position capacity
ON_CPU = mx.default_device() == mx.cpu  # on a GPU (device_check.sh) the GPU kernels are the ones installed
GPU_MLX_OPS = "MLX's GPU attention over a masked buffer need not give the bits of attention over the cut keys"


def exact_model(tiny_llama) -> nn.Module:
    """The tiny llama in 4 bits through the per-op kernels: exact compiled or not, on any device."""
    model = load(str(tiny_llama), "q4g32").model
    install_kernels(model, fuse=False)
    return model


@pytest.fixture(scope="module", params=["mlx-ops", "cpu-kernels", "gguf-cpu-kernels", "cpu-fused", "gguf-cpu-fused"])
def model(request, tiny_llama, tmp_path_factory):
    if request.param == "mlx-ops" and not ON_CPU:
        pytest.skip(GPU_MLX_OPS)
    if request.param.endswith("fused") and not ON_CPU:
        pytest.skip("the fused blocks are CPU kernels")
    if request.param.startswith("gguf"):  # float32 activations over a float16 cache (HalfKVCache)
        from gguf_fixtures import write_tiny_llama_gguf

        m = load(str(write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf", "Q4_0"))).model
        assert type(make_prompt_cache(m)[0]) is HalfKVCache or not ON_CPU  # a GPU's engine decides later
    else:
        m = load(str(tiny_llama), "q4g32").model
    if request.param.endswith("cpu-kernels"):
        report = install_kernels(m, fuse=False)  # the per-op kernels: what a GPU runs, here on the CPU
        assert report["attention"]["routed"] and (not ON_CPU or report["pointwise"]["swapped"]["rope"])  # (CPU kernels)
    if request.param.endswith("fused"):  # one primitive per block, the position an array inside a trace
        assert install_kernels(m)["fused"]["fused"] == len(m.model.layers)
    return m


def fused_in_traces(model) -> bool:
    """Did every fused block pass its self-check over a compiled step's cache views (so it, not the
    module path, ran inside the traces)?"""
    plans = [getattr(b, "_mlxspec_plan", None) for b in model.model.layers]
    return all(p is not None and any(key[1] is KVView and ok for key, (ok, _) in p.ok.items()) for p in plans)


def ids(n: int, seed: int = 0) -> mx.array:
    return mx.random.randint(0, 300, (1, n), key=mx.random.key(seed))


def held(c) -> tuple[mx.array, mx.array]:
    """The keys and values a cache holds (its buffers' first `offset` positions)."""
    return c.keys[..., : c.offset, :], c.values[..., : c.offset, :]


def prefilled(model) -> list:
    cache = make_prompt_cache(model)
    model(ids(PREFIX), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def run_both(model, steps: StepGraphs, eager: list, compiled: list, passes: list[int], after=lambda: None) -> None:
    """Passes (> 0: that many rows; < 0: a rewind) eagerly and through the compiled steps: the same logits."""
    for i, rows in enumerate(passes):
        if rows < 0:
            rewind(eager, -rows)
            rewind(compiled, -rows)
            continue
        x = ids(rows, seed=i + 1)
        want, got = model(x, cache=eager), steps(x, compiled)
        assert got.shape == want.shape and mx.array_equal(got, want).item(), f"pass {i} ({rows} rows) differs"
        after()


def test_compiled_steps_equal_eager_steps_through_growth_and_rewinds(model):
    eager, compiled = prefilled(model), prefilled(model)
    steps = StepGraphs(model)
    run_both(model, steps, eager, compiled, [1, 1, 1, 5, -3, 1, 1, 1, 1, 2, -2, 8, 1])
    for e, c in zip(eager, compiled):
        assert c.offset == e.offset and all(mx.array_equal(a, b).item() for a, b in zip(held(c), held(e)))
        assert (c.keys.dtype, c.values.dtype) == (e.keys.dtype, e.values.dtype)  # float16 where HalfKVCache stores it
    assert compiled[0].keys.shape[2] > 256  # grown past the first capacity
    assert steps.off is None
    assert fused_in_traces(model) == fused(model)
    assert {g[1] for g in steps.graphs} == {1, 2, 5, 8}  # one graph per row count (and capacity)


@pytest.fixture(scope="module", params=["mlx-ops", "cpu-kernels", "cpu-fused"])
def window_model(request, tmp_path_factory):
    """A random Gemma 3 text model: sliding-window layers (window 8: mlxspec's WindowKVCache) between global ones."""
    if request.param == "mlx-ops" and not ON_CPU:
        pytest.skip(GPU_MLX_OPS)
    if request.param.endswith("fused") and not ON_CPU:
        pytest.skip("the fused blocks are CPU kernels")
    path = config_dir(tmp_path_factory.mktemp("gemma3"), model_type="gemma3_text", sliding_window=8,
                      sliding_window_pattern=2, query_pre_attn_scalar=16, rope_local_base_freq=1e4, num_hidden_layers=4)
    m = load(str(path), "q4g32").model
    if request.param == "cpu-kernels":
        assert install_kernels(m, fuse=False)["attention"]["routed"]
    if request.param == "cpu-fused":  # sliding blocks in one primitive: its position and buffer row both arrays
        assert install_kernels(m)["fused"]["fused"] == len(m.model.layers)
    return m


def test_sliding_window_layers_compile_and_equal_eager_steps_through_compaction(window_model):
    """Sliding layers keep one buffer capacity in compiled steps, compacting to their window and the
    rewind slack when full: ~1,100 positions of passes and rewinds (two compactions) give eager steps' logits."""
    eager, compiled = prefilled(window_model), prefilled(window_model)
    sliding = [i for i, c in enumerate(compiled) if type(c) is WindowKVCache]
    assert sliding and len(sliding) < len(compiled)
    steps, starts = StepGraphs(window_model), set()
    run_both(window_model, steps, eager, compiled, ([1] * 3 + [5, -3, 8, -7, 2, 16, 16, 16]) * 20,  # 56 positions a round
             lambda: starts.add(compiled[sliding[0]].start))
    assert steps.off is None and {g[1] for g in steps.graphs} == {1, 2, 5, 8, 16}
    assert fused_in_traces(window_model) == fused(window_model)
    capacity = window_capacity(8)
    assert all(compiled[i].keys.shape[2] == capacity for i in sliding) and len(starts) >= 3  # compacted twice
    for e, c in zip(eager, compiled):
        assert c.offset == e.offset
        if type(c) is WindowKVCache:  # the newest positions both still keep (at least window - 1 + slack)
            keep = min(c.offset - c.start, e.offset - e.start)
            assert keep >= 8 - 1 + c.slack
            assert all(mx.array_equal(a[..., -keep:, :], b[..., -keep:, :]).item() for a, b in zip(c.state, e.state))
        else:
            assert all(mx.array_equal(a, b).item() for a, b in zip(held(c), held(e)))


def test_rows_of_a_compiled_sliding_window_pass_equal_compiled_one_row_steps(window_model):
    check = RowInvariance(window_model, forward=StepGraphs(window_model))
    assert check.holds(9) and check.failures() == {}


def test_buffers_double_as_they_fill(model):
    cache = prefilled(model)
    steps = StepGraphs(model)
    seen = []
    for _ in range(3):
        while cache[0].offset < cache[0].keys.shape[2]:  # fill it (eagerly: quicker), then one compiled step
            model(ids(min(64, cache[0].keys.shape[2] - cache[0].offset)), cache=cache)
        mx.eval(steps(ids(1), cache))
        seen.append(cache[0].keys.shape[2])
    assert seen == [512, 1024, 2048]  # three capacities for 2,048 positions: three graphs, not eight


def test_prompts_of_any_length_meet_the_same_few_capacities(model):
    """Capacities come from buckets (256, 512, 1024, ...): caches prefilled to other lengths share
    graphs, and one left off the buckets by a prefill (768 positions) is moved to the next (1024)."""
    steps, capacities = StepGraphs(model), []
    for length in (100, 180, 300, 400, 600):
        cache = make_prompt_cache(model)
        for start in range(0, length, 512):  # as cache.prefill feeds a prompt: 512 positions a chunk
            model(ids(min(512, length - start), seed=start), cache=cache)
        held = cache[0].keys.shape[2]
        mx.eval(steps(ids(1), cache))
        capacities.append((held, cache[0].keys.shape[2]))
    assert capacities == [(256, 256), (256, 256), (512, 512), (512, 512), (768, 1024)]
    assert sorted(g[2] for g in steps.graphs) == [256, 512, 1024]  # five prompts, three graphs


def test_rows_of_a_compiled_pass_equal_compiled_one_row_steps(model):
    check = RowInvariance(model, forward=StepGraphs(model))
    assert check.holds(9) and check.failures() == {}


def test_tree_passes_must_equal_compiled_steps_too(tiny_llama):
    """Tree rounds build their passes eagerly: the exactness check holds them (an eager pass stands in
    here) to the compiled one-row steps too, and says which kind of pass differs."""
    model = exact_model(tiny_llama)
    mlp = model.model.layers[0].mlp
    check = RowInvariance(model, forward=StepGraphs(model), trees=lambda x, cache: model(x, cache=cache))
    mlp.down_proj = Traced(mlp.down_proj)  # traced graphs (compiled steps) compute other bits
    assert check.holds(3)  # compiled passes alone: as the compiled one-row steps
    assert not check.holds(3, tree_rows=(2, 3)) and "a tree pass" in check.failures()[2]


class Traced(nn.Module):
    """Other bits inside a trace than outside (as a compiled graph that fused ops differently would);
    factor 2: a wrong compiled graph."""

    def __init__(self, inner: nn.Module, factor: float = 1 + 1e-3):
        super().__init__()
        self.inner, self.factor = inner, factor

    def __call__(self, x):
        y = self.inner(x)
        return y * self.factor if _tracing(y) else y


def test_each_row_count_first_compiled_pass_is_checked_against_the_eager_one(tiny_llama, caplog):
    model = exact_model(tiny_llama)
    cache, eager = prefilled(model), prefilled(model)
    steps = StepGraphs(model)
    for rows in (1, 3, 1):
        x = ids(rows, seed=rows)
        assert mx.array_equal(steps(x, cache), model(x, cache=eager)).item()
    assert steps.status()["checks"] == {"1 rows": "same bits", "3 rows": "same bits"}
    mlp = model.model.layers[0].mlp
    mlp.down_proj = Traced(mlp.down_proj)  # a little off inside traces: kept (every pass runs compiled)
    drifting = StepGraphs(model)
    drifting(ids(2), prefilled(model))
    assert drifting.off is None and drifting.status()["checks"]["2 rows"].startswith("max |diff|")
    mlp.down_proj = Traced(mlp.down_proj.inner, factor=2.0)  # a wrong compiled graph: off, eager results
    wrong = StepGraphs(model)
    cache, eager = prefilled(model), prefilled(model)
    x = ids(2, seed=5)
    assert mx.array_equal(wrong(x, cache), model(x, cache=eager)).item()
    assert wrong.off and "disagree with eager" in wrong.off and "compiled decoding steps off" in caplog.text
    assert all(mx.array_equal(a, b).item() for c, e in zip(cache, eager) for a, b in zip(held(c), held(e)))


def _tracing(a: mx.array) -> bool:
    try:
        mx.eval(a)
        return False
    except Exception:  # MLX refuses to evaluate inside a trace
        return True


def test_hidden_states_are_target_forwards(model):
    eager, compiled = prefilled(model), prefilled(model)
    x = ids(3, seed=7)
    want = target_forward(model, x, eager)
    got = StepGraphs(model)(x, compiled, hidden=True)
    assert all(mx.array_equal(a, b).item() for a, b in zip(got, want))


@pytest.mark.parametrize("blocks", ["mlx-ops", "fused"])
def test_cache_buffers_are_updated_in_place(tiny_llama, blocks):
    """The old buffers go into the graph alone, so MLX writes the step's rows into them instead of
    copying the cache every step (a copy would cost as much memory traffic as the cache itself);
    the fused CPU blocks' writes too (once the block that read the old buffer has run)."""
    if blocks == "fused" and not ON_CPU:
        pytest.skip("the fused blocks are CPU kernels")
    model = load(str(tiny_llama), "q4g32" if blocks == "fused" else None).model
    if blocks == "fused":
        install_kernels(model)
    cache = make_prompt_cache(model)
    model(ids(4000), cache=cache)
    mx.eval([c.state for c in cache])
    steps = StepGraphs(model)
    for _ in range(2):  # primed and traced
        mx.eval(steps(ids(1), cache))
    held = sum(c.keys.nbytes + c.values.nbytes for c in cache)

    def step_allocates() -> int:  # bytes one compiled step allocates
        x = ids(1)
        mx.eval(x)
        with allocated() as grew:
            mx.eval(steps(x, cache))  # as decoding evaluates a step: its logits, then (with the next step) its cache
            mx.eval([c.keys for c in cache])
        return grew["bytes"]

    assert fused_in_traces(model) == (blocks == "fused")
    grew = step_allocates()
    assert grew < held / 4, f"a compiled step allocated {grew} bytes: it copied the cache ({held} bytes)"
    elsewhere = [a for c in cache for a in (c.keys, c.values)]  # the control: buffers someone else still reads
    assert step_allocates() >= held / 4, "the measurement cannot see a copy"
    del elsewhere


class PositionOnHost(nn.Module):
    """A model that reads its cache position as a Python number (fine eagerly, impossible in a trace)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    @property
    def layers(self):
        return self.inner.layers

    def __call__(self, x, cache=None):
        if int(cache[0].offset) < 0:
            raise AssertionError("unreachable")
        return self.inner(x, cache=cache)


def test_a_model_that_cannot_be_traced_runs_eagerly_and_says_why(tiny_llama, caplog):
    inner = load(str(tiny_llama)).model
    model = PositionOnHost(inner)
    eager, compiled = prefilled(inner), prefilled(inner)
    steps = StepGraphs(model)
    for i in range(3):
        x = ids(2, seed=i)
        assert mx.array_equal(steps(x, compiled), model(x, cache=eager)).item()
    assert steps.off and "compiled decoding steps off" in caplog.text
    assert steps.status()["compiled"] is False


def test_caches_other_than_kv_caches_and_recurrent_states_run_eagerly(tmp_path):
    from mlx_lm.models.cache import QuantizedKVCache

    model = load(str(make_model_dir(tmp_path / "m", arch="llama", hidden=128, intermediate=256))).model  # head dim 32
    model.make_cache = lambda: [QuantizedKVCache(group_size=32) for _ in model.layers]  # (this instance only)
    steps = StepGraphs(model)
    assert steps.off and "QuantizedKVCache" in steps.off
    a, b = make_prompt_cache(model), make_prompt_cache(model)
    x = ids(4)
    with mx.stream(mx.cpu):  # MLX's CUDA quantized_matmul has no kernel for this cache's 32-dim float32 rows
        assert mx.array_equal(steps(x, a), model(x, cache=b)).item()


@pytest.mark.parametrize("arch", ["qwen3_next", "granitemoehybrid", "qwen3_5", "falcon_h1"])
def test_recurrent_layers_compile_and_equal_eager_steps_through_restores(tmp_path, arch):
    """Hybrid models (gated delta nets, Mamba-2; Falcon-H1's layers hold both, in mlx-lm's CacheList) with per-op
    kernels: their recurrent states are arrays of a compiled step too. Passes, and passes undone as a round undoes them (KV rows rewound, states restored
    from a snapshot), give eager steps' logits, and rows of a compiled pass equal compiled one-row steps.
    On a GPU a compiled graph fuses the recurrences' elementwise ops into kernels of its own, whose last bits
    may differ from eager ops' (seen on an H200): there the compiled passes agree with eager ones within
    float32 rounding, and with their own one-row steps bit for bit (what exactness needs)."""
    same = (lambda a, b: mx.array_equal(a, b).item()) if ON_CPU else (
        lambda a, b: mx.allclose(a, b, rtol=1e-4, atol=1e-5).item())
    if arch == "qwen3_5":
        path = make_qwen35_checkpoint(tmp_path / arch, moe=True)
    elif arch == "falcon_h1":
        path = architecture_dir(tmp_path / arch, arch)
    else:
        path = make_model_dir(tmp_path / arch, arch=arch, layers=4, seed=3)
    model = load(str(path)).model
    install_kernels(model, fuse=False)
    eager, compiled = make_prompt_cache(model), make_prompt_cache(model)
    assert any(type(c) is ArraysCache for c in layer_caches(compiled))
    for c in (eager, compiled):
        model(ids(40), cache=c)
    steps = StepGraphs(model)
    for i, (rows, undo) in enumerate([(1, 0), (3, 0), (5, 4), (1, 0), (8, 6), (2, 0), (1, 0)]):
        saved = [snapshot(eager), snapshot(compiled)]
        x = ids(rows, seed=i + 1)
        want, got = model(x, cache=eager), steps(x, compiled)
        assert same(got, want), f"pass {i} ({rows} rows) differs"
        if undo:  # as a round with rejected drafts: back to before the pass, then its kept rows again
            for c, before in zip((eager, compiled), saved):
                rewind(c, rows)
                restore(before)
            kept = x[:, : rows - undo]
            model(kept, cache=eager), steps(kept, compiled)
    assert steps.off is None and steps.graphs
    for e, c in zip(layer_caches(eager), layer_caches(compiled)):
        pairs = zip(e.cache, c.cache) if type(c) is ArraysCache else zip(held(e), held(c))
        assert all(same(a, b) for a, b in pairs)
    check = RowInvariance(model, forward=steps)
    assert check.holds(6) and check.failures() == {}


def test_disabled_steps_are_the_model_itself(model):
    eager, other = prefilled(model), prefilled(model)
    steps = StepGraphs(model, enabled=False)
    x = ids(3, seed=11)
    assert mx.array_equal(steps(x, other), model(x, cache=eager)).item() and not steps.graphs


def test_setting_is_read_once_from_the_environment():
    assert DecodeSettings.from_env({"MLXSPEC_COMPILE": "1"}).compile_steps() is True
    assert DecodeSettings.from_env({"MLXSPEC_COMPILE": "0"}).compile_steps(mx.Device(mx.gpu)) is False
    auto = DecodeSettings.from_env({})
    assert auto.compile_steps(mx.Device(mx.cpu)) is False and auto.compile_steps(mx.Device(mx.gpu)) is True


@pytest.mark.parametrize("kernels", ["ops", False])
def test_engine_with_compiled_steps_decodes_the_same_tokens(tiny_llama, monkeypatch, kernels):
    if not kernels and not ON_CPU:
        pytest.skip(GPU_MLX_OPS)
    """Plain and speculative decoding through compiled steps = plain decoding built eagerly, token for
    token (greedy), for draft lengths 1..6 with the target's own 4-bit quantization as the drafter
    (whose steps are compiled graphs too)."""
    target = str(tiny_llama)
    monkeypatch.setenv("MLXSPEC_COMPILE", "0")
    reference = Engine.load(target, kernels=kernels)
    monkeypatch.setenv("MLXSPEC_COMPILE", "1")
    plain = Engine.load(target, kernels=kernels)
    drafting = Engine.load(target, draft=target, draft_quantize="q4g32", kernels=kernels)
    assert reference.info["compiled_steps"] == "off" and plain.info["compiled_steps"] == "on"
    for prompt in ("Once upon a time", "def add(a, b):", "Hello world! How are you"):
        expected = [t for ev in reference.generate(prompt, GenerateOptions(max_tokens=40)) for t in ev.tokens]
        assert [t for ev in plain.generate(prompt, GenerateOptions(max_tokens=40)) for t in ev.tokens] == expected
        for k in range(1, 7):
            options = GenerateOptions(max_tokens=40, draft_length=k, adaptive=False)
            events = list(drafting.generate(prompt, options))
            assert [t for ev in events for t in ev.tokens] == expected, f"k={k}"
            assert events[-1].stats.exact is True
    assert plain.steps.graphs and drafting.steps.graphs and drafting.steps.off is None
    assert drafting.drafter.steps.graphs and not reference.steps.graphs  # the draft model's steps compiled too


@pytest.mark.parametrize("family", ["gemma3", "qwen3_next"])
def test_engines_of_sliding_window_and_hybrid_models_decode_the_same_tokens_compiled(tmp_path, monkeypatch, family):
    """Sliding-window (a draft model of the same kind drafting, its steps compiled too) and hybrid models
    (prompt lookup): plain and speculative decoding through compiled steps give eager plain decoding's tokens."""
    if family == "gemma3":
        path = config_dir(tmp_path / family, model_type="gemma3_text", sliding_window=8, sliding_window_pattern=2,
                          query_pre_attn_scalar=16, rope_local_base_freq=1e4, num_hidden_layers=4)
        extra = {"draft": str(path), "draft_quantize": "q4g32"}
    else:
        path, extra = make_model_dir(tmp_path / family, arch=family, layers=4, seed=3), {"drafter": "lookup"}
    monkeypatch.setenv("MLXSPEC_COMPILE", "0")
    reference = Engine.load(str(path), kernels="ops")
    monkeypatch.setenv("MLXSPEC_COMPILE", "1")
    plain, drafting = Engine.load(str(path), kernels="ops"), Engine.load(str(path), kernels="ops", **extra)
    assert plain.info["compiled_steps"] == "on" and drafting.steps.off is None
    for prompt in ("Once upon a time", "the cat and the cat and the cat and the"):
        expected = [t for ev in reference.generate(prompt, GenerateOptions(max_tokens=40)) for t in ev.tokens]
        assert [t for ev in plain.generate(prompt, GenerateOptions(max_tokens=40)) for t in ev.tokens] == expected
        for k in (1, 3, 6):
            events = list(drafting.generate(prompt, GenerateOptions(max_tokens=40, draft_length=k, adaptive=False)))
            assert [t for ev in events for t in ev.tokens] == expected, f"k={k}"
            assert events[-1].stats.exact is True
    assert plain.steps.graphs and drafting.steps.graphs


def test_compiled_steps_on_the_cpu_keep_the_fused_blocks(tiny_llama, monkeypatch):
    """MLXSPEC_COMPILE=1 on the CPU: the fused blocks run inside the compiled steps (not the per-op
    path, ~25% slower on SmolLM2), with eager decoding's tokens, plain and speculative."""
    if not ON_CPU:
        pytest.skip("the fused blocks are CPU kernels")
    target = str(tiny_llama)
    monkeypatch.setenv("MLXSPEC_COMPILE", "0")
    reference = Engine.load(target, quantize="q4g32")
    monkeypatch.setenv("MLXSPEC_COMPILE", "1")
    engine = Engine.load(target, quantize="q4g32", draft=target, draft_quantize="q4g32")
    assert fused(engine.target.model) and engine.info["compiled_steps"] == "on"
    for prompt in ("Once upon a time", "def add(a, b):"):
        expected = [t for ev in reference.generate(prompt, GenerateOptions(max_tokens=40)) for t in ev.tokens]
        for k in (0, 3):
            options = GenerateOptions(max_tokens=40, draft_length=k, adaptive=False)
            assert [t for ev in engine.generate(prompt, options) for t in ev.tokens] == expected, f"k={k}"
    assert fused_in_traces(engine.target.model) and engine.steps.graphs


def test_seeded_sampling_draws_the_same_tokens_compiled_or_not(tiny_llama, monkeypatch):
    """The same logits and the same random keys: a seeded speculative sampling run is the same run."""
    target, runs = str(tiny_llama), []
    for compiled in ("0", "1"):
        monkeypatch.setenv("MLXSPEC_COMPILE", compiled)
        engine = Engine.load(target, draft=target, draft_quantize="q4g32", kernels="ops")
        options = GenerateOptions(max_tokens=40, temperature=0.9, seed=7, draft_length=3)
        runs.append([t for ev in engine.generate("Once upon a time", options) for t in ev.tokens])
        assert bool(engine.steps.graphs) == (compiled == "1")
    assert runs[0] == runs[1] and len(runs[0]) == 40
