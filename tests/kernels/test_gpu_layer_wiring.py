"""The GPU families' wiring, checked on the CPU with stand-in kernels (no GPU here).

The GPU sources themselves run under the emulator (test_gpu_sources.py); here the registry's
self-checks for mxfp4 and for the MoE gather are held to what they must catch, and use_kernels on a
(pretended) CUDA backend swaps a gpt-oss model's mxfp4 or affine experts and projections for
kernel-backed layers that pass the right arguments: logits unchanged.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from gpu_stand_ins import grouping_gather, per_row_gather, per_row_qmm, serve
from model_factory import build_model
from mlxspec.kernels import layers, registry
from mlxspec.kernels.layers import KernelQuantizedLinear, KernelQuantizedSwitchLinear

GPT_OSS = {"model_type": "gpt_oss", "num_hidden_layers": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
           "vocab_size": 96, "hidden_size": 64, "intermediate_size": 64, "head_dim": 16, "num_attention_heads": 4,
           "num_key_value_heads": 2, "sliding_window": 8, "rope_theta": 150000,
           "layer_types": ["sliding_attention", "full_attention"]}


def test_gather_self_check_turns_grouping_off_where_it_changes_bits():
    calls = []
    assert registry.gather_self_check(grouping_gather(calls), 40, 64, 32, 4, mx.float16) is None
    assert {m for _, m in calls} == {1, 2, 4}  # plain, and grouped in two passes / one pass an expert
    drifting = grouping_gather([], drift=1e-3)  # grouping off, the gather itself kept
    assert registry.gather_self_check(drifting, 40, 64, 32, 4, mx.float16) is None
    assert drifting.groups_experts is False


def test_status_says_whether_the_gather_groups_experts(pretend_cuda, monkeypatch):
    serve(monkeypatch, {"gather-qmm": lambda: grouping_gather([], drift=1e-3)})
    assert registry.gather_for_layer(40, 64, 32, 4, mx.float16)[0] is not None  # the gather kept ...
    gather = next(s for s in registry.status() if s["kernel"] == "cuda-gather-qmm")
    assert gather["active"] and gather["groups_experts"] is False  # ... without grouping (doctor shows it)


@pytest.mark.parametrize("mode", ["affine", "mxfp4"])
def test_gather_self_check_passes_a_right_kernel_and_catches_a_wrong_one(mode):
    calls = []
    assert registry.gather_self_check(per_row_gather(calls), 40, 64, 32, 4, mx.float16, mode) is None
    assert set(calls) == {("gather", mode)}
    failure = registry.gather_self_check(per_row_gather(calls, wrong=True), 40, 64, 32, 4, mx.float16, mode)
    assert failure is not None and "tolerance" in failure


def test_mxfp4_self_check_passes_a_right_kernel_and_catches_affine_arithmetic():
    calls = []
    assert registry.self_check(per_row_qmm(calls), 40, 64, 32, 4, mx.float16, mode="mxfp4") is None
    assert set(calls) == {("qmm", "mxfp4")}

    def as_affine(x, w, scales, biases, group_size, bits, mode="affine"):  # reads the codes as affine ones
        ones = mx.ones(scales.shape, mx.float32)
        return mx.quantized_matmul(x, w, ones, mx.zeros_like(ones), transpose=True, group_size=group_size, bits=bits)

    assert "tolerance" in registry.self_check(as_affine, 40, 64, 32, 4, mx.float16, mode="mxfp4")


@pytest.mark.parametrize("mode, bits", [("affine", 4), ("mxfp4", 4), ("affine", 6), ("affine", 3)])
def test_gpu_backend_swaps_experts_and_projections_and_keeps_the_logits(pretend_cuda, mode, bits):
    """Every width MLX packs runs the GPU kernels in place (the CPU widens 3/5/6 bits to bytes)."""
    model = build_model(GPT_OSS, seed=3)
    nn.quantize(model, group_size=32, bits=bits, mode=mode)
    tokens = mx.array([[5, 17, 2, 40, 33, 9, 71, 12, 3, 60, 8]])  # past the 8-token window
    want = model(tokens)
    report = layers.use_kernels(model, gpu=True, device=mx.cpu)
    experts = [p for p, m in model.named_modules() if isinstance(m, KernelQuantizedSwitchLinear)]
    linears = [p for p, m in model.named_modules() if isinstance(m, KernelQuantizedLinear)]
    assert len(experts) == 2 * 3 and len(linears) >= 2 * 4, report["kept"]  # gate/up/down; q/k/v/o per layer
    assert all(m == mode for _, m in pretend_cuda)
    assert ("gather", mode) in pretend_cuda and ("qmm", mode) in pretend_cuda
    assert mx.allclose(model(tokens), want, atol=1e-4, rtol=1e-4).item()
    status = {s["kernel"]: s for s in registry.status()}
    assert status["cuda-gather-qmm"]["active"] and status["cuda-qmm"]["active"]


def test_experts_pass_the_rows_an_expert_can_get(pretend_cuda, monkeypatch):
    """A verify pass of T tokens tells a grouping gather that one expert gets at most T rows (each
    token takes an expert once); a one-token step, 1 (the plain gather). Logits unchanged."""
    calls = []
    serve(monkeypatch, {"gather-qmm": lambda: grouping_gather(calls)})
    model = build_model(GPT_OSS, seed=3)
    nn.quantize(model, group_size=32, bits=4)
    tokens = mx.array([[5, 17, 2, 40, 33]])
    want = model(tokens)
    layers.use_kernels(model, gpu=True, device=mx.cpu)
    calls.clear()
    assert mx.allclose(model(tokens), want, atol=1e-4, rtol=1e-4).item()
    assert {m for _, m in calls} == {5}
    calls.clear()
    model(tokens[:, :1])
    assert {m for _, m in calls} == {1}
    calls.clear()  # 32 tokens x 2 experts: mlx-lm sorts the 64 pairs (no bound per expert): 8 rows a pass
    mx.eval(model(mx.arange(32)[None]))
    assert {m for _, m in calls} == {8}


def test_the_cpu_kernels_take_mxfp4_layers_with_int8_activations_only(cpu_ext):
    """fp32 activations: kept, with the reason. int8: swapped, and every activation keeps the model's
    dtype (bfloat16 in, bfloat16 out, as MLX's op: a float32 output would turn the KV cache float32)."""
    model = build_model(GPT_OSS, seed=3)
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=32, bits=4, mode="mxfp4")
    tokens = mx.array([[5, 17, 2, 40, 33, 9]])
    want = model(tokens)
    report = layers.use_kernels(model, device=mx.cpu)
    assert not report["swapped"]
    assert all("mxfp4" in why and "cpu kernels do affine" in why for why in report["kept"].values())
    report = layers.use_kernels(model, device=mx.cpu, activations="q8")
    assert not report["kept"] and any("experts" in path for path in report["swapped"])
    got = model(tokens)
    assert got.dtype == want.dtype == mx.bfloat16
    assert (mx.abs(got - want).max() / mx.abs(want).max()).item() < 0.1  # int8 rounding of x, bfloat16 sums


def tagged_qmm(calls: list, tag: str):
    """A row-invariant stand-in that records (tag, rows) per call."""
    inner = per_row_qmm([])

    def qmm(x, w, scales, biases, group_size, bits, mode="affine"):
        calls.append((tag, x.reshape(-1, x.shape[-1]).shape[0]))
        return inner(x, w, scales, biases, group_size, bits, mode)

    return qmm


@pytest.mark.parametrize("mma_us, mlx_us, want", [
    ({1: 10.0, 8: 12.0}, 10.0, "mma"),  # one row as fast, 8 rows faster: tensor cores
    ({1: 10.9, 8: 12.0}, 10.0, "mma"),  # one row within the 10% budget, the round far cheaper
    ({1: 11.5, 8: 12.0}, 10.0, "fma"),  # faster verify, but plain decoding would pay 15%
    ({1: 11.5, 8: 12.0}, 50.0, "mma"),  # ... 15% over FMA's, but a fifth of MLX's own op
    ({1: 9.0, 8: 32.0}, 10.0, "fma"),  # a faster step, a verify pass dearer by more than it saves
    ({1: 9.5, 8: 30.2}, 10.0, "mma"),  # a dearer verify pass, but a cheaper step + verify round
])
@pytest.mark.parametrize("backend", ["cuda", "metal"])  # tensor cores; simdgroup matrices
def test_gpu_layers_take_the_matrix_unit_qmm_where_it_times_faster(monkeypatch, tmp_path, mma_us, mlx_us, want,
                                                                    backend):
    """kernel_for_layer on a GPU: the FMA and matrix-unit qmm both pass their self-checks; the faster
    (timing.prefer_tensor_cores) serves the layer; timings are cached, so the choice is made once."""
    from mlxspec.kernels import timing

    calls = []
    serve(monkeypatch, {"qmm": lambda: tagged_qmm(calls, "fma"), "qmm-mma": (lambda: tagged_qmm(calls, "mma"), "stand-in mma")})
    monkeypatch.setattr(registry, "device_backend_name", lambda device=None: backend)
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path))
    us = {"fma": {1: 10.0, 8: 30.0}, "mma": mma_us}

    def fake_time(fn, **kw):
        before = len(calls)
        fn()
        if len(calls) == before:
            return mlx_us  # MLX's op
        tag, rows = calls[-1]
        return us[tag][rows]

    monkeypatch.setattr(timing, "time_call", fake_time)
    registry.reset()
    fn, why = registry.kernel_for_layer(64, 128, 64, 4, mx.float16)
    assert fn is not None and (why.endswith("(stand-in mma)") if want == "mma" else why.endswith("(stand-in)")), why
    calls.clear()
    x = mx.ones((3, 128), mx.float16)
    w, s, b = mx.quantize(mx.ones((64, 128), mx.float16), group_size=64, bits=4)
    fn(x, w, s, b, 64, 4)
    assert calls == [(want, 3)]
    status = {st["kernel"]: st for st in registry.status()}
    assert "64x128 q4 g64 float16 M=8" in status[f"{backend}-qmm-mma"]["timings"]
    assert list(status[f"{backend}-qmm-mma"]["chosen"].values()) == [True if want == "mma" else 0]  # (no K split said)
    with monkeypatch.context() as m:  # the next layer of this shape: decided once per shape and process
        m.setattr(timing, "prefer_tensor_cores", lambda *a, **k: (_ for _ in ()).throw(AssertionError("decided again")))
        assert registry.kernel_for_layer(64, 128, 64, 4, mx.float16)[1] == why
    registry.reset()  # a new process: the choice comes from the timings on disk, not a new timing
    monkeypatch.setattr(timing, "time_call", lambda fn, **kw: (_ for _ in ()).throw(AssertionError("re-timed")))
    assert registry.kernel_for_layer(64, 128, 64, 4, mx.float16)[1] == why
    registry.reset()


def split_mma(calls: list, failing: tuple[int, ...] = ()):
    """A stand-in tensor-core qmm of 4 warps on K whose other splits are stand-ins tagged mma-k2 / mma-k8
    (those in `failing` give wrong values: they must fail their self-check)."""
    builds = {}

    def build(ksplit: int):
        if ksplit not in builds:
            qmm = tagged_qmm(calls, "mma" if ksplit == 4 else f"mma-k{ksplit}")
            if ksplit in failing:
                right = qmm
                qmm = lambda *a, **k: right(*a, **k) * 2  # noqa: E731
            qmm.ksplit, qmm.with_ksplit = ksplit, build
            builds[ksplit] = qmm
        return builds[ksplit]

    return build(4)


@pytest.mark.parametrize("k2_us, failing, want", [
    ({1: 7.0, 8: 11.0}, (), "mma-k2"),  # a cheaper round with 2 warps on K: that build serves the layer
    ({1: 9.0, 8: 12.5}, (), "mma"),  # a dearer round: the default split
    ({1: 7.0, 8: 11.0}, (2,), "fma"),  # the timed choice fails its self-check: the baseline, FMA
])
def test_the_tensor_core_qmm_s_k_split_is_timed_per_layer_shape(monkeypatch, tmp_path, k2_us, failing, want):
    """Each K split sums in its own order, so a layer shape keeps one for all its row counts: the one whose
    step + 8-row round is cheapest among those that win against FMA, self-checked before any layer uses it."""
    from mlxspec.kernels import timing

    calls = []
    serve(monkeypatch, {"qmm": lambda: tagged_qmm(calls, "fma"),
                        "qmm-mma": (lambda: split_mma(calls, failing), "stand-in mma")})
    monkeypatch.setattr(registry, "device_backend_name", lambda device=None: "cuda")
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path))
    us = {"fma": {1: 10.0, 8: 30.0}, "mma": {1: 8.0, 8: 12.0}, "mma-k2": k2_us, "mma-k8": {1: 12.0, 8: 12.0}}

    def fake_time(fn, **kw):
        before = len(calls)
        fn()
        if len(calls) == before:
            return 10.0  # MLX's op
        tag, rows = calls[-1]
        return us[tag][rows]

    monkeypatch.setattr(timing, "time_call", fake_time)
    registry.reset()
    fn, why = registry.kernel_for_layer(64, 128, 64, 4, mx.float16)
    assert ("2 warps on K" in why) == (want == "mma-k2"), why
    calls.clear()
    w, s, b = mx.quantize(mx.ones((64, 128), mx.float16), group_size=64, bits=4)
    fn(mx.ones((3, 128), mx.float16), w, s, b, 64, 4)
    assert calls == [(want, 3)]
    status = {st["kernel"]: st for st in registry.status()}["cuda-qmm-mma"]
    assert list(status["chosen"].values()) == [2 if want != "mma" else 4]
    assert {"64x128 q4 g64 float16 M=1", "64x128 q4 g64 float16 M=8 k2", "64x128 q4 g64 float16 M=8 k8"} <= set(status["timings"])
    registry.reset()


def test_tensor_cores_are_not_tried_where_they_cannot_run(pretend_cuda):
    """float32 scales (GGUF models' float32 activations), mxfp4: the FMA kernel, no timing (every affine
    width MLX packs has a tensor-core path)."""
    for bits in (4, 3):
        fn, why = registry.kernel_for_layer(64, 128, 64, bits, mx.float32)
        assert why.endswith("(stand-in)"), why
    assert registry.kernel_for_layer(64, 128, 32, 4, mx.float16, mode="mxfp4")[1].endswith("(stand-in)")
    assert "cuda-qmm-mma" not in {s["kernel"] for s in registry.status()}


def test_simdgroup_matrices_are_not_tried_where_they_cannot_run(monkeypatch):
    """Metal: mxfp4 keeps the FMA kernel, untimed (every affine width, and float32 activations, can take the
    simdgroup kernel: its matrices are float32)."""
    serve(monkeypatch, {"qmm": lambda: per_row_qmm([]), "qmm-mma": (lambda: per_row_qmm([]), "stand-in mma")})
    monkeypatch.setattr(registry, "device_backend_name", lambda device=None: "metal")
    assert registry.kernel_for_layer(64, 128, 32, 4, mx.bfloat16, mode="mxfp4")[1].endswith("(stand-in)")
    assert "metal-qmm-mma" not in {s["kernel"] for s in registry.status()}
    registry.reset()


def test_bench_gpu_forces_each_qmm_on_every_layer_and_keeps_the_timed_choice(monkeypatch):
    """bench_gpu's forward section times compiled forwards with every layer on the FMA qmm and every
    one on the tensor-core qmm (which one meets "M=8 at most 1.3x M=1"?); the timed choice stays."""
    from benchmark_scripts import load
    from mlxspec.cache import new_cache
    from mlxspec.kernels import install, timing
    from mlxspec.kernels.install import install_kernels, remove_kernels
    from mlxspec.step_graph import StepGraphs

    bench = load("bench_gpu")
    serve(monkeypatch, {"qmm": lambda: per_row_qmm([]), "qmm-mma": (lambda: per_row_qmm([]), "stand-in mma")})
    for module in (registry, layers, install, bench):
        monkeypatch.setattr(module, "device_backend_name", lambda device=None: "cuda")
    monkeypatch.setattr(timing, "prefer_tensor_cores", lambda *a, **k: True)
    with mx.stream(mx.cpu):
        model = bench.random_llama(bench.FORWARD_SHAPES["quick"])
        install_kernels(model)
        assert {k.endswith("(stand-in mma)") for k in bench.matmul_kernels(model)} == {True}
        variants = bench.forced_qmm_variants(model)
        assert set(variants) == {"compiled, FMA qmm", "compiled, tensor-core qmm"}
        for name, tensor_cores in (("compiled, FMA qmm", False), ("compiled, tensor-core qmm", True)):
            variants[name]()
            steps = StepGraphs(model)
            kinds = {k.endswith("(stand-in mma)") for k in bench.matmul_kernels(model)}
            assert kinds == {tensor_cores} and sum(bench.matmul_kernels(model).values()) == 2 * 7 + 1
            assert steps(mx.array([[1, 2]]), new_cache(model)).shape[-1] == 512  # the forward runs
        assert set(registry.kernel("qmm-mma", "cuda").chosen.values()) == {True}  # restored
        remove_kernels(model)
    registry.reset()


def test_experts_per_token_is_read_under_either_name(tmp_path):
    """gpt-oss says num_experts_per_tok; Gemma 4 (inside its multimodal wrapper) says top_k_experts."""
    from mlx_lm import load as mlx_lm_load
    from model_factory import make_gemma4_dir

    from mlxspec.kernels.layers import experts_per_token

    assert experts_per_token(build_model(GPT_OSS, seed=3)) == GPT_OSS["num_experts_per_tok"]
    gemma4, _ = mlx_lm_load(str(make_gemma4_dir(tmp_path, moe=True)))
    assert experts_per_token(gemma4) == 2
    assert experts_per_token(build_model({**GPT_OSS, "model_type": "llama", "rms_norm_eps": 1e-5}, seed=3)) == 0
