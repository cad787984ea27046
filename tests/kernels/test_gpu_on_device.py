"""The GPU kernels through mx.fast on a real Metal or CUDA device (skipped where there is none).

The emulator tests check the sources; these check what MLX compiles on the device: results within
tolerance and every row of a 16-row call bit-identical to its 1-row call (the GPU compiler may not
change that, e.g. by contracting or reordering differently per row).
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxspec.kernels.attention import attention_within_tolerance
from mlxspec.kernels.attention import self_check as attention_self_check
from mlxspec.kernels.reference import dense_within_tolerance
from mlxspec.kernels.registry import self_check

BACKENDS = (["metal"] if mx.metal.is_available() else []) + (
    ["cuda"] if hasattr(mx, "cuda") and mx.cuda.is_available() else [])
pytestmark = pytest.mark.skipif(not BACKENDS, reason="no Metal or CUDA device")


def kernels(backend: str):
    from mlxspec.kernels import gpu, gpu_attention

    if backend == "metal":
        return gpu.metal_qmm_function(), gpu.metal_dense_function(), gpu_attention.metal_sdpa_function()
    return gpu.cuda_qmm_function(), gpu.cuda_dense_function(), gpu_attention.cuda_sdpa_function()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n, k, group_size, bits, dtype",
                         [(300, 1024, 64, 4, mx.float16), (130, 2048, 32, 8, mx.bfloat16), (64, 4096, 128, 4, mx.float16)])
def test_qmm_on_device(backend, n, k, group_size, bits, dtype):
    assert self_check(kernels(backend)[0], n, k, group_size, bits, dtype) is None


@pytest.mark.skipif("cuda" not in BACKENDS, reason="tensor cores: CUDA only")
@pytest.mark.parametrize("tiles", [1, 2, None])  # None: the default, 1 or 2 by the row count
@pytest.mark.parametrize("n, k, group_size, bits, dtype",
                         [(300, 1024, 64, 4, mx.float16), (130, 2048, 32, 8, mx.bfloat16), (64, 4096, 128, 4, mx.bfloat16),
                          (130, 1024, 32, 6, mx.float16), (300, 2048, 32, 5, mx.bfloat16)])  # the bit-stream path
def test_tensor_core_qmm_on_device(n, k, group_size, bits, dtype, tiles):
    """Within tolerance, and rows of a many-row call equal to one-row calls: on the hardware's mma
    (whose row independence PTX does not document), for every tile count (the same bits; by default a
    one-row call takes 1 tile and the 200-row call 2), with 1 to 8
    row tiles a warp (a 16-, 40- and 200-row call: several row blocks)."""
    from mlxspec.kernels import gpu

    qmm = gpu.cuda_mma_qmm_function(gpu.cuda_qmm_function(), tiles)
    assert self_check(qmm, n, k, group_size, bits, dtype) is None
    x = mx.random.normal((200, k), key=mx.random.key(9)).astype(dtype)
    w, s, b = mx.quantize(mx.random.normal((n, k), key=mx.random.key(8)).astype(dtype), group_size=group_size, bits=bits)
    y = qmm(x, w, s, b, group_size, bits)
    assert mx.array_equal(y, gpu.cuda_mma_qmm_function(None, 2)(x, w, s, b, group_size, bits)).item(), "tiles change bits"
    for lo, hi in ((0, 16), (16, 56)):
        assert mx.array_equal(qmm(x[lo:hi], w, s, b, group_size, bits), y[lo:hi]).item(), f"rows {lo}:{hi}"
    for i in range(16):
        assert mx.array_equal(qmm(x[i : i + 1], w, s, b, group_size, bits)[0], y[i]).item(), f"row {i}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bits, dtype", [(4, mx.float16), (8, mx.bfloat16), (6, mx.float16)])
def test_qmm_takes_x_at_any_offset_on_device(backend, bits, dtype):
    """x as a view 1 element and 8 bytes past 16-byte alignment (a slice of a larger array): every qmm
    gives the aligned x's bits, and none faults on a misaligned vector load."""
    from mlxspec.kernels import gpu

    if backend == "metal":
        qmms = {"fma": gpu.metal_qmm_function(), "matrix": gpu.metal_mma_qmm_function()}
    else:
        qmms = {"fma": gpu.cuda_qmm_function(), "matrix": gpu.cuda_mma_qmm_function()}
    k = 1024
    w, s, b = mx.quantize(mx.random.normal((96, k), key=mx.random.key(3)).astype(dtype), group_size=64, bits=bits)
    x = mx.random.normal((3, k), key=mx.random.key(4)).astype(dtype)
    for offset in (1, 8 // x.itemsize):
        flat = mx.concatenate([mx.zeros((offset,), dtype), x.reshape(-1)])
        for rows in (1, 3):
            view = flat[offset : offset + rows * k].reshape(rows, k)  # x's values, `offset` elements into a buffer
            for name, qmm in qmms.items():
                got, want = qmm(view, w, s, b, 64, bits), qmm(x[:rows], w, s, b, 64, bits)
                assert mx.array_equal(got, want).item(), f"{name}: x at +{offset} elements, {rows} rows"


@pytest.mark.skipif("metal" not in BACKENDS, reason="simdgroup matrices: Metal only")
@pytest.mark.parametrize("ksplit", [4, 2, 8])
@pytest.mark.parametrize("n, k, group_size, bits, dtype",
                         [(300, 1024, 64, 4, mx.float16), (130, 2048, 32, 8, mx.bfloat16), (64, 4096, 128, 4, mx.float32),
                          (130, 1024, 32, 6, mx.float16), (300, 2048, 32, 5, mx.bfloat16)])  # the bit-stream path
def test_simdgroup_qmm_on_device(n, k, group_size, bits, dtype, ksplit):
    """Within tolerance, and rows of a many-row call equal to one-row calls, on Apple's simdgroup matrices
    (whose per-element summation Metal does not document); 1 or 2 row tiles a simdgroup, several row blocks."""
    from mlxspec.kernels import gpu
    from mlxspec.kernels.registry import MMA_CHECK_ROWS

    qmm = gpu.metal_mma_qmm_function(gpu.metal_qmm_function(), ksplit=ksplit)
    assert self_check(qmm, n, k, group_size, bits, dtype, rows=MMA_CHECK_ROWS) is None
    x = mx.random.normal((40, k), key=mx.random.key(9)).astype(dtype)
    w, s, b = mx.quantize(mx.random.normal((n, k), key=mx.random.key(8)).astype(mx.float16), group_size=group_size,
                          bits=bits)
    s, b = s.astype(dtype), b.astype(dtype)
    y = qmm(x, w, s, b, group_size, bits)
    for lo, hi in ((0, 8), (8, 24)):
        assert mx.array_equal(qmm(x[lo:hi], w, s, b, group_size, bits), y[lo:hi]).item(), f"rows {lo}:{hi}"
    for i in range(16):
        assert mx.array_equal(qmm(x[i : i + 1], w, s, b, group_size, bits)[0], y[i]).item(), f"row {i}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
def test_dense_on_device(backend, dtype):
    dense = kernels(backend)[1]
    w = mx.random.normal((301, 1000), key=mx.random.key(0)).astype(dtype)
    x = mx.random.normal((16, 1000), key=mx.random.key(1)).astype(dtype)
    y = dense(x, w)
    ok, ratio = dense_within_tolerance(y, x, w)
    assert ok, f"error {ratio:.3g}x the tolerance"
    for i in range(16):
        assert mx.array_equal(dense(x[i : i + 1], w)[0], y[i]).item(), f"row {i}"


def sdpa_of(backend: str, family: str):
    """The FMA attention ("sdpa") or the matrix-unit one ("sdpa-mma": tensor cores, simdgroup matrices)."""
    from mlxspec.kernels import gpu_attention

    if family == "sdpa":
        return kernels(backend)[2]
    return gpu_attention.cuda_sdpa_mma_function() if backend == "cuda" else gpu_attention.metal_sdpa_simdgroup_function()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ["sdpa", "sdpa-mma"])
@pytest.mark.parametrize("heads, kv_heads, dim, length", [(8, 2, 128, 600), (4, 4, 64, 257), (8, 2, 128, 2100)])
def test_sdpa_on_device(backend, family, heads, kv_heads, dim, length):
    sdpa = sdpa_of(backend, family)
    assert attention_self_check(sdpa, heads, kv_heads, dim, dim, mx.float16) is None
    assert sdpa.trees, "the kernel's tree rows failed their self-check (tree passes would stay off)"
    if backend == "cuda":  # the row-contiguous twins (stored once per machine) gave the in-place builds' bits
        from mlxspec.kernels import cuda_cache

        assert sdpa.stored_buffers == cuda_cache.detail().startswith("compiled once per machine"), cuda_cache.detail()
    kq, kk, kv = mx.random.split(mx.random.key(length), 3)
    m = 16
    q = mx.random.normal((1, heads, m, dim), key=kq).astype(mx.bfloat16)
    k = mx.random.normal((1, kv_heads, length, dim), key=kk).astype(mx.bfloat16)
    v = mx.random.normal((1, kv_heads, length, dim), key=kv).astype(mx.bfloat16)
    y = sdpa(q, k, v, dim**-0.5, True)
    ok, ratio = attention_within_tolerance(y, q, k, v, dim**-0.5, True)
    assert ok, f"error {ratio:.3g}x the tolerance"
    for i in range(m):  # rows cross the key chunks' boundaries differently
        seen = length - m + i + 1
        one = sdpa(q[:, :, i : i + 1], k[:, :, :seen], v[:, :, :seen], dim**-0.5, False)
        assert mx.array_equal(one[:, :, 0], y[:, :, i]).item(), f"row {i}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ["sdpa", "sdpa-mma"])
@pytest.mark.parametrize("length", [300, 2100])  # 2,100: warps that serve several query heads
def test_sdpa_tree_rows_on_device(backend, family, length):
    """A draft tree's pass (16 nodes, the last 16 keys): row m = a one-row call over the keys before the
    tree and its path's nodes, bit for bit, within tolerance."""
    from mlxspec.kernels.tree_mask import tree_rows
    from mlxspec.tree import path_to

    sdpa, parents = sdpa_of(backend, family), [-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 4, 8, 9, 7, 12, 10]
    kq, kk, kv = mx.random.split(mx.random.key(length + 1), 3)
    q = mx.random.normal((1, 8, 16, 128), key=kq).astype(mx.float16)
    k = mx.random.normal((1, 2, length, 128), key=kk).astype(mx.float16)
    v = mx.random.normal((1, 2, length, 128), key=kv).astype(mx.float16)
    start = length - 16
    y = sdpa(q, k, v, 128**-0.5, True, tree=tree_rows(tuple(parents), start))
    for m in range(16):
        seen = mx.array(list(range(start)) + [start + node for node in path_to(parents, m)])
        one = sdpa(q[:, :, m : m + 1], k[:, :, seen], v[:, :, seen], 128**-0.5, False)
        ok, ratio = attention_within_tolerance(y[:, :, m : m + 1], q[:, :, m : m + 1], k[:, :, seen], v[:, :, seen],
                                               128**-0.5, False)
        assert ok, f"row {m}: error {ratio:.3g}x the tolerance"
        assert mx.array_equal(one, y[:, :, m : m + 1]).item(), f"row {m}"


@pytest.mark.skipif("cuda" not in BACKENDS, reason="the kernel store: CUDA only")
def test_cuda_kernels_are_compiled_once_per_machine_with_the_bits_of_mlx_s_jit():
    """kernels/cuda_cache.py on the device: its probe passed (the store is in use), and the qmm it builds
    gives the bits of the same program compiled by MLX's JIT, at 1, 5 and 16 rows."""
    from mlxspec.kernels import cuda_cache, gpu
    from mlxspec.kernels.gpu_source import CUDA_BODY, CUDA_HEADER, INPUTS, NAME, OUTPUTS

    how = cuda_cache.detail()
    assert how.startswith("compiled once per machine"), how
    jit = gpu._qmm_function(mx.fast.cuda_kernel(name=NAME, input_names=INPUTS, output_names=OUTPUTS, source=CUDA_BODY,
                                                header=CUDA_HEADER))
    stored = gpu.cuda_qmm_function()
    w, s, b = mx.quantize(mx.random.normal((300, 1024), key=mx.random.key(1)).astype(mx.float16), group_size=64, bits=4)
    for rows in (1, 5, 16):
        x = mx.random.normal((rows, 1024), key=mx.random.key(rows)).astype(mx.float16)
        assert mx.array_equal(stored(x, w, s, b, 64, 4), jit(x, w, s, b, 64, 4)).item(), rows
