"""The CUDA programs mlxspec generates compile with NVRTC, the compiler MLX's `mx.fast.cuda_kernel`
runs on the device, for an H100 (sm_90), without spills: checked here without a GPU.

The emulator tests (test_gpu_sources.py) compile the same programs with g++ and check their arithmetic.
This checks what g++ cannot: CUDA's own headers and types, and the compiler's register allocation.
One program per family and code path runs here (~10 s); `python benchmarks/cuda_static.py` compiles
every layout and row capacity and reports registers and the loops' instruction mix.
"""

from __future__ import annotations

import pytest

from benchmark_scripts import load
from mlxspec.kernels import gpu_mma_source

cuda_static = load("cuda_static")

ROOT = cuda_static.nvidia_root()
pytestmark = pytest.mark.skipif(ROOT is None, reason="NVRTC not installed (nvidia-cuda-nvrtc: [dev] extra, Linux x86_64)")

PROGRAMS = [  # every family; qmm's three code paths (4/8 bits, the 2/3/5/6-bit stream, mxfp4)
    "qmm float16 q4 g64 affine", "qmm float32 q5 g32 affine", "qmm bfloat16 q4 g32 mxfp4",
    "qmm-mma float16 q4 g64", "qmm-mma bfloat16 q4 g128",  # tensor cores: mma.sync's inline PTX, f16 and bf16
    "qmm-mma float16 q6 g32",  # and their bit-stream path (2/3/5/6 bits)
    "gather float16 q4 g64 affine", "gather bfloat16 q4 g32 mxfp4", "dense bfloat16",
    "grouped float16 q4 g64 affine", "grouped bfloat16 q4 g32 mxfp4",  # MoE verify: an expert's rows together
    "sdpa q float16 kv float16 D128 1 heads a warp",  # the wrapper's build for Llama's head dim 128 (the 8-dims-a-lane
    "sdpa q float32 kv float16 sinks", "accept greedy float16", "accept rejection float32",  # one: ~4x the compile)
    "sdpa-mma float16 D128",  # the tensor-core attention at Llama's head dim
]
ONE_ROW_REGISTERS = 96  # a decoding step's kernel keeps >= 21 of an H100 SM's 64 warps resident


@pytest.fixture(scope="module")
def compiled():
    nvrtc = cuda_static.Nvrtc(ROOT, cuda_static.stand_in_headers())
    return cuda_static.compile_all(nvrtc, ["sm_90"], rows=(1, 16), labels=PROGRAMS)


def test_every_family_compiles_for_sm90(compiled):
    assert sorted(r.label for r in compiled) == sorted(PROGRAMS)
    errors = {r.label: r.error for r in compiled if r.error}
    assert not errors, errors


def test_no_kernel_spills_registers(compiled):
    kernels = {name: k for r in compiled for name, k in r.kernels.items()}
    assert len(kernels) >= 2 * 3 + 2 * 3 + 2 + 2 + 4 + 2  # qmm 1 and 16 rows x3, mma 1/2/4 tiles x2, gathers, dense, sdpa, accept
    spills = {name: k["spill_bytes"] for name, k in kernels.items() if k["spill_bytes"]}
    assert not spills, spills


def test_one_row_matmuls_keep_occupancy(compiled):
    """Plain decoding's launches (qmm and dense at row capacity 1, every MoE gather row, the tensor-core
    qmm with one row tile) must not hold the registers of a 16-row launch (what made the first CUDA
    qmm slow)."""
    one_row = {name: k["registers"] for r in compiled for name, k in r.kernels.items()
               if r.label.split()[0] in ("qmm", "gather", "dense") and name.endswith("_1")}
    assert len(one_row) == 6, one_row
    step = f"_{gpu_mma_source.TILES}_1_{gpu_mma_source.KSPLIT}"  # tensor cores: the layers' build, 1 row tile
    steps = {name: k["registers"] for r in compiled for name, k in r.kernels.items()
             if r.label.startswith("qmm-mma") and name.endswith(step)}
    assert len(steps) == 3, steps  # f16 and bf16 at 4 bits, f16 at 6
    heavy = {name: regs for name, regs in (one_row | steps).items() if regs > ONE_ROW_REGISTERS}
    assert not heavy, heavy


def test_tensor_core_kernels_issue_mma_instructions(compiled):
    """The inline PTX reaches the hardware's HMMA (sm_90), not an emulation; checked in the cubin."""
    if cuda_static.nvidia_root() is None or not (cuda_static.nvidia_root() / "bin" / "cuobjdump").exists():
        pytest.skip("cuobjdump / nvdisasm not installed (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")
    mma = [r for r in compiled if r.label.startswith(("qmm-mma", "sdpa-mma"))]
    assert len(mma) == 4
    cuda_static.add_sass(mma, ROOT / "bin")
    for r in mma:
        for name, loops in r.sass.items():
            if "combine" not in name:  # the attention's combine: plain float32 arithmetic
                assert sum(lp["mix"].get("HMMA", 0) for lp in loops) > 0, (name, loops)


def test_stored_qmm_binaries_stay_small():
    """MLX hashes a precompiled kernel's binary at every launch (~0.37 us a KB on an H200): the FMA qmm's copy for
    an unaligned x stays rolled (gpu_source._compact), so its one-row binary is ~23 KB, not the 34 of two unrolled copies."""
    nvrtc = cuda_static.Nvrtc(ROOT, cuda_static.stand_in_headers())
    sizes = cuda_static.stored_binaries(nvrtc, only="float32 x, q4 g32, 1 row")  # GGUF models' steps
    assert len(sizes) == 1 and 0 < sizes[0][1] < 28 * 1024, sizes
    assert sizes[0][2] is None or sizes[0][2] < 10 * 1024, sizes  # as a launch hands it over: a compressed fatbin
