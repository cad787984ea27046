"""benchmarks/prebuild_store.py fills the CUDA kernel store without a GPU, with the programs a device's launches look up.

Here with pip's NVRTC (the [dev] extra's; the script itself fetches the device image's 13.0): a store built for a
layout, then a fresh compiler over it and the real wrappers called as a model's layers and a round's acceptance call
them, and the attention over a compiled step's cache buffers. Every launch finds its program stored (nothing compiles a second time), and the archive holds the store's files
at its top, as device_check.sh unpacks it.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import mlx.core as mx
import pytest

from benchmark_scripts import load
from mlxspec.kernels import cuda_cache
from mlxspec.kernels.reference import random_quantized

prebuild = load("prebuild_store")
F16, F32 = mx.float16, mx.float32


@pytest.fixture(scope="module")
def nvrtc():
    homes = [r for r in cuda_cache.nvidia_roots() if (r / "lib" / "libnvrtc.so.13").exists()]
    if not homes:
        pytest.skip("NVRTC not installed (nvidia-cuda-nvrtc: [dev] extra, Linux x86_64)")
    return cuda_cache.Nvrtc(cuda_cache.load_nvrtc(homes), cuda_cache.include_paths(homes))


def test_a_prebuilt_store_serves_every_launch_of_its_layouts(nvrtc, tmp_path):
    store = tmp_path / "store"
    built = prebuild.build(cuda_cache.Compiler(nvrtc, "sm_90", store), layouts=[(F16, 64, 4, "affine")], gathers=[],
                           dtypes=(F16,), attention=[(4, 2, 32, F16)], chunks=(), capacities=(256,))
    assert built >= 10 and len(list(store.glob("*.bin"))) == built
    prebuild.pack(store, tmp_path / "kernel-store.tar.gz")
    with tarfile.open(tmp_path / "kernel-store.tar.gz") as tar:
        assert sorted(tar.getnames()) == sorted(p.name for p in store.glob("*.bin"))

    device = cuda_cache.Compiler(nvrtc, "sm_90", store)  # a later process on the device, over the unpacked store
    k, made = prebuild.wrappers(device)
    w, s, b = random_quantized(96, 128, 64, 4, F16)
    for rows, dtype in ((1, F16), (3, F16), (16, F16), (2, F32)):  # steps, verify passes, float32 rows
        x = mx.zeros((rows, 128), dtype)
        k["qmm"](x, w, s, b, 64, 4)
        k["tensor-core"](x, w, s, b, 64, 4)
        k["tensor-core"].with_ksplit(2)(x, w, s, b, 64, 4)
    k["dense"](mx.zeros((5, 64), F16), mx.zeros((32, 64), F16))
    k["greedy"](mx.zeros((4, 64), F16), mx.arange(3, dtype=mx.uint32))
    k["rejection"](mx.zeros((4, 64), F16), mx.zeros((3, 64), F16), mx.arange(3, dtype=mx.uint32), mx.zeros((4,)))
    kv = mx.zeros((1, 2, 256, 32), F16)  # a compiled step's cache buffers: the attention's row-contiguous twins
    for rows in (1, 5):
        k["sdpa"](mx.zeros((1, 4, rows, 32), F16), kv, kv, 0.2, True, length=mx.array([100]))
    looked_up = sum(len(kernel._built) for kernel in made)
    assert looked_up >= 10 and device.compiles == 0, f"{device.compiles} of {looked_up} launches compiled anew"
