"""CUDA kernels compiled once per machine (kernels/cuda_cache.py), on this CPU: every family's program as the
cached path writes it compiles with NVRTC for sm_90 (pip's nvidia-cuda-nvrtc, the [dev] extra); launches pass
each input's shape as int arguments in the order the program declares them; a program is compiled once and
then read from the store, by a later process too; what the path cannot build goes to MLX's JIT. The launch
itself (mx.fast.precompiled_cuda_kernel) needs a device: there the path proves itself on a probe kernel and
each family's self-check runs on its builds."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxspec.kernels import accept_source, cuda_cache, gpu_attention_mma_source, gpu_attention_source, gpu_mma_source, gpu_source
from mlxspec.kernels.build import KernelUnavailable
from mlxspec.kernels.reference import output_dtype

HOMES = cuda_cache.nvidia_roots()


def nvrtc_or_skip() -> cuda_cache.Nvrtc:
    try:
        return cuda_cache.Nvrtc(cuda_cache.load_nvrtc(HOMES), cuda_cache.include_paths(HOMES))
    except KernelUnavailable as e:
        pytest.skip(f"NVRTC not installed ({e}): nvidia-cuda-nvrtc, the [dev] extra on Linux x86_64")


f16, bf16, f32, u32 = mx.float16, mx.bfloat16, mx.float32, mx.uint32
QMM_IN = [f16, u32, f16, f16]
ATTENTION_IN = [f16, f16, f16, f32, mx.int32, mx.int32]  # q, k, v, params, length, tree
FAMILIES = {  # label -> (name, inputs, outputs, body, header, input dtypes, input ndims, output dtypes, template)
    "qmm, 1 row": (gpu_source.NAME, gpu_source.INPUTS, gpu_source.OUTPUTS, gpu_source.CUDA_BODY, gpu_source.CUDA_HEADER,
                   QMM_IN, [2, 2, 2, 2], [f16], gpu_source.template_args(f16, f16, f16, 64, 4, rows=1)),
    "qmm, 16 rows 6-bit": (gpu_source.NAME, gpu_source.INPUTS, gpu_source.OUTPUTS, gpu_source.CUDA_BODY,
                           gpu_source.CUDA_HEADER, [f32, u32, f32, f32], [2, 2, 2, 2], [f32],
                           gpu_source.template_args(f32, f32, f32, 32, 6, rows=16)),
    "qmm mxfp4": (gpu_source.NAME, gpu_source.INPUTS, gpu_source.OUTPUTS, gpu_source.CUDA_BODY, gpu_source.CUDA_HEADER,
                  [bf16, u32, mx.uint8, mx.uint8], [2, 2, 2, 1], [bf16],
                  gpu_source.template_args(bf16, mx.uint8, output_dtype(bf16, mx.uint8), 32, 4, "mxfp4", rows=2)),
    "gather": (gpu_source.GATHER_NAME, gpu_source.GATHER_INPUTS, gpu_source.OUTPUTS, gpu_source.CUDA_GATHER_BODY,
               gpu_source.CUDA_HEADER, QMM_IN + [u32], [2, 3, 3, 3, 1], [f16], gpu_source.template_args(f16, f16, f16, 64, 4, rows=1)),
    "grouped gather": (gpu_source.GROUPED_NAME, gpu_source.GATHER_INPUTS, gpu_source.OUTPUTS, gpu_source.CUDA_GROUPED_BODY,
                       gpu_source.CUDA_HEADER, QMM_IN + [u32], [2, 3, 3, 3, 1], [f16],
                       gpu_source.template_args(f16, f16, f16, 64, 4, rows=4)),
    "dense": (gpu_source.DENSE_NAME, gpu_source.DENSE_INPUTS, gpu_source.OUTPUTS, gpu_source.CUDA_DENSE_BODY,
              gpu_source.CUDA_HEADER, [bf16, bf16], [2, 2], [bf16], gpu_source.dense_template_args(bf16, bf16, bf16, 8)),
    "tensor cores, 2 tiles": (gpu_mma_source.NAME, gpu_mma_source.INPUTS, gpu_mma_source.OUTPUTS, gpu_mma_source.BODY,
                              gpu_mma_source.HEADER, QMM_IN, [2, 2, 2, 2], [f16],
                              gpu_mma_source.template_args(f16, f16, f16, 64, 4, tiles=2, rows=16)),
    "attention combine": (gpu_attention_source.COMBINE_NAME, gpu_attention_source.COMBINE_INPUTS,
                          gpu_attention_source.COMBINE_OUTPUTS, gpu_attention_source.BODIES[("cuda", "combine")],
                          gpu_attention_source.HEADERS["cuda"], [f32] * 4, [2, 2, 3, 1], [f16],
                          gpu_attention_source.combine_template(f16, sinks=True)),
    # attention's row-contiguous twins (a compiled step's whole cache buffers): the strides their shapes imply
    "attention partial, buffers": (gpu_attention_source.PARTIAL_NAME, gpu_attention_source.PARTIAL_INPUTS,
                                   gpu_attention_source.PARTIAL_OUTPUTS, gpu_attention_source.BODIES[("cuda", "partial")],
                                   gpu_attention_source.HEADERS["cuda"], ATTENTION_IN, [4, 4, 4, 1, 1, 1], [f32] * 3,
                                   gpu_attention_source.partial_template(f16, heads=4, dims_per_lane=4, warps=1)),
    "attention direct tree, buffers": (gpu_attention_source.DIRECT_NAME, gpu_attention_source.PARTIAL_INPUTS,
                                       gpu_attention_source.DIRECT_OUTPUTS, gpu_attention_source.BODIES[("cuda", "direct")],
                                       gpu_attention_source.HEADERS["cuda"], ATTENTION_IN, [4, 4, 4, 1, 1, 1], [f16],
                                       gpu_attention_source.partial_template(f16, heads=1, dims_per_lane=4, tree=True)),
    "tensor-core attention partial, buffers": (gpu_attention_mma_source.PARTIAL_NAME, gpu_attention_mma_source.PARTIAL_INPUTS,
                                               gpu_attention_mma_source.PARTIAL_OUTPUTS, gpu_attention_mma_source.BODIES["partial"],
                                               gpu_attention_mma_source.HEADER, ATTENTION_IN, [4, 4, 4, 1, 1, 1], [f32] * 3,
                                               gpu_attention_mma_source.template(f16, f16, 128, 128)),
    "accept greedy": (accept_source.NAMES[accept_source.GREEDY], accept_source.INPUTS[accept_source.GREEDY],
                      accept_source.OUTPUTS, accept_source.cuda_body(accept_source.GREEDY), accept_source.CUDA_HEADER,
                      [f32, mx.int32], [2, 1], [mx.int32], [("T", f32)]),
    "accept rejection": (accept_source.NAMES[accept_source.REJECTION], accept_source.INPUTS[accept_source.REJECTION],
                         accept_source.OUTPUTS, accept_source.cuda_body(accept_source.REJECTION), accept_source.CUDA_HEADER,
                         [f16, f16, mx.int32, f32], [2, 2, 1, 1], [mx.int32], [("T", f16)]),
}


@pytest.mark.parametrize("label", FAMILIES)
def test_every_family_s_cached_program_compiles_for_sm90(label):
    nvrtc = nvrtc_or_skip()
    entry, text = cuda_cache.program(*FAMILIES[label])
    binary, log = nvrtc.compile(text, "sm_90", entry, options=("--ptxas-options=-v",))
    assert binary[:4] == b"\x7fELF" and entry.encode() in binary  # a cubin exporting the unmangled entry
    assert FAMILIES[label][3] in text  # the body as written
    assert "0 bytes spill" in log


def test_the_cached_one_row_qmm_holds_the_registers_of_mlx_s_build():
    """Shapes as plain int arguments cost the one-row qmm 8 registers (72, 28 warps an SM); as
    __grid_constant__ ints, like MLX's Shape structs, it compiles as MLX's JIT build does (64)."""
    import re

    nvrtc = nvrtc_or_skip()
    _, text = cuda_cache.program(*FAMILIES["qmm, 1 row"])
    _, mlx_style = gpu_source.cuda_source(f16, f16, f16, 64, 4, rows=1)
    stand_in = {"mlx/backend/cuda/device/utils.cuh": b"#pragma once\n#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n"
                b"#include <cuda/std/array>\n#include <cuda/std/limits>\nnamespace mlx::core::cu {\n"
                b"using Shape = cuda::std::array<int32_t, 10>;\nusing Strides = cuda::std::array<int64_t, 10>;\n}\n"}
    registers = [int(re.search(r"Used (\d+) registers", nvrtc.compile(t, "sm_90", "k", options=("--ptxas-options=-v",),
                                                                     headers=stand_in)[1]).group(1))
                 for t in (text, mlx_style)]
    assert registers[0] == registers[1], registers


@pytest.mark.parametrize("ksplit", [2, 4, 8])
def test_every_tensor_core_build_a_layer_can_launch_compiles_to_sass(ksplit):
    """Every row count up to the 72-row self-check at each K split: the H200's store held PTX for the 8-warp split's
    33+ row builds (2 column tiles: 64 KB of partial sums, over the 48 KB ptxas allows), which the driver would
    refuse at load as well. Their column tiles now shrink to fit (the same bits)."""
    nvrtc = nvrtc_or_skip()
    builds = {tuple(gpu_mma_source.template_args(f16, f16, f16, 64, 4, gpu_mma_source.tiles_for(m), m, ksplit))
              for m in range(1, 73)}
    for targs in builds:
        entry, text = cuda_cache.program(gpu_mma_source.NAME, gpu_mma_source.INPUTS, gpu_mma_source.OUTPUTS,
                                         gpu_mma_source.BODY, gpu_mma_source.HEADER, QMM_IN, [2, 2, 2, 2], [f16],
                                         list(targs))
        assert nvrtc.compile(text, "sm_90", entry)[0][:4] == b"\x7fELF", targs


def test_a_program_ptxas_refuses_is_not_stored_as_ptx(tmp_path):
    """PTX stands in for SASS only where NVRTC does not know the architecture; a program ptxas refuses (too much
    shared memory) is unavailable, so its family falls back, rather than failing at the driver's load."""
    compiler = cuda_cache.Compiler(nvrtc_or_skip(), "sm_90", tmp_path)
    body = "  __shared__ float big[16384];\n  big[threadIdx.x] = x[threadIdx.x];\n  y[threadIdx.x] = big[threadIdx.x ^ 1];"
    entry, text = cuda_cache.program("big", ["x"], ["y"], body, "", [f32], [1], [f32], [])
    with pytest.raises(KernelUnavailable, match="too much shared data"):
        compiler.binary(entry, text)
    assert not list(tmp_path.iterdir())


def test_the_probe_compiles_too():
    nvrtc = nvrtc_or_skip()
    entry, text = cuda_cache.program("probe", ["x"], ["y"], cuda_cache.PROBE, "", [f32], [1], [f32], [("SCALE", 3)])
    binary = nvrtc.compile(text, "sm_90", entry)[0]
    assert binary[:4] == b"\x7fELF" and len(binary) < 16_000  # a lean preamble: cooperative_groups.h made it 79 KB


def test_shapes_are_int_arguments_after_the_outputs_in_input_order():
    body = "  y[0] = x_shape[1] + w_shape[0];  // b's shape unread"
    entry, text = cuda_cache.program("t", ["x", "b", "w"], ["y"], body, "", [f16, f32, u32], [2, 1, 3], [f32],
                                     [("T", f16), ("G", 64), ("FLAG", True)])
    signature = text[text.index(entry) : text.index(") {")]
    params = [p.strip() for p in signature.split("(", 1)[1].split(",")]
    assert params == ["const __half* x", "const float* b", "const uint32_t* w", "float* y"] + [
        f"const __grid_constant__ int {d}" for d in ("x_shape_0", "x_shape_1", "w_shape_0", "w_shape_1", "w_shape_2")]
    assert "const int32_t x_shape[2] = {x_shape_0, x_shape_1};" in text and "b_shape" not in text
    assert "using T = __half;" in text and "constexpr int G = 64;" in text and "constexpr bool FLAG = true;" in text
    inputs = [mx.zeros((3, 5), f16), mx.zeros((7,)), mx.zeros((2, 4, 6), u32)]
    assert cuda_cache.shape_scalars(cuda_cache.shape_readers(["x", "b", "w"], body), inputs) == [3, 5, 2, 4, 6]


def test_a_row_contiguous_stride_reader_derives_its_strides_from_its_shape():
    """A stride-reading body launched row-contiguous (MLX copies any other input first) reads the strides its
    input's shape implies: each stride the product of the later dimensions, in int64 (evaluated here by C's rules
    for the shape (2, 3, 5, 7)); its dimensions are int arguments as a shape reader's."""
    body = "  o[0] = q[q_strides[1]] + k[k_strides[0] * k_ndim];"
    entry, text = cuda_cache.program("t", ["q", "k"], ["o"], body, "", [f16, f16], [4, 1], [f16], [])
    params = text[text.index(entry) : text.index(") {")]
    assert params.count("__grid_constant__ int") == 5 and "q_shape_3" in params and "k_shape_0" in params
    line = next(ln for ln in text.splitlines() if "q_strides[4]" in ln)
    values = line.split("{", 1)[1].rsplit("}", 1)[0]
    dims = {f"q_shape_{i}": n for i, n in enumerate((2, 3, 5, 7))}
    assert eval(values.replace("int64_t", ""), {}, dims) == (105, 35, 7, 1)  # (x) * (y): the expressions as C has them
    assert "const int64_t k_strides[1] = {int64_t(1)};" in text and "constexpr int k_ndim = 1;" in text
    inputs = [mx.zeros((2, 3, 5, 7), f16), mx.zeros((9,), f16)]
    assert cuda_cache.shape_scalars(cuda_cache.shape_readers(["q", "k"], body), inputs) == [2, 3, 5, 7, 9]


class FakeNvrtc:
    version = "13.0"

    def __init__(self):
        self.compiled = []

    def compile(self, text, arch, label="program", **_):
        self.compiled.append((label, arch))
        return b"\x7fELF" + label.encode(), ""


@pytest.fixture
def launches(monkeypatch):
    seen = []

    def precompiled(**kw):
        seen.append(kw)
        return [mx.zeros(s, d) for s, d in zip(kw["output_shapes"], kw["output_dtypes"])]

    monkeypatch.setattr(mx.fast, "precompiled_cuda_kernel", precompiled, raising=False)
    return seen


def test_a_program_compiles_once_per_machine_and_launches_with_its_shapes(tmp_path, launches):
    nvrtc = FakeNvrtc()
    compiler = cuda_cache.Compiler(nvrtc, "sm_90", tmp_path)
    kernel = cuda_cache.CachedCudaKernel(compiler, "qmm", gpu_source.INPUTS, gpu_source.OUTPUTS, gpu_source.CUDA_BODY,
                                         gpu_source.CUDA_HEADER)
    w, s, b = mx.quantize(mx.ones((64, 128), f16), group_size=64, bits=4)
    for rows in (1, 1, 3):
        x = mx.zeros((rows, 128), f16)
        kernel(inputs=[x, w, s, b], template=gpu_source.template_args(f16, f16, f16, 64, 4, rows=rows),
               output_shapes=[(rows, 64)], output_dtypes=[f16], grid=(32, 16, 1), threadgroup=(32, 2, 1))
    assert len(nvrtc.compiled) == 2 and compiler.compiles == 2  # row capacities 1 and 4; the second 1-row call reused
    assert [kw["scalars"] for kw in launches] == [[1, 128, 64, 16]] * 2 + [[3, 128, 64, 16]]  # x's and w's shapes
    assert all(kw["ensure_row_contiguous"] and kw["grid"] == (32, 16, 1) for kw in launches)
    assert launches[0]["name"] == launches[1]["name"] != launches[2]["name"]
    assert launches[0]["compiled_source"] == b"\x7fELF" + launches[0]["name"].encode()
    later = cuda_cache.Compiler(FakeNvrtc(), "sm_90", tmp_path)  # another process: read from the store
    again = cuda_cache.CachedCudaKernel(later, "qmm", gpu_source.INPUTS, gpu_source.OUTPUTS, gpu_source.CUDA_BODY,
                                        gpu_source.CUDA_HEADER)
    again(inputs=[mx.zeros((1, 128), f16), w, s, b], template=gpu_source.template_args(f16, f16, f16, 64, 4, rows=1),
          output_shapes=[(1, 64)], output_dtypes=[f16], grid=(32, 16, 1), threadgroup=(32, 2, 1))
    assert later.compiles == 0 and launches[-1]["compiled_source"] == launches[0]["compiled_source"]
    assert cuda_cache.Compiler(FakeNvrtc(), "sm_89", tmp_path).binary(launches[0]["name"], "x") is not None
    assert len(list(tmp_path.iterdir())) == 3  # another architecture: its own entry


def test_what_the_path_cannot_build_goes_to_mlx_s_jit(tmp_path, launches, monkeypatch):
    jit = []
    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda **kw: (jit.append(kw["name"]), lambda **call: ["jit"])[1])
    compiler = cuda_cache.Compiler(FakeNvrtc(), "sm_90", tmp_path)
    with pytest.raises(KernelUnavailable, match="strides"):  # attention's partial reads a view's strides in place
        cuda_cache.CachedCudaKernel(compiler, "partial", ["q"], ["o"], "o[0] = q[q_strides[1]];",
                                    ensure_row_contiguous=False)
    kernel = cuda_cache.CachedCudaKernel(compiler, "wide", ["x"], ["y"], "y[0] = x[0];")
    out = kernel(inputs=[mx.zeros((2,), mx.int64)], output_shapes=[(1,)], output_dtypes=[f32], grid=(32, 1, 1),
                 threadgroup=(32, 1, 1))  # int64: no CUDA type name here
    assert out == ["jit"] and jit == ["wide"] and not launches


def test_without_a_cuda_device_kernels_are_mlx_s_jit_s(monkeypatch):
    """This CPU has no CUDA device: the choice falls to mx.fast.cuda_kernel (looked up at each call), with why."""
    monkeypatch.setattr(cuda_cache, "_MAKER", [])
    make, why = cuda_cache.kernel_maker()
    assert why.startswith("MLX's JIT in each process (")
    made = []
    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda **kw: made.append(kw["name"]) or "kernel")
    assert make(name="k", input_names=["x"], output_names=["y"], source="") == "kernel" and made == ["k"]


def test_on_a_cuda_device_the_path_proves_itself_and_serves_every_family_but_in_place_stride_readers(tmp_path, monkeypatch):
    """kernel_maker's own path, with the device and its launch stood in for: the probe runs through the
    cached kernel (its launch computed here as the probe's program would), then kernels are the store's,
    except those whose body reads the strides of inputs as they lie (MLX's JIT); a probe that comes out wrong keeps MLX's JIT."""
    def precompiled(name, inputs, scalars, **kw):
        assert name.startswith("probe_") and scalars == [inputs[0].shape[0]]
        return [inputs[0] * 3 + scalars[0] + wrong]

    wrong = 0
    monkeypatch.setattr(mx.fast, "precompiled_cuda_kernel", precompiled, raising=False)
    monkeypatch.setattr(mx.fast, "cuda_kernel", lambda **kw: ("jit", kw["name"]))
    stand_in_device(monkeypatch, tmp_path)
    monkeypatch.setattr(cuda_cache, "packer", lambda homes: None)  # cubins (the fatbins: the test below)
    make, how = cuda_cache.kernel_maker()
    assert how == "compiled once per machine (NVRTC 13.0, sm_90)"
    assert isinstance(make(name="qmm", input_names=["x"], output_names=["y"], source="y[0] = x[0];"),
                      cuda_cache.CachedCudaKernel)
    assert make(name="partial", input_names=["q"], output_names=["o"], source="o[0] = q[q_strides[0]];",
                ensure_row_contiguous=False) == ("jit", "partial")
    assert isinstance(make(name="twin", input_names=["q"], output_names=["o"], source="o[0] = q[q_strides[0]];"),
                      cuda_cache.CachedCudaKernel)  # row-contiguous: the strides its shape implies
    assert [p.name.split("_")[0] for p in (tmp_path / "cuda").iterdir()] == ["probe"]  # stored for the next process
    wrong = 1
    monkeypatch.setattr(cuda_cache, "_MAKER", [])
    assert cuda_cache.kernel_maker()[1].startswith("MLX's JIT in each process (KernelUnavailable: the probe")
    monkeypatch.setenv("MLXSPEC_CUDA_CACHE", "0")
    monkeypatch.setattr(cuda_cache, "_MAKER", [])
    assert "MLXSPEC_CUDA_CACHE=0" in cuda_cache.kernel_maker()[1]


def stand_in_device(monkeypatch, tmp_path) -> None:
    """kernel_maker on a CUDA device of sm_90 with NVRTC 13.0 (FakeNvrtc), its store under tmp_path."""
    monkeypatch.setattr(cuda_cache, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(cuda_cache, "load_nvrtc", lambda homes: None)
    monkeypatch.setattr(cuda_cache, "Nvrtc", lambda lib, includes: FakeNvrtc())
    monkeypatch.setattr(cuda_cache, "cache_root", lambda: tmp_path)
    monkeypatch.delenv("MLXSPEC_CUDA_CACHE", raising=False)
    monkeypatch.setattr(cuda_cache, "_MAKER", [])


def test_launches_hand_mlx_compressed_fatbins_and_a_driver_refusing_them_gets_cubins(tmp_path, monkeypatch):
    """With nvFatbin (the packer) a launch hands MLX the packed image (fewer bytes to copy and hash a launch);
    the probe proves the driver loads it, and where it does not (an older driver) the cubins serve."""
    class Packer:
        def pack(self, binary, arch):
            assert arch == "sm_90"
            return b"FATBIN" + binary

    def precompiled(name, inputs, scalars, compiled_source, **kw):
        handed.append(compiled_source)
        if refuse and compiled_source.startswith(b"FATBIN"):
            raise RuntimeError(f"Failed to load compiled {name} kernel")
        return [inputs[0] * 3 + scalars[0]]

    handed, refuse = [], False
    monkeypatch.setattr(mx.fast, "precompiled_cuda_kernel", precompiled, raising=False)
    stand_in_device(monkeypatch, tmp_path)
    monkeypatch.setattr(cuda_cache, "packer", lambda homes: Packer())
    make, how = cuda_cache.kernel_maker()
    assert how == "compiled once per machine (NVRTC 13.0, sm_90, compressed fatbins)"
    assert handed == [b"FATBIN\x7fELF" + handed[0][len(b"FATBIN\x7fELF"):]] and b"probe_" in handed[0]
    refuse = True
    monkeypatch.setattr(cuda_cache, "_MAKER", [])
    make, how = cuda_cache.kernel_maker()
    assert how == "compiled once per machine (NVRTC 13.0, sm_90)"
    assert handed[1].startswith(b"FATBIN") and handed[2] == handed[0][len(b"FATBIN"):]  # tried, refused: the cubin


@pytest.fixture
def compilers(tmp_path, launches, monkeypatch) -> dict:
    """The GPU wrappers' kernels through the stored path with a stand-in NVRTC: kernel name -> its Compiler."""
    from mlxspec.kernels import gpu

    made = {}

    def stored(**kw):
        made[kw["name"]] = cuda_cache.Compiler(FakeNvrtc(), "sm_90", tmp_path / kw["name"])
        return cuda_cache.CachedCudaKernel(made[kw["name"]], kw["name"], kw["input_names"], kw["output_names"],
                                           kw["source"], kw.get("header", ""))

    monkeypatch.setattr(gpu, "require_cuda", lambda: None)
    monkeypatch.setattr(gpu, "cuda_kernel", stored)
    return made


def test_gather_and_dense_self_checks_compile_their_row_counts_at_once(compilers):
    """MoE layers: the gather's one-row build and the grouped gather's row capacities (a verify pass gives an
    expert up to 16 rows) in each activation dtype compile at the self-check; layer calls compile none. So do
    the dense kernel's row capacities (float heads and layers)."""
    from mlxspec.kernels import gpu, registry

    gather = gpu.cuda_gather_qmm_function()
    registry.gather_self_check(gather, 40, 128, 64, 4, f16)
    prepared = {name: c.compiles for name, c in compilers.items()}
    assert prepared == {gpu_source.GATHER_NAME: 2, gpu_source.GROUPED_NAME: 2 * 4}  # f16, f32; capacities 2-16
    w, s, b = (mx.stack([a] * 3) for a in mx.quantize(mx.ones((40, 128), f16), group_size=64, bits=4))
    for dtype in (f16, f32):
        x, ids = mx.zeros((16, 128), dtype), mx.zeros((16,), mx.uint32)
        gather(x, w, s, b, ids, 64, 4)
        for per_expert in range(2, 17):
            gather(x, w, s, b, ids, 64, 4, per_expert=per_expert)
    assert {name: c.compiles for name, c in compilers.items()} == prepared
    from mlxspec.kernels import dense

    dense_fn = gpu.cuda_dense_function()
    dense.self_check(dense_fn, 40, 128, bf16)
    assert compilers[gpu_source.DENSE_NAME].compiles == 5  # row capacities 1 to 16
    for rows in range(1, 17):
        dense_fn(mx.zeros((rows, 128), bf16), mx.zeros((40, 128), bf16))
    assert compilers[gpu_source.DENSE_NAME].compiles == 5


@pytest.mark.parametrize("family", ["qmm", "qmm-mma"])
def test_a_self_check_compiles_a_layout_s_programs_at_once_and_layers_compile_none(compilers, family):
    """The registry's qmm self-check first has the kernel compile every launch a layer of that layout will
    make (row capacities 1-16 in each activation dtype; for the tensor cores every tile build up to the
    check's 72 rows, float32 rows going to the FMA kernel), on threads; the check and every later call of
    1 to 16 rows then find their programs built."""
    from mlxspec.kernels import gpu, registry

    qmm = gpu.cuda_qmm_function() if family == "qmm" else gpu.cuda_mma_qmm_function(gpu.cuda_qmm_function())
    registry.self_check(qmm, 40, 128, 64, 4, f16, rows=registry.CHECK_ROWS if family == "qmm" else registry.MMA_CHECK_ROWS)
    prepared = {name: c.compiles for name, c in compilers.items()}  # (the stand-in launches give zeros: it fails)
    assert sum(prepared.values()) == (10 if family == "qmm" else 5 + 3)  # 5 capacities x 2 dtypes; 3 tile builds + f32's
    w, s, b = mx.quantize(mx.ones((40, 128), f16), group_size=64, bits=4)
    for rows in (*range(1, 17), 72):
        for dtype in (f16, f32):
            qmm(mx.zeros((rows, 128), dtype), w, s, b, 64, 4)
    assert {name: c.compiles for name, c in compilers.items()} == prepared
