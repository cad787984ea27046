"""Model references: directories, GGUF files, pypi: files, repo ids (offline), quantize on load."""

from __future__ import annotations

import os
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from gguf_fixtures import Dims, write_tiny_llama_gguf
from test_decode_greedy import run

from mlxspec.engine import Engine
from mlxspec.errors import MlxspecError, ModelLoadError
from mlxspec.loading import load, parse_quantize


def quantized_layers(model) -> dict[str, tuple[int, int]]:
    return {p: (m.bits, m.group_size) for p, m in model.named_modules() if isinstance(m, nn.QuantizedLinear)}


def test_directory_loads_with_info(tiny_llama):
    m = load(str(tiny_llama))
    assert m.info["architecture"] == "llama" and m.info["num_layers"] == 2
    assert m.info["parameters"] > 100_000 and m.info["quantization"] == "float32"
    assert quantized_layers(m.model) == {}


def test_a_wrapped_model_s_info_reads_its_text_config(tmp_path):
    """Gemma 3, Llama 4, Qwen3.5... keep their sizes under text_config: the context length was the 2048 fallback
    (prompts past it refused), the layers and width None."""
    from mlx_lm_architectures import architecture_dir

    from mlxspec.engine import Engine

    engine = Engine.load(str(architecture_dir(tmp_path, "gemma3")))
    assert engine.context_length == 1024  # the table's max_position_embeddings, under text_config
    assert (engine.target.info["num_layers"], engine.target.info["hidden_size"]) == (2, 64)
    assert engine.target.info["architecture"] == "gemma3"


@pytest.mark.parametrize("spec,bits,group", [("q4", 4, 64), ("q4g32", 4, 32), ("q4g64", 4, 64), ("q8", 8, 64),
                                             ("q5_K_M", 5, 32)])
def test_quantize_on_load(tiny_llama, spec, bits, group):
    m = load(str(tiny_llama), quantize=spec)
    layers = quantized_layers(m.model)
    assert len(layers) == 2 * 7 + 1  # q k v o gate up down per layer, and the head
    assert set(layers.values()) == {(bits, group)}
    assert m.info["quantization"] == f"q{bits}g{group}"
    assert m.info["weight_bytes"] < load(str(tiny_llama)).info["weight_bytes"]


def test_bad_quantization_spec():
    assert parse_quantize(None) is None and parse_quantize("q4") == (4, 64)
    # Ollama's names (`ollama create -q q4_K_M`): the nearest MLX layout, groups of 32 as their blocks
    assert parse_quantize("q4_K_M") == (4, 32) and parse_quantize("Q8_0") == (8, 32) and parse_quantize("q6_K") == (6, 32)
    assert parse_quantize("q5") == (5, 64) and parse_quantize("q5_0") == (5, 32)  # MLX quantizes 5 bits too
    for bad in ("q7", "q4g48", "int4", "4", "q5_K_X", "iq4_xs"):
        with pytest.raises(ModelLoadError, match="unknown quantization"):
            parse_quantize(bad)


def test_missing_path_and_package(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load(str(tmp_path / "nothing-here"))
    with pytest.raises(ModelLoadError, match="not installed"):
        load("pypi:no_such_package_xyz/model.gguf")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="neither a model directory"):
        load(str(tmp_path / "empty"))


def test_repo_id_offline_is_a_clear_error_naming_the_repo(tmp_path):
    """A fresh process with an empty hub cache and no hub: one clear error, no traceback."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    code = (
        "from mlxspec.loading import load\n"
        "from mlxspec.errors import ModelLoadError\n"
        "try:\n    load('mlx-community/NoSuchModel-4bit')\n"
        "except ModelLoadError as e:\n    print('ERROR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "ERROR" in out.stdout and "mlx-community/NoSuchModel-4bit" in out.stdout, out.stderr
    assert "Traceback" not in out.stderr


K_QUANTS = dict(qtype="Q4_K", dims=Dims(hidden=256, ffn=512), output_qtype="Q6_K",
                type_overrides={"blk.0.attn_v.weight": "Q5_K", "blk.1.ffn_gate.weight": "Q3_K",
                                "blk.1.ffn_up.weight": "Q5_0"})
LLAMA3 = dict(qtype="Q4_0", metadata={"rope.freq_base": 500000.0},
              extra_tensors={"rope_freqs.weight": np.linspace(1.0, 8.0, 8).astype(np.float32)})
ON_CPU = mx.default_device() == mx.cpu  # the suite also runs on a GPU device (issue 10)
QWEN3 = dict(qtype="Q4_0", arch="qwen3", dims=Dims(head_dim=32), metadata={"rope.freq_base": 1000000.0})
GEMMA3 = dict(qtype="Q8_0", arch="gemma3", tokenizer="llama", dims=Dims(layers=6, head_dim=32),
              metadata={"attention.sliding_window": 4})


@pytest.mark.parametrize("kind", ["Q4_0", "k-quants", "gemma3", "llama3", "qwen3"])
def test_gguf_file_through_the_engine(tmp_path, kind):
    """Speculation stays exact on GGUF models of every kind (4/5/8/3-bit layers, float32 scales,
    gemma3's sliding-window cache; Llama 3's rope_freqs scaling, qwen3's head norms and gemma3's blocks
    on the fused CPU blocks)."""
    args = {"Q4_0": dict(qtype="Q4_0"), "k-quants": K_QUANTS, "gemma3": GEMMA3, "llama3": LLAMA3, "qwen3": QWEN3}[kind]
    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", **args)
    plain = Engine.load(str(path))
    assert plain.info["quantization"] == {"k-quants": "q4g32", "gemma3": "q8g32"}.get(kind, "q4g32")
    if ON_CPU:  # the CPU's fused blocks and widened codes; a GPU runs the per-op kernels on the codes as stored
        fused = plain.kernels["target"]["fused"]  # every block fuses (gemma3's sliding ones too); the 3/5-bit
        assert fused["fused"] == len(plain.target.model.model.layers) and not fused["kept"], fused  # k-quants widened
        assert bool(plain.kernels["target"]["layers"]["widened"]) == (kind == "k-quants")
        loaded = load(str(path)).info["weight_bytes"]  # as stored; the engine reports what it holds
        assert (plain.info["weight_bytes"] > loaded) == (kind == "k-quants")
        assert plain.info["kv_cache_type"] == "f16"  # float32 keys and values kept as float16, as llama.cpp
    lookup = Engine.load(str(path), drafter="lookup")
    prompt = "the world and the world and the"
    tokens, _, last = run(lookup, prompt, max_tokens=30, draft_length=3)
    assert tokens == run(plain, prompt, max_tokens=30)[0]
    assert last.stats.drafted > 0  # verify forwards of several rows did run


@pytest.mark.parametrize("activations", ["q8", "f32"])
def test_activations_of_gguf_engines_keep_speculation_exact(tmp_path, activations, monkeypatch):
    """Int8 activations (llama.cpp's arithmetic) or fp32 ones: every block fuses, the engine says
    which it runs, and lookup drafting gives plain decoding's tokens either way."""
    path = str(write_tiny_llama_gguf(tmp_path / "tiny.gguf", "Q4_0"))
    plain = Engine.load(path, activations=activations)
    assert plain.info["activations"] == (activations if ON_CPU else "f32")  # int8: a CPU kernel
    if ON_CPU:
        assert plain.kernels["target"]["fused"]["fused"] == len(plain.target.model.model.layers)
    lookup = Engine.load(path, drafter="lookup", activations=activations)
    prompt = "the world and the world and the"
    tokens, _, last = run(lookup, prompt, max_tokens=30, draft_length=3)
    assert tokens == run(plain, prompt, max_tokens=30)[0] and last.stats.drafted > 0
    monkeypatch.setenv("MLXSPEC_ACTIVATIONS", activations)
    assert Engine.load(path).info["activations"] == (activations if ON_CPU else "f32")


def test_a_mixture_of_experts_gguf_speculates_exactly(tmp_path):
    """qwen3moe (16 experts, 8 per token): verify rows route each to its own experts, and at 8 rows
    mlx-lm's SwitchGLU takes its sorted path (rows x experts >= 64); greedy speculation still gives
    plain decoding's tokens."""
    dims = Dims(head_dim=32, experts=16, experts_used=8)
    path = str(write_tiny_llama_gguf(tmp_path / "moe.gguf", "Q4_0", arch="qwen3moe", dims=dims, output_qtype="Q8_0"))
    plain, lookup = Engine.load(path), Engine.load(path, drafter="lookup")
    assert plain.target.config["num_experts"] == 16 and plain.target.config["num_experts_per_tok"] == 8
    assert plain.info["architecture"] == "qwen3moe"  # the file's name for it, as Ollama's show says
    swapped = plain.kernels["target"]["layers"]["swapped"]
    assert sum("switch_mlp" in path for path in swapped) == 3 * dims.layers  # experts on the CPU kernel
    prompt = "the world and the world and the"
    want = run(plain, prompt, max_tokens=40)[0]
    for k in (3, 7):
        tokens, _, last = run(lookup, prompt, max_tokens=40, draft_length=k)
        assert tokens == want and last.stats.accepted > 0


@pytest.mark.parametrize("arch, extra", [
    # GLM-4: biased q/k/v, rope on half of each head, four norms a block, fused gate/up
    ("glm4", dict(dims=Dims(rope_dims=8), pre="glm4", output_qtype="Q8_0")),
    # EXAONE 3.5: llama's block with NEOX rope and Llama 3 rope scaling (rope_freqs)
    ("exaone", dict(pre="exaone", extra_tensors={"rope_freqs.weight": np.linspace(1.0, 8.0, 8)})),
    # Command R7B: a parallel block, sliding windows of 4 positions on 3 of 4 layers (rewound exactly)
    ("cohere2", dict(dims=Dims(layers=4), pre="command-r", metadata={"logit_scale": 0.5, "attention.sliding_window": 4})),
    # Granite 3 MoE: granite's scales, experts on the CPU kernel (3 of 8 a token)
    ("granitemoe", dict(tokenizer="llama", dims=Dims(experts=8, experts_used=3),
                        metadata={"embedding_scale": 12.0, "residual_scale": 0.5, "logit_scale": 2.0})),
    # Nemotron-Mini: LayerNorms stored as 1 + w, NEOX rope on half of each head, relu squared MLP
    ("nemotron", dict(tokenizer="llama", dims=Dims(rope_dims=8), output_qtype="Q8_0")),
    # DeepSeek-V2-Lite's layout: latent attention (k and v of different widths), YaRN, experts plus shared ones
    ("deepseek2", dict(dims=Dims(experts=8, experts_used=3), output_qtype="Q8_0", metadata={
        "rope.scaling.type": "yarn", "rope.scaling.factor": 40.0, "rope.scaling.original_context_length": 4,
        "rope.scaling.yarn_log_multiplier": 0.0707})),
    # StableLM 2: LayerNorms with biases, biased q/k/v, NEOX rope on a quarter of each head
    ("stablelm", dict(pre="stablelm2", dims=Dims(rope_dims=4), output_qtype="Q8_0")),
    # its newer layout: kv_b as attn_k_b / attn_v_b, joined again unquantized (one quantized matmul fewer a layer)
    ("deepseek2-split", dict(dims=Dims(experts=8, experts_used=3), output_qtype="Q8_0")),
    # SmolLM3: llama's block, no rope on every 4th layer
    ("smollm3", dict(dims=Dims(layers=4), pre="llama-bpe")),
    # Command R+: a parallel block, per-head q/k LayerNorms
    ("command-r", dict(pre="command-r", metadata={"logit_scale": 0.5})),
    # Qwen3-Next: delta-net layers (recurrent states restored past rejected drafts), experts, fused beta/alpha
    ("qwen3next", dict(pre="qwen2", dims=Dims(head_dim=32, rope_dims=8, experts=8, experts_used=3), output_qtype="Q8_0",
                       seed=2)),  # weights whose answer repeats itself enough to be drafted
])
def test_more_architectures_speculate_exactly(tmp_path, arch, extra):
    """Their projections run the kernels and greedy lookup speculation gives plain decoding's tokens."""
    path = str(write_tiny_llama_gguf(tmp_path / f"{arch}.gguf", "Q4_0", arch=arch, **extra))
    plain, lookup = Engine.load(path), Engine.load(path, drafter="lookup")
    assert plain.info["architecture"] == arch.removesuffix("-split")
    swapped = plain.kernels["target"]["layers"]["swapped"]
    # quantized matmuls: 4 or 3+1 attention and 3 or 2 FFN a layer; deepseek2's second layer adds 3 shared-expert ones
    want_swapped = {"glm4": 12, "exaone": 14, "cohere2": 28, "command-r": 14, "smollm3": 28, "granitemoe": 14,
                    "nemotron": 12, "deepseek2": 17, "deepseek2-split": 15, "stablelm": 14, "qwen3next": 16}[arch]
    assert sum(".self_attn." in p or "mlp." in p for p in swapped) == want_swapped
    prompt = "the world and the world and the"
    want = run(plain, prompt, max_tokens=40)[0]
    for k in (3, 7):
        tokens, _, last = run(lookup, prompt, max_tokens=40, draft_length=k)
        assert tokens == want and last.stats.accepted > 0


def test_gpt_oss_mxfp4_experts_run_the_int8_kernel_and_speculate_exactly(tmp_path):
    """A gpt-oss GGUF (MXFP4 experts, sinks, windows): with int8 activations its mxfp4 experts run
    mlxspec's kernel (kE2m1 codes), with fp32 ones MLX's op; lookup speculation gives plain
    decoding's tokens either way, and the int8 answer stays near MLX's."""
    dims = Dims(head_dim=32, experts=8, experts_used=3)
    path = str(write_tiny_llama_gguf(tmp_path / "oss.gguf", "Q8_0", arch="gpt-oss", dims=dims, output_qtype="Q8_0",
                                     metadata={"attention.sliding_window": 4}))
    prompt = "the world and the world and the"
    for activations in ("q8", "f32"):
        plain = Engine.load(path, activations=activations)
        layers = plain.kernels["target"]["layers"]
        experts = [p for p in layers["swapped"] if "experts" in p]
        assert len(experts) == (3 * dims.layers if activations == "q8" else 0), layers["kept"]
        lookup = Engine.load(path, drafter="lookup", activations=activations)
        want = run(plain, prompt, max_tokens=30)[0]
        tokens, _, last = run(lookup, prompt, max_tokens=30, draft_length=3)
        assert tokens == want and last.stats.drafted > 0 and last.stats.exact
    x = mx.array([[5, 9, 13, 2]])
    q8, f32 = Engine.load(path, activations="q8"), Engine.load(path, activations="f32")
    a, b = q8.target.model(x), f32.target.model(x)
    assert (mx.abs(a - b).max() / mx.abs(b).max()).item() < 0.05  # int8 rounding of x, not another model


def test_granite_gguf_runs_the_kernels_and_speculates_exactly(tmp_path):
    """IBM Granite 3.x (its scales, llama's interleaved rope swapped into mlx-lm's granite layers):
    the per-op kernels run it (no fused block: the residual scale), and lookup keeps plain's tokens."""
    path = str(write_tiny_llama_gguf(tmp_path / "granite.gguf", "Q4_0", arch="granite", tokenizer="llama",
                                     metadata={"embedding_scale": 12.0, "residual_scale": 0.5,
                                               "attention.scale": 0.15, "logit_scale": 2.0}))
    plain = Engine.load(path)
    assert plain.info["architecture"] == "granite" and plain.target.config["residual_multiplier"] == 0.5
    report = plain.kernels["target"]
    assert report["layers"]["swapped"] and report["attention"]["routed"] == len(plain.target.model.layers)
    lookup = Engine.load(path, drafter="lookup")
    prompt = "the world and the world and the"
    tokens, _, last = run(lookup, prompt, max_tokens=30, draft_length=3)
    assert tokens == run(plain, prompt, max_tokens=30)[0] and last.stats.drafted > 0 and last.stats.exact


MISTRAL3 = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 8,
            "attention.temperature_scale": 0.5}


@pytest.mark.parametrize("arch", ["gemma", "starcoder2", "mistral3", "olmo2"])
def test_code_model_ggufs_run_the_kernels_and_speculate_exactly(tmp_path, arch):
    """CodeGemma's and StarCoder2's architectures (llama.cpp's tanh GELU swapped into mlx-lm's MLPs;
    starcoder2's biased projections), and mistral3's (interleaved YaRN, the attention temperature past
    8 positions: every verify row scaled for its own position): the per-op kernels run them, and lookup
    keeps plain's tokens."""
    path = str(write_tiny_llama_gguf(tmp_path / f"{arch}.gguf", "Q4_0", arch=arch, tokenizer="llama",
                                     metadata=MISTRAL3 if arch == "mistral3" else None))
    plain = Engine.load(path)
    assert plain.info["architecture"] == arch
    report = plain.kernels["target"]
    assert report["layers"]["swapped"] and report["attention"]["routed"] == len(plain.target.model.layers)
    lookup = Engine.load(path, drafter="lookup")
    prompt = "the world and the world and the"
    tokens, _, last = run(lookup, prompt, max_tokens=30, draft_length=3)
    assert tokens == run(plain, prompt, max_tokens=30)[0] and last.stats.drafted > 0 and last.stats.exact


def test_auto_activations_and_a_bad_setting(tmp_path, tiny_llama, monkeypatch):
    """'auto' is q8 for GGUF files where the CPU has int8 dot products, f32 for MLX models (their
    reference is MLX's fp16/bf16 arithmetic); an unknown value is a one-line error."""
    from mlxspec.kernels.cpu import q8_fast

    path = str(write_tiny_llama_gguf(tmp_path / "tiny.gguf", "Q4_0"))
    int8 = q8_fast() and mx.default_device() == mx.cpu  # a GPU keeps its own arithmetic
    assert Engine.load(path).info["activations"] == ("q8" if int8 else "f32")
    assert Engine.load(str(tiny_llama), quantize="q4g32").info["activations"] == "f32"
    with pytest.raises(MlxspecError, match="unknown activations 'int4' \\(one of auto, f32, q8\\)"):
        Engine.load(path, activations="int4")
    monkeypatch.setenv("MLXSPEC_ACTIVATIONS", "int4")
    with pytest.raises(MlxspecError, match="unknown activations"):
        Engine.load(path)


def test_auto_activations_are_int8_for_mxfp4_models():
    """An MLX model with mxfp4 layers (mlx-community's gpt-oss) gets int8 activations where the CPU
    has VNNI: the kernel runs mxfp4 only so, and MLX's CPU op for it is 20-140x slower."""
    from types import SimpleNamespace

    from mlxspec.engine import resolve_activations
    from mlxspec.kernels.cpu import q8_fast

    def model(mode):
        return SimpleNamespace(config={}, model=nn.Sequential(nn.QuantizedLinear(64, 32, group_size=32, bits=4,
                                                                                  mode=mode)))

    int8 = q8_fast() and mx.default_device() == mx.cpu  # a GPU keeps its own arithmetic
    assert resolve_activations("auto", model("mxfp4")) == ("q8" if int8 else "f32")
    assert resolve_activations("auto", model("affine")) == "f32"
    assert resolve_activations("f32", model("mxfp4")) == "f32"


def test_kv_cache_type_of_gguf_models(tmp_path, tiny_llama, monkeypatch):
    """GGUF models store float32 keys and values as float16 unless asked for f32; MLX models keep mlx-lm's
    cache; MLXSPEC_KV_CACHE_TYPE is read by Engine.load; an unknown type is a one-line error."""
    path = str(write_tiny_llama_gguf(tmp_path / "tiny.gguf", "Q4_0"))
    assert load(path).info["kv_cache_type"] == "f16"
    assert load(path, kv_cache="f32").info["kv_cache_type"] == "f32"
    assert load(str(tiny_llama)).info["kv_cache_type"] == "f32"
    prompt = "the world and the world and the"
    half, full = Engine.load(path), Engine.load(path, kv_cache="f32")
    for engine, dtype in ((half, mx.float16), (full, mx.float32)):
        assert run(engine, prompt, max_tokens=12)[0]
        assert engine.kv.cache[0].keys.dtype == dtype  # the cache the request decoded with
    monkeypatch.setenv("MLXSPEC_KV_CACHE_TYPE", "f32")
    assert Engine.load(path).info["kv_cache_type"] == "f32" == full.info["kv_cache_type"]
    monkeypatch.setenv("MLXSPEC_KV_CACHE_TYPE", "q4_0")
    with pytest.raises(MlxspecError, match="unknown KV cache type 'q4_0' \\(one of f16, f32\\)"):
        Engine.load(path)


def test_gguf_cache_goes_half_on_a_gpu_only_where_the_attention_kernel_stays(tmp_path, monkeypatch):
    """On a GPU (report backend != cpu) a GGUF model's cache stores float16 when the target's attention
    runs mlxspec's kernel for good (kept by the timing, or kernels='exact'); with MLX's attention, or
    kernels dropped by the timing, it stays float32."""
    from mlxspec import engine as engine_mod

    gpu = {"backend": "cuda", "attention": {"routed": 2}}
    assert engine_mod.gpu_attention_kept({"target": gpu | {"timed": {"kept": True, "ratio": 1.02}}})
    assert engine_mod.gpu_attention_kept({"target": gpu | {"timed": "not timed: kernels='exact'"}})
    assert not engine_mod.gpu_attention_kept({"target": gpu | {"timed": {"kept": False, "ratio": 1.4}}})
    assert not engine_mod.gpu_attention_kept({"target": gpu | {"attention": {"routed": 0}, "timed": {"kept": True}}})
    assert not engine_mod.gpu_attention_kept({"target": {"backend": "cpu", "attention": {"routed": 2}}})
    assert not engine_mod.gpu_attention_kept({"disabled": "kernels off"})

    path = str(write_tiny_llama_gguf(tmp_path / "tiny.gguf", "Q4_0"))
    from mlxspec import loading as loading_mod

    monkeypatch.setattr(loading_mod, "on_cpu", lambda: False)  # as on a GPU: load leaves the choice to Engine.load
    for timed, want in (({"kept": True}, "f16"), ({"kept": False}, "f32")):
        report = {"target": gpu | {"timed": timed}}
        monkeypatch.setattr(engine_mod, "_use_kernels", lambda *a, r=report, **k: r)
        assert Engine.load(path).info["kv_cache_type"] == want
        assert Engine.load(path, kv_cache="f32").info["kv_cache_type"] == "f32"  # asked for: never half
