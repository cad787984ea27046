"""Self-timing: kernel vs MLX's op per shape and row count, cached on disk per device and MLX version;
and the GPU rule that keeps the kernels only within the exact-mode budget."""

from __future__ import annotations

import json

import mlx.core as mx

from mlxspec.kernels import install, registry, timing


def test_qmm_is_timed_once_per_device_and_shown_in_status(cpu_ext, tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path))
    registry.reset()
    first = timing.time_qmm(256, 128, 32, 4, mx.float32, rows=(1, 4))
    assert set(first) == {1, 4} and all(t["kernel_us"] > 0 and t["mlx_us"] > 0 for t in first.values())
    saved = json.loads((tmp_path / "kernels" / "timings.json").read_text())
    assert list(saved) == [timing.device_key()] and len(saved[timing.device_key()]) == 2
    qmm_status = next(s for s in registry.status() if s["kernel"] == "cpu-qmm")
    assert "256x128 q4 g32 float32 M=4" in qmm_status["timings"]
    registry.reset()
    monkeypatch.setattr(timing, "time_call", lambda fn, **kw: (_ for _ in ()).throw(AssertionError("re-timed")))
    assert timing.time_qmm(256, 128, 32, 4, mx.float32, rows=(1, 4)) == first  # from the cache


def test_gpu_keeps_kernels_only_within_the_budget(tiny_llama, monkeypatch):
    from mlxspec.loading import load

    model = load(str(tiny_llama), "q4g32").model
    monkeypatch.setattr(install, "device_backend_name", lambda device=None: "cuda")  # as on a GPU
    monkeypatch.setattr(install, "use_kernels", lambda m, **kw: {"swapped": {}, "kept": {}})
    for ratio, kept in ((1.05, True), (1.5, False)):
        monkeypatch.setattr(timing, "forward_cost_ratio", lambda *a, r=ratio, **k: {"ratio": r})
        monkeypatch.setattr(install, "installed", lambda m: True)
        report = install.install_timed(model)
        assert report["timed"]["kept"] is kept and report["timed"]["budget"] == timing.EXACT_BUDGET
        assert report["timed"]["seconds"] >= 0  # what the timing itself cost the load


def test_forward_cost_ratio_measures_both_ways(tiny_llama):
    from mlxspec.loading import load

    model = load(str(tiny_llama), "q4g32").model
    calls = []
    cost = timing.forward_cost_ratio(model, lambda: calls.append("on"), lambda: calls.append("off"), context=8)
    assert calls == ["on", "off"] * 3 and cost["kernels_us"] > 0 and cost["mlx_us"] > 0


def test_forward_cost_ratio_times_the_forward_decoding_runs(tiny_llama):
    """With compiled decoding steps the timing goes through them: a fresh one after every install
    (the graph captures the installed modules), and every timed step through it."""
    from mlxspec.loading import load
    from mlxspec.step_graph import StepGraphs

    model = load(str(tiny_llama), "q4g32").model
    made = []

    def steps(m):
        made.append(StepGraphs(m))
        return made[-1]

    cost = timing.forward_cost_ratio(model, lambda: None, lambda: None, context=8, steps=steps)
    assert len(made) == 6 and all(s.graphs and s.off is None for s in made) and cost["ratio"] > 0


def test_the_engine_times_kernels_through_compiled_steps_when_decoding_uses_them(tiny_llama, monkeypatch):
    from mlxspec import engine
    from mlxspec.loading import load
    from mlxspec.step_graph import StepGraphs

    seen = []
    monkeypatch.setattr(install, "install_timed", lambda model, **kw: seen.append(kw.get("steps")) or {})
    target = load(str(tiny_llama), "q4g32")
    for compiled, want in ((True, StepGraphs), (False, None)):
        engine._use_kernels(target, None, compiled=compiled)
        assert seen[-1] is want


def test_time_call_batches_calls_into_one_evaluation(monkeypatch):
    """batch=16: every repeat builds 16 independent calls and evaluates them together (one GPU sync,
    not 16), and the time returned is per call."""
    calls, evals = [], []
    real_eval = mx.eval
    monkeypatch.setattr(mx, "eval", lambda *a: (evals.append(len(a[0])), real_eval(*a)))
    us = timing.time_call(lambda: calls.append(1) or mx.ones(4) * 2, repeats=3, warmup=1, batch=16)
    assert len(calls) == 16 * 4 and evals == [16] * 4 and us > 0


def test_ops_are_timed_in_batches_on_gpus_only(monkeypatch):
    """A GPU's per-evaluation sync is amortized over OP_BATCH calls; the CPU times one call at a time.
    The chain is part of the timing cache's key, so older one-call or batched GPU timings are not reused."""
    assert timing.op_batch() == 1 and timing.device_key().endswith("|chain1")
    monkeypatch.setattr(timing, "device_backend_name", lambda: "cuda")
    assert timing.op_batch() == timing.OP_BATCH > 1 and timing.device_key().endswith(f"|chain{timing.OP_BATCH}")


def test_latency_feeds_each_call_the_one_before(monkeypatch):
    """On a GPU every timed call takes the previous call's output (its first K columns, or it tiled up to K), so the
    device cannot overlap them: a forward's layers wait for each other too. On the CPU: one call, timed."""
    seen = []

    def fn(x):  # (1, 4) -> (1, 3): tiled back up to 4 columns for the next call
        seen.append(x.tolist())
        return x[:, :3] + 1

    x = mx.array([[0.0, 0.0, 0.0, 0.0]])
    assert timing.latency_us(fn, x, repeats=1) > 0 and seen == [x.tolist()] * 3  # CPU: warm-up twice, one repeat
    seen.clear()
    monkeypatch.setattr(timing, "device_backend_name", lambda: "cuda")
    timing.latency_us(fn, x, repeats=1)
    chain = seen[: timing.OP_BATCH]
    assert len(seen) == 3 * timing.OP_BATCH and chain[1] == [[1.0, 1.0, 1.0, 1.0]] and chain[2] == [[2.0, 2.0, 2.0, 2.0]]
    assert all(c == [[float(i)] * 4] for i, c in enumerate(chain))


def test_tensor_cores_win_a_cheaper_round_with_a_step_within_budget_of_fma_or_mlx():
    """The H200's measurements (microseconds at 1 / 8 rows): on the 4-bit head the tensor cores are as
    fast as FMA for a step and twice as fast for a verify pass; on the 6-bit head their step is 1.44x
    FMA's but within 4% of MLX's own op, so plain decoding keeps exact mode's budget either way."""
    win = timing.tensor_cores_win
    assert win({1: 171.0, 8: 392.2}, {1: 163.3, 8: 177.0}, {1: 300.5, 8: 241.5})  # 4-bit 128256 x 4096
    six_fma, six_mma, six_mlx = {1: 182.7, 8: 481.2}, {1: 263.6, 8: 298.5}, {1: 255.4, 8: 542.2}
    assert win(six_fma, six_mma, six_mlx)
    assert not win(six_fma, six_mma)  # against FMA alone: a step 1.44x dearer
    assert not win(six_fma, six_mma, {1: 200.0, 8: 542.2})  # a step 1.32x MLX's: over the budget
    assert not win({1: 19.0, 8: 26.9}, {1: 20.3, 8: 30.0}, {1: 16.5, 8: 15.8})  # a dearer round
