"""Is every row-sensitive op of a decoding step covered on a GPU? Checked here on an emulated one.

gpu_emulation.emulate_gpu gives the engine CUDA's kernel wiring with row-invariant stand-ins and
makes MLX's matmul, quantized and gather matmuls, attention and convolution change their result with the row
count, as a GPU's may. A family passes when M-row verify forwards still equal one-row steps bit for
bit (RowInvariance, what the engine's `exact` flag reports). On an H200 (2026-11-27) two failed
where this emulation failed them too: Gemma 4 (the tied head of a wrapped text model and the KV-shared
layers' sliding attention reached MLX's ops) and a Qwen3.5 GGUF (the same tied head; the delta-net
conv's self-check compared against MLX's own conv, which on a GPU need not be float32 arithmetic).
Sweeping every GGUF architecture found more: Gemma 1/2 and Command R's heads (tied without a flag),
StableLM's attention (float32 keys over float16 values), Gemma 2's written-out softcapped attention
(now kernels/softcap_attention.py), DeepSeek-V2's and GLM-4.5's routers (`x @ self.weight.T`: now one
token at a time, kernels/rowwise.py); drifting gather_mm too (2026-11-28) found unquantized experts (the float
MoE families here: now one token at a time as well); whatever is found open next goes in GAPS.
"""

from __future__ import annotations

import copy

import mlx.core as mx
import pytest

from gguf_fixtures import Dims, write_tiny_llama_gguf
from gguf_gemma4_fixtures import Gemma4, write_tiny_gemma4_gguf
from gpu_emulation import emulate_gpu
from model_factory import ARCHITECTURES, make_gemma4_dir, make_model_dir, make_qwen35_checkpoint, random_head
from test_gguf_archs import CASES as GGUF_CASES
from mlxspec.engine import GPU_TREE_WIDTH, Engine
from mlxspec.kernels import registry
from mlxspec.loading import load
from mlxspec.options import GenerateOptions

ROWS = 8  # a verify pass of draft length 7

HYBRID = Dims(layers=4, head_dim=32, rope_dims=8, experts=8, experts_used=3)
FAMILIES = {  # name -> a function of a folder that writes the model and returns its path
    "llama": lambda d: make_model_dir(d, "llama", seed=3),
    "qwen2-tied": lambda d: make_model_dir(d, "qwen2", seed=3),
    "gemma4": lambda d: make_gemma4_dir(d),
    "gemma4-moe": lambda d: make_gemma4_dir(d, moe=True),
    **ARCHITECTURES,  # hybrid (qwen3_next, granite-h), sliding windows (gemma3), sinks (gpt_oss), MoE routers
    "qwen3_5": lambda d: make_qwen35_checkpoint(d, moe=True),
    "qwen35-gguf": lambda d: write_tiny_llama_gguf(d / "m.gguf", "Q4_0", arch="qwen35", dims=HYBRID, pre="qwen35"),
    "qwen35moe-gguf": lambda d: write_tiny_llama_gguf(d / "m.gguf", "Q4_0", arch="qwen35moe", dims=HYBRID,
                                                      pre="qwen35"),
    "gemma4-gguf": lambda d: write_tiny_gemma4_gguf(d / "m.gguf", "Q8_0", seed=7),
    "gemma4-31b-gguf": lambda d: write_tiny_gemma4_gguf(d / "m.gguf", "Q8_0", seed=7,
                                                        g=Gemma4(per_layer=0, shared=0, k_eq_v=True, global_kv_heads=2)),
    "gemma4-moe-gguf": lambda d: write_tiny_gemma4_gguf(d / "m.gguf", "Q8_0", seed=7, g=Gemma4(
        experts=8, per_layer=0, shared=0, k_eq_v=True, global_kv_heads=2)),
    "gemma3-gguf": lambda d: write_tiny_llama_gguf(d / "m.gguf", "Q8_0", arch="gemma3", tokenizer="llama",
                                                   dims=Dims(layers=6, head_dim=32),
                                                   metadata={"attention.sliding_window": 4}),
}


@pytest.fixture
def gpu(monkeypatch):
    """The emulation runs on the CPU device (on a real GPU, MLX's own ops would vary besides the drift)."""
    default = mx.default_device()
    mx.set_default_device(mx.cpu)
    calls = emulate_gpu(monkeypatch)
    yield calls
    registry.reset()
    mx.set_default_device(default)


GAPS: dict[str, str] = {}  # GGUF architectures whose decoding steps still reach MLX's row-sensitive ops on a GPU


def assert_rows_invariant(calls: list, path) -> None:
    engine = Engine.load(str(path), kernels="exact")
    assert engine.kernels["target"]["backend"] == "cuda" and calls  # the stand-ins served the layers
    assert engine.rows.holds(ROWS), engine.rows.failures()


@pytest.mark.parametrize("family", FAMILIES)
def test_verify_rows_equal_one_row_steps_on_an_emulated_gpu(gpu, tmp_path, family):
    assert_rows_invariant(gpu, FAMILIES[family](tmp_path))


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=GAPS[n], strict=True)) if n in GAPS
                                  else n for n in GGUF_CASES])
def test_every_gguf_architecture_on_an_emulated_gpu(gpu, tmp_path, name):
    """Each architecture test_gguf_archs.py loads (4-bit where the case does not say), as one run on a GPU."""
    case = {k: v for k, v in copy.deepcopy(GGUF_CASES[name]).items() if k != "hp"}
    assert_rows_invariant(gpu, write_tiny_llama_gguf(tmp_path / "m.gguf", case.pop("qtype", "Q4_0"), seed=7, **case))


def test_the_emulation_catches_mlx_ops(gpu, tmp_path):
    """Without the kernels, MLX's ops serve every row: the emulated GPU makes the rows differ."""
    engine = Engine.load(str(make_model_dir(tmp_path, "llama", seed=3)), kernels=False)
    assert not engine.rows.holds(2)
    assert "differs from the one-row step" in engine.rows.failures()[2]



def test_the_device_s_failing_runs_speculate_exactly_on_an_emulated_gpu(gpu, tmp_path):
    """What failed on the H200 (plain decoding's tokens, but `exact: false`): the Gemma 4 assistant drafting
    for its target, and prompt lookup over a Qwen3.5 GGUF. Here both must be exact, tokens and flag."""
    from speculation_checks import assert_drafts_keep_plain_tokens
    from test_gemma4_assistant import PROMPTS, write_assistant

    target = make_gemma4_dir(tmp_path / "g", layers=8)
    assistant = write_assistant(tmp_path / "a", target)
    plain = Engine.load(str(target), kernels="exact")
    drafted = Engine.load(str(target), drafter=f"mtp:{assistant}", min_confidence=0.0, kernels="exact")
    assert_drafts_keep_plain_tokens(plain, drafted, PROMPTS, 16)
    (tmp_path / "q").mkdir()
    qwen35 = str(FAMILIES["qwen35-gguf"](tmp_path / "q"))
    assert_drafts_keep_plain_tokens(Engine.load(qwen35, kernels="exact"),
                                    Engine.load(qwen35, drafter="lookup", kernels="exact"), PROMPTS, 16, lengths=(2, 7))


def test_draft_trees_by_default_with_adaptive_lengths_keep_plain_tokens_on_an_emulated_gpu(gpu, tmp_path):
    """On a GPU a learned head drafts trees by default (engine.GPU_TREE_WIDTH) and the adaptive controller tries
    tree rounds where rows cost little (seeded here as a GPU's costs): compiled tree passes, chains and plain steps
    mixed in one request keep plain decoding's tokens. (The controller once planned with a missing cost when every
    tree trial built a new graph, which depends on timing: test_adaptive.py holds that case.)"""
    path = make_model_dir(tmp_path / "m", "llama", seed=0)
    head = random_head(load(str(path), quantize="q4").model, tmp_path / "head")
    plain = Engine.load(str(path), quantize="q4", kernels="exact")
    eagle = Engine.load(str(path), drafter=f"eagle:{head}", quantize="q4", kernels="exact")
    assert eagle.draft_width == GPU_TREE_WIDTH
    for _ in range(eagle.costs.TRUSTED):  # a GPU's costs, where extra rows cost little: tree rounds are tried
        for k in range(13):
            eagle.costs.add(k, 0.010 + 0.0001 * k)
    text = "the cat sat on the mat and the cat sat on the mat and the"
    want = [t for e in plain.generate(text, GenerateOptions(max_tokens=40)) for t in e.tokens]
    events = list(eagle.generate(text, GenerateOptions(max_tokens=40, draft_length=4)))  # adaptive: the default
    assert [t for e in events for t in e.tokens] == want
    assert events[-1].stats.tree_rounds > 0 and events[-1].stats.exact
