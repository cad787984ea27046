"""mlx-lm's architectures as mlxspec serves them: greedy speculation keeps plain decoding's tokens and says it
was exact, on this CPU and on an emulated GPU (tests/kernels/gpu_emulation.py). benchmarks/sweep_architectures.py
runs every architecture the table knows; these are the ones that once failed, and some that people run most
(the emulated GPU's: tests/kernels/test_gpu_emulated_architectures.py)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlx_lm_architectures import architecture_dir
from mlxspec.cache import speculable
from mlxspec.engine import Engine
from mlxspec.exactness import RowInvariance
from mlxspec.kernels.latent_attention import use_absorbed_steps
from mlxspec.loading import load
from mlxspec.options import GenerateOptions

PROMPT = "the cat sat on the mat and the cat sat on the mat and the"
ON_THE_CPU = [
    "falcon_h1",  # a CacheList a layer (Mamba-2 state + KV cache): speculation was off
    "plamo3",  # asks a wider window than its rotating cache keeps: every request failed
    "deepseek_v3", "glm4_moe_lite",  # multi-head latent attention: rows differed from one-row steps even here
    "kimi_linear", "mistral4", "deepseek_v32",  # the same, other MLA texts (one token at a time now)
    "phixtral",  # its vocabulary size is `num_vocab`: every load failed
    "bailing_hybrid",  # its lightning attention's chunked route for several tokens (now one at a time)
    "llama4",  # its chunked layers' caches cannot go back before their chunk: a reused prefix was wrong
    "gemma3n",  # its KV-shared layers read their owner's cache (`keys_and_values`): every request failed
    "deepseek_v41",  # its layer caches cannot trim: speculation was off (now snapshot and restored, cache.REBINDING)
    "lfm2", "nemotron_h", "jamba", "gemma3_text", "cohere2", "phi3", "olmo3", "granite", "minicpm",
]
AT_4_BITS = ["kimi_linear",  # its experts' indices are a strided view: the CPU gather kernel refused them
             "afm7",  # its FusedLinear's to_quantized takes no `mode`; its quantized one (which splits q/k/v) was swapped
             "deepseek_v3", "falcon_h1"]


def tokens(engine: Engine, **options) -> tuple[list[int], object]:
    events = list(engine.generate(PROMPT, GenerateOptions(max_tokens=24, temperature=0, **options)))
    return [t for e in events for t in e.tokens], events[-1].stats


def assert_speculation_exact(path, **load_options) -> None:
    want, _ = tokens(Engine.load(str(path), **load_options))
    drafted = Engine.load(str(path), drafter="lookup", **load_options)
    for k in (2, 5):
        got, stats = tokens(drafted, draft_length=k, adaptive=False)
        assert got == want, k
        assert stats.drafted > 0 and stats.exact, (k, stats)


@pytest.mark.parametrize("model_type", ON_THE_CPU)
def test_speculation_keeps_plain_tokens_on_the_cpu(tmp_path, model_type):
    assert_speculation_exact(architecture_dir(tmp_path, model_type))


@pytest.mark.parametrize("model_type", AT_4_BITS)
def test_speculation_keeps_plain_tokens_at_4_bits(tmp_path, model_type):
    assert_speculation_exact(architecture_dir(tmp_path, model_type), quantize="q4")


def test_a_layer_of_two_caches_speculates(tmp_path):
    """Falcon-H1's layers each hold mlx-lm's CacheList(ArraysCache, KVCache): the state is snapshot, the keys trimmed."""
    assert speculable(load(str(architecture_dir(tmp_path, "falcon_h1"))).model)


@pytest.mark.parametrize("model_type", ["deepseek_v3", "mistral4"])  # the absorbed class; one token at a time
def test_mla_rows_differ_on_mlx_lm_s_own_routes(tmp_path, model_type):
    """What use_absorbed_steps fixes: with mlx-lm's own class (decompressed keys for several rows, absorbed ones for
    one), a verify pass's rows differ from one-row steps on this CPU; with the swap they are equal."""
    model = load(str(architecture_dir(tmp_path, model_type))).model
    swapped = [m for _, m in model.named_modules() if type(m).__module__ == "mlxspec.kernels.latent_attention"]
    assert swapped and RowInvariance(model).holds(4)  # swapped at load
    for m in swapped:
        m.__class__ = next(c for c in type(m).__mro__ if c.__module__.startswith("mlx_lm.models."))
    assert not RowInvariance(model).holds(4)
    assert use_absorbed_steps(model) == len(swapped) and RowInvariance(model).holds(4)


@pytest.mark.parametrize("model_type", ["phixtral", "talkie"])  # a head module with a Linear inside; a bare array
def test_structured_output_reads_the_width_of_any_head(tmp_path, model_type):
    """The grammar's masks are as wide as the logits: found in heads that are not a Linear (this failed the request)."""
    import json

    engine = Engine.load(str(architecture_dir(tmp_path, model_type)), drafter="lookup")
    events = list(engine.generate("the cat", GenerateOptions(max_tokens=64, temperature=0), format="json"))
    assert events[-1].done and engine.grammar_tokenizer() is not None
    if events[-1].finish_reason == "stop":
        json.loads("".join(e.text for e in events))


@pytest.mark.parametrize("model_type", ["afm7", "deepseek_v3", "gemma3n", "gemma3_text", "falcon_h1", "baichuan_m1"])
def test_compiled_steps_compute_the_model_s_own_logits(tmp_path, monkeypatch, model_type):
    """A compiled step (a GPU's default) hands layers the cache's whole buffer with the keys that count marked: its
    logits are the model's own on mlx-lm's caches, bit for bit. They were not: AFM's KV-reuse layers placed their
    queries at the buffer's end (kv_reuse_attention.py); DeepSeek-V3's absorbed route passes its rotary scores as
    the mask, which the attention kernel dropped for the buffer's length (now mlx-lm's function takes such masks).
    Gemma 3n's KV-shared layers read another layer's keys; Gemma 3's sliding windows; Falcon-H1's and Baichuan-M1's
    layers hold two caches each (mlx-lm's CacheList: once eager only)."""
    monkeypatch.setenv("MLXSPEC_COMPILE", "1")
    engine = Engine.load(str(architecture_dir(tmp_path, model_type)), kernels="exact")
    model, steps = engine.target.model, engine.steps
    eager, compiled = make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.random.randint(0, 200, (1, 20), key=mx.random.key(0))
    model(prompt, cache=eager), model(prompt, cache=compiled)
    for i, rows in enumerate((1, 3, 1, 2)):
        x = mx.random.randint(0, 200, (1, rows), key=mx.random.key(i + 1))
        assert mx.array_equal(steps(x, compiled), model(x, cache=eager)).item(), f"pass {i} ({rows} rows)"
    assert steps.off is None and steps.graphs
