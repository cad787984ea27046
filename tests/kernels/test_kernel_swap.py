"""use_kernels on real (tiny) 4-bit models: what is swapped, greedy exactness with kernels on, fallbacks.

Exactness with kernels on (the matmul kernel, then also the attention kernel): the engine's plain
decoding equals a one-token-at-a-time loop, and speculative decoding (a model drafter that agrees,
one that often disagrees) equals plain decoding.
"""

from __future__ import annotations

import logging

import mlx.core as mx
import mlx.nn as nn
import pytest

from mlxspec.engine import Engine
from mlxspec.kernels import KernelQuantizedEmbedding, KernelQuantizedLinear, attention, registry, use_kernels
from mlxspec.kernels.build import KernelUnavailable
from mlxspec.options import GenerateOptions

PROMPTS = ["Once upon a time", "def add(a, b):", "The quick brown fox"]


@pytest.fixture(scope="module", autouse=True)
def on_cpu():
    """These are CPU-kernel tests: the CPU device, whatever MLX's default is."""
    default = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield
    mx.set_default_device(default)


@pytest.fixture(autouse=True)
def fresh_registry():
    registry.reset()
    yield
    registry.reset()


def quantized_layers(model, cls=nn.QuantizedLinear):
    return {p for p, m in model.named_modules() if isinstance(m, cls)}


def generate(engine: Engine, prompt: str, **options) -> list[int]:
    opts = GenerateOptions(max_tokens=32, adaptive=False, **options)
    return [t for ev in engine.generate(prompt, opts) for t in ev.tokens]


def one_token_loop(engine: Engine, prompt: str, n: int = 32) -> list[int]:
    """Greedy decoding by hand: prefill, then one token per forward pass."""
    from mlx_lm.models.cache import make_prompt_cache

    model, ids = engine.target.model, engine.encode(prompt)
    cache = make_prompt_cache(model)
    model(mx.array(ids[:-1])[None], cache=cache)
    out, last = [], ids[-1]
    for _ in range(n):
        last = int(mx.argmax(model(mx.array([[last]]), cache=cache)[0, -1]).item())
        if last in engine.tokenizer.eos_token_ids:
            break
        out.append(last)
    return out


@pytest.fixture(scope="module", params=["qmm", "qmm+attention"])
def engines(request, tiny_llama, tiny_llama_other, cpu_ext_module):
    """Engines on a 4-bit target, all with kernels on: plain, and drafting with the target itself
    (accepts all), its 8-bit g64 quantization (accepts some) and other weights (accepts ~none)."""
    registry.reset()
    target = str(tiny_llama)
    plain = Engine.load(target, quantize="q4g32", kernels=False)
    same = Engine.load(target, quantize="q4g32", draft=target, draft_quantize="q4g32", kernels=False)
    near = Engine.load(target, quantize="q4g32", draft=target, draft_quantize="q8g64", kernels=False)
    other = Engine.load(target, quantize="q4g32", draft=str(tiny_llama_other), draft_quantize="q4g32", kernels=False)
    for engine in (plain, same, near, other):
        for model in {id(m): m for m in (engine.target.model, engine.draft and engine.draft.model) if m}.values():
            report = use_kernels(model)
            assert report["swapped"] and not report["kept"], report
            if request.param == "qmm+attention":
                assert attention.use_attention_kernel(model)["routed"]
    return plain, same, near, other


def test_swaps_every_quantized_linear_and_keeps_the_logits(tiny_llama, cpu_ext):
    from mlxspec.loading import load

    model = load(str(tiny_llama), "q4g32").model
    linear = quantized_layers(model)
    x = mx.array([[5, 17, 42, 7]])
    before = model(x)
    report = use_kernels(model)
    assert set(report["swapped"]) == linear and report["backend"] == "cpu"
    assert quantized_layers(model, KernelQuantizedLinear) == linear
    assert not quantized_layers(model, KernelQuantizedEmbedding)  # untied model: the embedding stays MLX's
    assert mx.allclose(model(x), before, atol=1e-4, rtol=1e-4).item()
    assert use_kernels(model)["swapped"] == {}  # a second call changes nothing


def test_tied_head_goes_through_the_kernel_and_lookups_do_not(tiny_qwen2, cpu_ext):
    from mlxspec.loading import load

    model = load(str(tiny_qwen2), "q4g32").model
    embed = model.model.embed_tokens
    ids = mx.array([[3, 9, 27]])
    rows, logits = embed(ids), model(ids)
    use_kernels(model)
    assert isinstance(model.model.embed_tokens, KernelQuantizedEmbedding)
    assert mx.array_equal(model.model.embed_tokens(ids), rows).item()
    assert mx.allclose(model(ids), logits, atol=1e-4, rtol=1e-4).item()


@pytest.mark.parametrize("bits", [3, 5, 6])
def test_other_widths_are_widened_to_bytes_with_the_same_weights(tiny_qwen2, cpu_ext, bits):
    """2/3/5/6-bit layers (GGUF Q5_*, requantized Q3_K) get their codes re-packed one per byte: the
    dequantized weights are identical, the kernel runs them (the tied head too), and blocks fuse."""
    from mlxspec.kernels.install import install_kernels
    from mlxspec.loading import load

    model = load(str(tiny_qwen2)).model
    nn.quantize(model, group_size=32, bits=bits)  # as a GGUF Q5_0 or a requantized Q3_K/Q6_K loads
    layers = {p: m for p, m in model.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))}
    weights = {p: mx.dequantize(m["weight"], m["scales"], m["biases"], group_size=32, bits=bits) for p, m in layers.items()}
    ids = mx.array([[3, 9, 27, 4]])
    before = model(ids)
    report = use_kernels(model)
    assert set(report["widened"]) == set(layers) and not report["kept"], report
    assert set(report["swapped"]) == set(layers)  # the tied head included
    for path, m in model.named_modules():
        if path in weights:
            assert m.bits == 8 and mx.array_equal(
                mx.dequantize(m["weight"], m["scales"], m["biases"], group_size=32, bits=8), weights[path]).item()
    assert mx.allclose(model(ids), before, atol=1e-4, rtol=1e-4).item()
    assert install_kernels(model)["fused"]["fused"] == len(model.model.layers)


def test_plain_decoding_equals_one_token_loop(engines):
    plain = engines[0]
    for prompt in PROMPTS:
        assert generate(plain, prompt, draft_length=0) == one_token_loop(plain, prompt)


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_speculative_equals_plain(engines, k):
    plain, *drafting = engines
    for prompt in PROMPTS:
        expected = generate(plain, prompt, draft_length=0)
        for engine in drafting:
            assert generate(engine, prompt, draft_length=k) == expected


def test_unavailable_kernel_warns_once_and_keeps_mlx(tiny_llama, monkeypatch, caplog):
    from mlxspec.loading import load

    def no_compiler(name):
        raise KernelUnavailable("cannot build the CPU kernel: a C++ compiler not found")

    monkeypatch.setitem(registry._loaders, "qmm", no_compiler)
    with caplog.at_level(logging.WARNING, logger="mlxspec.kernels"):
        reports = [use_kernels(load(str(tiny_llama), "q4g32").model) for _ in range(2)]
    assert all(not r["swapped"] and r["kept"] for r in reports)
    assert all("compiler not found" in why for why in reports[0]["kept"].values())
    assert len([r for r in caplog.records if "compiler not found" in r.getMessage()]) == 1
    assert registry.status()[0]["active"] is False


def test_wrong_kernel_fails_self_check_and_is_not_used(tiny_llama, monkeypatch, caplog):
    from mlxspec.loading import load

    def wrong(x, w, scales, biases, group_size, bits):
        return mx.zeros((*x.shape[:-1], w.shape[0]), x.dtype)

    monkeypatch.setitem(registry._loaders, "qmm", lambda name: (wrong, "broken"))
    model = load(str(tiny_llama), "q4g32").model
    with caplog.at_level(logging.WARNING, logger="mlxspec.kernels"):
        report = use_kernels(model)
    assert not report["swapped"] and all("self-check" in why for why in report["kept"].values())
    assert not quantized_layers(model, KernelQuantizedLinear)
    assert any("self-check" in r.getMessage() for r in caplog.records)


def test_disabled_by_environment_at_engine_load(tiny_llama, monkeypatch):
    from mlxspec.kernels import installed

    monkeypatch.setenv("MLXSPEC_KERNELS", "0")
    engine = Engine.load(str(tiny_llama), quantize="q4g32")
    assert engine.kernels == {"disabled": "kernels off"} and not installed(engine.target.model)
    monkeypatch.setenv("MLXSPEC_KERNELS", "1")
    assert installed(Engine.load(str(tiny_llama), quantize="q4g32").target.model)


def test_exact_setting_keeps_the_kernels_without_the_cost_gate(tiny_llama, monkeypatch):
    """kernels='exact' (MLXSPEC_KERNELS=exact): the kernels stay whatever a timing would say (on a
    GPU install_timed may drop them for costing > 10%); unknown settings are refused."""
    import mlxspec.kernels.install as install
    from mlxspec.errors import MlxspecError
    from mlxspec.kernels import installed

    def no_timing(*args, **kwargs):
        raise AssertionError("exact mode must not time the kernels")

    monkeypatch.setattr(install, "install_timed", no_timing)
    monkeypatch.setenv("MLXSPEC_KERNELS", "exact")
    engine = Engine.load(str(tiny_llama), quantize="q4g32")
    assert installed(engine.target.model) and engine.kernels["target"]["timed"] == "not timed: kernels='exact'"
    assert engine.rows.holds(5)  # verify rows equal one-row steps with the kernels kept
    with pytest.raises(MlxspecError, match="unknown kernels setting"):
        Engine.load(str(tiny_llama), quantize="q4g32", kernels="fast")
    monkeypatch.setenv("MLXSPEC_KERNELS", "bogus")  # not silently "on"
    with pytest.raises(MlxspecError, match="MLXSPEC_KERNELS='bogus': use 1"):
        Engine.load(str(tiny_llama), quantize="q4g32")


def test_unquantized_model_has_nothing_to_swap(tiny_llama):
    from mlxspec.loading import load

    report = use_kernels(load(str(tiny_llama)).model)
    assert report["swapped"] == {} and report["kept"] == {}


def test_gpu_kernels_are_opt_in_and_fall_back_without_a_gpu(tiny_llama, caplog):
    from mlxspec.loading import load

    model = load(str(tiny_llama), "q4g32").model
    report = use_kernels(model, device=mx.gpu)
    assert not report["swapped"] and all("opt-in" in why for why in report["kept"].values())
    if mx.metal.is_available() or (hasattr(mx, "cuda") and mx.cuda.is_available()):
        pytest.skip("a real GPU is present: its kernel would be checked and may be used")
    with caplog.at_level(logging.WARNING, logger="mlxspec.kernels"):
        report = use_kernels(model, device=mx.gpu, gpu=True)
    assert not report["swapped"] and all("unavailable" in why for why in report["kept"].values())
    assert len([r for r in caplog.records if "unavailable" in r.getMessage()]) == 1


def test_a_q8_0_tied_head_reads_exact_half_copies_of_its_scales(tmp_path, cpu_ext):
    """A GGUF Q8_0 token table keeps float32 scales and biases (lookups return float32); the head
    reads float16 copies holding the same values: half the bytes, the same logits."""
    from gguf_fixtures import write_tiny_llama_gguf
    from mlx_lm.models.cache import make_prompt_cache

    from mlxspec.loading import load

    model = load(str(write_tiny_llama_gguf(tmp_path / "t.gguf", "Q4_0", embed_qtype="Q8_0"))).model
    use_kernels(model, device=mx.cpu)
    table = model.model.embed_tokens
    assert isinstance(table, KernelQuantizedEmbedding) and table["scales"].dtype == mx.float32
    assert table._params is not None and table._params[0].dtype == mx.float16
    assert "_params" not in table.parameters()  # not saved, not counted as a parameter
    ids = mx.array([[1, 5, 9, 17, 33]])
    with_half = model(ids, cache=make_prompt_cache(model))
    object.__setattr__(table, "_params", None)
    assert mx.array_equal(with_half, model(ids, cache=make_prompt_cache(model))).item()
