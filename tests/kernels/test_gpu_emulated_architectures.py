"""mlx-lm's architectures on an emulated GPU (gpu_emulation.py): a verify pass's rows equal one-row steps where
mlxspec's kernels cover every row-sensitive op a decoding pass reaches; where one is not covered yet, the engine
measures it and a speculative run says `exact: false`. (The CPU's: tests/test_architectures.py.)"""

from __future__ import annotations

import mlx.core as mx
import pytest

from gpu_emulation import emulate_gpu
from mlx_lm_architectures import architecture_dir
from mlxspec.engine import Engine
from mlxspec.kernels import registry
from mlxspec.options import GenerateOptions

ON_A_GPU = [
    "falcon_h1",  # its layers' CacheLists
    "lfm2", "lfm2_moe",  # their short convs were MLX's conv (now KernelCausalConv, as every depthwise causal conv)
    "deepseek_v3", "glm4_moe_lite",  # MLA: its per-head matmuls and float-masked attention, now row by row
    "kimi_linear", "mistral4",  # other MLA texts: a decoding pass's tokens one at a time
    "jamba",  # its Mamba mixer's selective scan ends in a batched matmul over the tokens (now stepped)
    "gpt2",  # its head is the tied `wte` table, which was not found as one
    "plamo2",  # its attention called MLX's directly (now mlx-lm's function, which the kernels route)
    "bailing_hybrid",  # its lightning attention's chunks (now one token at a time)
    "plamo3", "nemotron_h", "gemma3_text", "phi3", "qwen3_moe",
    "recurrent_gemma",  # its RG-LRU's block-diagonal matmuls (`h @ w`) and its conv_general (now stepped)
    "talkie",  # its head is a bare array (`out @ self.lm_head.T`): now through the dense kernel
    "gemma3n",  # its AltUp's per-token matmul (now one token at a time) and its head, read inside the text model
    "iquestloopcoder",  # its loop gates' compiled matmul (now one token at a time)
    "llama4",  # its chunked layers' masks (attention chunks, not a window): now the kernel, a call per chunk
    "openelm", "lille-130m",  # their tied heads' tables have other names (found where the forward reads them)
    "afm7",  # its q/k/v FusedLinear (a Linear that splits its output) and its KV-reuse layers' positions
    "deepseek_v41",  # its hyper-connections' raw-weight matmul; its grouped output projection (a float SwitchLinear)
]


@pytest.fixture
def gpu(monkeypatch, request):
    default = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield emulate_gpu(monkeypatch, without=getattr(request, "param", ()))
    registry.reset()
    mx.set_default_device(default)


@pytest.mark.parametrize("model_type", ON_A_GPU)
def test_verify_rows_equal_one_row_steps_on_an_emulated_gpu(gpu, tmp_path, model_type):
    engine = Engine.load(str(architecture_dir(tmp_path, model_type)), kernels="exact")
    assert engine.kernels["target"]["backend"] == "cuda" and gpu
    assert engine.rows.holds(6), engine.rows.failures()


@pytest.mark.parametrize("gpu, model_type", [(("dense",), "talkie")], indirect=["gpu"])
def test_a_gap_says_exact_false_on_an_emulated_gpu(gpu, tmp_path, model_type):
    """Where an op is not covered (here the dense family is taken away, as where its kernel fails its check on a
    device: Talkie's bare-array head is then MLX's matmul), a speculative run is flagged (its tokens may differ)."""
    path = architecture_dir(tmp_path, model_type)
    engine = Engine.load(str(path), drafter="lookup", kernels="exact")
    options = GenerateOptions(max_tokens=24, temperature=0, draft_length=3, adaptive=False)
    stats = list(engine.generate("the cat sat on the mat and the cat sat on the mat and the", options))[-1].stats
    assert stats.drafted > 0 and not stats.exact


def test_mla_layers_go_back_to_the_absorbed_route_when_the_kernels_leave(gpu, tmp_path):
    """install_kernels gives MLA layers the row-by-row route on a GPU (before attention is routed in them);
    remove_kernels leaves the absorbed one (exact on the CPU's ops, measured by the engine elsewhere)."""
    from mlxspec.kernels import install_kernels, remove_kernels
    from mlxspec.loading import load

    model = load(str(architecture_dir(tmp_path, "deepseek_v3"))).model
    kinds = lambda: {type(m).__name__ for p, m in model.named_modules() if p.endswith("self_attn")}  # noqa: E731
    assert kinds() == {"AbsorbedDeepseekV3Attention"}
    assert install_kernels(model)["latent_rows"] == 2 and kinds() == {"RowByRowDeepseekV3Attention"}
    remove_kernels(model)
    assert kinds() == {"AbsorbedDeepseekV3Attention"}


@pytest.mark.parametrize("model_type, swapped", [
    ("gemma3n", {"RowwiseAltUp", "KernelEmbedding"}), ("iquestloopcoder", {"RowwiseLoopGate"}),
    ("recurrent_gemma", {"StepwiseRGLRU", "StepwiseGriffinConv"}), ("talkie", {"KernelHeadTalkie"}),
    ("deepseek_v41", {"RowwiseHyperConnection", "RowwiseGroupedProjection"}), ("afm7", {"KernelSplitLinear"})])
def test_per_token_routes_are_installed_per_model_and_undone(gpu, tmp_path, model_type, swapped):
    """The routes that made these exact on the emulated GPU are class swaps of this model's modules only;
    remove_kernels gives every module its mlx-lm class back."""
    from mlxspec.kernels import install_kernels, remove_kernels
    from mlxspec.loading import load

    model = load(str(architecture_dir(tmp_path, model_type))).model
    before = {p: type(m) for p, m in model.named_modules()}
    install_kernels(model)
    assert swapped <= {type(m).__name__ for _, m in model.named_modules()}
    remove_kernels(model)
    assert {p: type(m) for p, m in model.named_modules()} == before


def test_deepseek_v41_hyper_connections_mix_each_token_as_its_one_token_step(gpu, tmp_path):
    """Its hyper-connections multiply by a raw weight (`flat @ self.fn.T`), which drifts with the rows on the emulated
    GPU; the swapped class computes a 4-token call's rows as 4 one-token calls."""
    from mlxspec.kernels import install_kernels
    from mlxspec.kernels.rowwise import RowwiseHyperConnection
    from mlxspec.loading import load

    model = load(str(architecture_dir(tmp_path, "deepseek_v41"))).model
    hc = next(m for _, m in model.named_modules() if type(m).__name__ == "HyperConnection")
    streams = mx.random.normal((1, 4, hc.hc, hc.fn.shape[1] // hc.hc), key=mx.random.key(3))
    whole = hc(streams)
    install_kernels(model)
    assert type(hc) is RowwiseHyperConnection
    rows = hc(streams)
    ones = [hc(streams[:, t : t + 1]) for t in range(4)]
    for i in range(3):  # pre, post, comb
        assert mx.array_equal(rows[i], mx.concatenate([one[i] for one in ones], axis=1)).item()
        assert not mx.array_equal(whole[i], rows[i]).item()  # MLX's 4-row matmul drifted


def test_quantized_layers_that_split_their_output_take_the_kernel(gpu, tmp_path):
    """AFM's FusedQuantizedLinear (q, k and v in one matrix, its output split in three) has a __call__ of its own: a
    plain swap would lose the split, so it has its own kernel class; at 4 bits the rows hold and it goes back."""
    from mlxspec.kernels import remove_kernels

    engine = Engine.load(str(architecture_dir(tmp_path, "afm7")), quantize="q4", kernels="exact")
    model = engine.target.model
    kinds = lambda: {type(m).__name__ for p, m in model.named_modules() if p.endswith("qkv_proj")}  # noqa: E731
    assert kinds() == {"KernelSplitQuantizedLinear"} and engine.rows.holds(4), engine.rows.failures()
    remove_kernels(model)
    assert kinds() == {"FusedQuantizedLinear"}
