"""benchmarks/bench_gpu.py, the one-call device check of issue 10, run small on this CPU: its
measurements must work here before device minutes are spent on them, and the CPU kernels must come
out row-invariant in them (as the exactness suite says they are)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from benchmark_scripts import load


@pytest.fixture(scope="module")
def bench():
    module = load("bench_gpu")
    module.OP_REPEATS = 3  # a median of 3: what these tests check is that the timings are taken, not their noise
    return module


def test_row_gap_sees_a_row_dependent_op(bench):
    x = mx.random.normal((4, 8), key=mx.random.key(0))
    assert bench.row_gap(lambda a: a * 2, x) == 0.0
    assert bench.row_gap(lambda a: a * a.shape[0], x) > 0  # a result that depends on the row count


def test_attention_times_each_tensor_core_chunk_where_it_passes_its_self_check(bench, monkeypatch):
    """On CUDA the attention rows also time the tensor-core family at each of MMA_CHUNKS keys a warp (stood in here
    by the CPU kernel: row-invariant, so it passes the self-check); a build failing it is left out, said once."""
    from mlxspec.kernels import gpu_attention
    from mlxspec.kernels.cpu import cpu_sdpa_function

    built = []

    def stand_in(chunk):
        built.append(chunk)
        base = cpu_sdpa_function()
        return base if chunk != 256 else (lambda q, k, v, scale, causal, **kw: base(q, k, v, scale, causal, **kw) * 2)

    monkeypatch.setattr(bench, "device_backend_name", lambda: "cuda")
    monkeypatch.setattr(gpu_attention, "cuda_sdpa_mma_function", stand_in)
    assert set(bench.tensor_core_attention(4, 2, 64, mx.float16, 0.125)) == {"ours-mma-c64", "ours-mma-c128"}
    assert built == list(bench.MMA_CHUNKS)
    assert bench.tensor_core_attention(4, 2, 64, mx.float32, 0.125) == {}  # float32: the FMA family's on CUDA


def test_ops_and_forward_sections_on_the_cpu(bench):
    with mx.stream(mx.cpu):
        qmm = bench.qmm_ops(bench.QMM_SHAPES["quick"])
        attention = bench.attention_ops(4, 2, 64, 40)
        forward = bench.forward_costs(bench.FORWARD_SHAPES["quick"], context=32, repeats=1)
    for entry in qmm + [attention]:
        for m in bench.ROWS:
            row = entry[f"M={m}"]
            assert row["ours_us"] > 0 and row["mlx_us"] > 0
            assert row["ours_row_gap"] == 0.0, (entry, m)
    assert forward["kernels"]["row_invariant_to_16"] and not forward["kernels"]["failures"]
    assert set(forward["kernels"]["ms"]) == {1, 2, 4, 8, 16}
    assert sum(forward["matmul_kernels"].values()) == 2 * 7 + 1  # q/k/v/o, gate/up/down a block; the head
    for variant in ("mlx", "kernels"):  # graph building is part of a forward; every forward builds nodes
        row = forward[variant]
        assert all(0 < row["build_ms"][m] <= row["ms"][m] for m in row["ms"]) and row["graph_nodes_M1"] > 10
    # each part's share (the kernels with MLX's attention, MLX's ops with ours), eager and compiled each way
    for variant in ("kernels, MLX's attention", "MLX's ops, attention kernel", "mlx compiled", "kernels compiled"):
        assert set(forward[variant]["ms"]) == {1, 2, 4, 8, 16}, variant
    assert forward["kernels compiled"]["row_invariant_to_16"] and forward["kernels compiled"]["graph_nodes_M1"] is None
    assert forward["MLX's ops, attention kernel"]["matmul_kernels"] == {}  # MLX's matmuls there


def test_trees_section_on_the_cpu(bench):
    """Tree passes (the CPU's fused blocks here) are timed beside chains of as many rows, and every node of a
    22-node tree equals the one-row steps along its path."""
    assert bench.favourites_tree(2, 3) == [-1, 0, 0, 0, 1, 1, 1]
    with mx.stream(mx.cpu):
        trees = bench.tree_costs(bench.FORWARD_SHAPES["quick"], context=32, repeats=1)
    assert trees["trees_ready"] and trees["nodes_equal_steps"], trees
    assert set(trees["ms"]) == {"step"} | {f"{kind} {n}" for kind in ("chain", "tree") for n in (4, 10, 22, 46)}
    assert all(ms > 0 for ms in trees["ms"].values())


def test_graph_nodes_counts_one_forward_however_often_it_is_asked(bench):
    """A forward's cache writes, left lazy, made the next forward's graph count them again (an H200 run
    reported 2,000 nodes for the kernels' forward: MLX's 897 of the forward counted before it, and its own)."""
    from mlxspec.bench.forwards import graph_nodes
    from mlxspec.cache import new_cache

    with mx.stream(mx.cpu):
        model = bench.random_llama(bench.FORWARD_SHAPES["quick"])
        cache = new_cache(model)
        model(mx.random.randint(0, 500, (1, 8)), cache=cache)
        mx.eval([c.state for c in cache])
        graph_nodes(model, cache)  # the first after a prefill reads its cache as written there
        counts = [graph_nodes(model, cache) for _ in range(3)]
    assert counts[0] > 10 and counts == [counts[0]] * 3


def test_families_section_on_the_cpu(bench):
    """gemma3 (windows), gpt-oss (mxfp4 experts, sinks), qwen3_moe (experts), gemma4 (a tied head) and gemma2
    (softcapped attention) build, run both ways and come out row-invariant with the kernels installed on this CPU."""
    with mx.stream(mx.cpu):
        families = bench.family_checks("quick", context=80, repeats=1)
    assert set(families) == {"gemma3", "gpt_oss", "qwen3_moe", "gemma4", "gemma2"}
    for name, entry in families.items():
        assert entry["kernels"]["row_invariant_to_8"] and not entry["kernels"]["failures"], name
        assert set(entry["kernels"]["ms"]) == {1, 8}
    assert families["qwen3_moe"]["swapped_count"] > 0  # the experts run the kernel
    assert "'softcapped': 2" in families["gemma2"]["attention"]  # both layers' attention through the kernel
    assert all("mxfp4" in why for why in families["gpt_oss"]["kept_layers"].values())  # the CPU's is affine only


def test_layout_and_gather_ops_on_the_cpu(bench):
    """The 6-bit and mxfp4 qmm rows and the MoE gather rows run here. The CPU's kernel takes neither
    layout as such (layers widen 6-bit codes first; mxfp4 needs int8 activations) and gathers through
    its qmm tiles: 'ours' is then absent, with the reason; on a GPU each has its kernel."""
    with mx.stream(mx.cpu):
        six = bench.qmm_ops(bench.QMM_SHAPES["quick"][:1], bits=6)
        fp4 = bench.qmm_ops(bench.QMM_SHAPES["quick"][:1], dtype=mx.bfloat16, group=32, mode="mxfp4")
        gather = bench.gather_ops(8, 96, 256, 4)
    assert "ours_us" not in six[0]["M=8"] and "bits must be 4 or 8" in six[0]["kernel"] and six[0]["M=8"]["mlx_us"] > 0
    assert "ours_us" not in fp4[0]["M=1"] and "mxfp4" in fp4[0]["kernel"]
    assert gather["tokens=8"]["mlx_us"] > 0 and "gather-qmm" in gather["kernel"]


def test_chained_calls_feed_each_output_to_the_next_call(bench, monkeypatch):
    """Where calls may overlap (a GPU: op_batch > 1), each of the chain's calls takes the previous one's
    output, cut or tiled to K columns (kernels/timing.latency_us); on the CPU there is nothing to overlap (None)."""
    from mlxspec.kernels import timing

    x = mx.ones((2, 6))
    assert bench.chained_us(lambda a: a * 2, x) is None
    monkeypatch.setattr(bench, "op_batch", lambda: 16)
    monkeypatch.setattr(timing, "device_backend_name", lambda: "cuda")
    seen = []

    def widen(a):  # N = 4 < K = 6 columns: tiled back up to 6
        seen.append(a.shape)
        return mx.concatenate([a[..., :2], a[..., :2]], axis=-1) + 1

    assert bench.chained_us(widen, x, repeats=1) > 0
    assert set(seen) == {(2, 6)} and len(seen) == 16 * (1 + 2)  # repeats + time_call's 2 warm-ups


def test_ncu_forward_runs_a_variant_s_forward_without_the_profiler():
    """benchmarks/ncu_forward.py (run under Nsight Compute on a device): builds, warms and runs one forward
    of each variant; --dry skips the profiler calls, which need CUDA's driver."""
    from benchmark_scripts import load

    ncu_forward = load("ncu_forward")
    with mx.stream(mx.cpu):
        for variant in ("mlx", "kernels"):
            report = ncu_forward.main(["--variant", variant, "--quick", "--dry", "--layers", "2"])
            assert report["variant"] == variant and report["wall_ms"] > 0


def test_ncu_attention_warms_and_runs_each_call_without_the_profiler():
    """benchmarks/ncu_attention.py (run under Nsight Compute on a device): MLX's attention and ours per case, each
    warmed, then run once; --dry takes the CPU kernel and skips the profiler calls, which need CUDA's driver."""
    from benchmark_scripts import load

    with mx.stream(mx.cpu):
        labels = load("ncu_attention").main(["--quick", "--dry"])
    assert labels == [f"{name} M={m} keys=40" for m in (1, 4) for name in ("mlx", "ours")]


@pytest.mark.parametrize("kb", [32, 128])
def test_the_source_size_probe_pads_a_cubin_to_its_size(bench, kb):
    """source_size_cost times a trivial kernel whose stored cubin a never-launched kernel pads to ~kb KB (as our
    qmm's: 36 KB at one row, 131 KB at 16): NVRTC must still unroll it to that size."""
    from mlxspec.kernels import cuda_cache
    from mlxspec.kernels.build import KernelUnavailable

    homes = cuda_cache.nvidia_roots()
    try:
        nvrtc = cuda_cache.Nvrtc(cuda_cache.load_nvrtc(homes), cuda_cache.include_paths(homes))
    except KernelUnavailable as e:
        pytest.skip(f"NVRTC not installed ({e})")
    entry, text = cuda_cache.program("mlxspec_probe_bin", ["x"], ["y"], "y[threadIdx.x] = x[threadIdx.x] + 1.0f;",
                                     bench.pad_kernel(kb * 1024 // 85), [mx.float32], [1], [mx.float32], [])
    binary, _ = nvrtc.compile(text, "sm_90", entry)
    assert 0.75 * kb * 1024 < len(binary) < 1.25 * kb * 1024


def test_ceiling_section_on_the_cpu(bench):
    """Drafts that are always right, through compiled steps: with the kernels each is kept and the tokens are
    plain decoding's (the CPU's MLX ops are row-invariant too; a GPU's need not be: the section says which)."""
    with mx.stream(mx.cpu):
        report = bench.ceiling(bench.FORWARD_SHAPES["quick"], tokens=8, repeats=1)
    assert set(report) == {"kernels compiled", "mlx compiled"}
    for k in (1, 3, 7, 15):
        row = report["kernels compiled"][f"k={k}"]
        assert row["kept"] == 1.0 and row["same_tokens"] and row["tok_s"] > 0, (k, row)
