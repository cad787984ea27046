"""The matrix-unit attention under the CPU emulator: CUDA's tensor cores (gpu_attention_mma_source.py) and its
Metal twin on simdgroup matrices (gpu_attention_simdgroup_source.py).

The harness is the FMA family's (attention_harness.py): every launch within the reference's tolerance, and
rows of M-row launches (causal, unmasked, windowed, over a whole buffer with L keys counting, a draft tree's
pass) bit-identical to 1-row launches over their own keys. The emulator's mma adds each output's products in
k order (the hardware's order is its own); what the tests hold is that an output depends on its own row of A
only, which is what the device's self-check tests there. CHUNK is 32 here (128 in production, the same code).
test_gpu_attention_edges.py runs both families' launches as the wrappers make them (under ASan): wide loads vs one
value at a time on strided / misaligned views, and one-chunk (direct) launches vs partial + combine, bit for bit.
The emulator's simdgroup matrices sum each output's 8 products in k order, likewise.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from attention_harness import (CUDA_COMBINE, CUDA_PARTIAL, HARNESS, METAL_COMBINE, METAL_PARTIAL, ODD, PARTIAL_OUTS,
                               check_attention)
from emulator_harness import C_TYPES, CXX, build_all, case_id
from mlxspec.kernels import gpu_attention_mma_source as src
from mlxspec.kernels import gpu_attention_simdgroup_source as metal

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

CHUNK = 32
CASES = [  # (backend, q dtype, kv dtype, sinks, H, HKV, D, DV, L, window, softcap)
    ("cuda", mx.float16, mx.float16, False, 4, 1, 32, 32, 140, 100, 0.0),  # 64 slots a kv head: 4 tiles of rows mixed
    ("cuda", mx.bfloat16, mx.bfloat16, True, 2, 1, 64, 48, 70, 128, 0.0),  # sinks; a window longer than the cache
    ("cuda", mx.float16, mx.float16, False, 4, 2, 64, 64, 70, 40, 2.0),  # Gemma 2's capped scores (a low cap)
    ("cuda", mx.bfloat16, mx.bfloat16, False, 8, 1, 128, 128, 40, 20, 0.0),  # head dims 128; rows alone over <= 32
    # keys run the direct build, rows of the 16-row launch partial + combine; windows of 20 keys: direct
    ("cuda", mx.float16, mx.float16, False, 32, 1, 16, 16, 70, 37, 0.0),  # 32 heads a kv head: 2 tiles of one row
]
METAL_CASES = [  # float32 matrices: any of MLX's float dtypes, float32 queries over a float16 cache, heads to 256
    ("metal", mx.float32, mx.float32, False, 4, 2, 64, 64, 140, 70, 0.0),  # 16 slots a kv head: 2 tiles
    ("metal", mx.float16, mx.float16, True, 2, 1, 64, 48, 70, 128, 0.0),  # sinks
    ("metal", mx.bfloat16, mx.bfloat16, False, 4, 2, 32, 32, 40, 20, 2.0),  # Gemma 2's capped scores
    ("metal", mx.float32, mx.float16, False, 9, 1, 256, 256, 40, 20, 0.0),  # GGUF's cache; head dims 256; 2 tiles a row
]
METAL_CALL = METAL_PARTIAL.replace("<T, CH, {heads}, DPL_, {tree}, WARPS_, 1>", "<T, KT, CH, {dk}, {dn}, {tree}>")


def harness(case) -> str:
    backend, dtype, kv_dtype, sinks, _, _, d, dv, *_ = case
    if backend == "metal":
        mod, call, combine = metal, METAL_CALL, METAL_COMBINE
        names, source = metal.program(dtype, kv_dtype, d, dv, CHUNK, sinks)
    else:
        mod, call, combine = src, CUDA_PARTIAL, CUDA_COMBINE
        names, source = src.program(dtype, d, dv, CHUNK, sinks)
    fmt = dict(p=names["partial"], outs=PARTIAL_OUTS, dk=d // (16 if mod is src else 8), dn=dv // 8, tree=0)
    tree = dict(fmt, p=names["partial_tree"], tree=1)
    direct = "std::abort();" if sinks else call.format(**dict(fmt, p=names["direct"], outs="o.data()"))
    direct_tree = "std::abort();" if sinks else call.format(**dict(tree, p=names["direct_tree"], outs="o.data()"))
    return HARNESS.format(source=source, T=C_TYPES[dtype], KT=C_TYPES[kv_dtype], chunk=CHUNK, odd=ODD, heads=mod.SLOTS,
                          dpl=0, warps=1, tree_row=src.TREE_ROW, tree_heads=mod.SLOTS, partial=call.format(**fmt),
                          partial_tree=call.format(**tree), direct=direct, direct_tree=direct_tree,
                          combine=combine.format(c=names["combine"], sinks=int(sinks)), sinks=str(sinks).lower(),
                          direct_chunks=1)


@pytest.fixture(scope="module")
def exes() -> dict:
    return dict(zip(map(case_id, CASES + METAL_CASES), build_all([harness(c) for c in CASES + METAL_CASES])))


@pytest.mark.parametrize("case", CASES + METAL_CASES, ids=map(case_id, CASES + METAL_CASES))
def test_matrix_unit_attention_matches_reference_and_is_row_invariant(tmp_path, exes, case):
    check_attention(tmp_path, exes[case_id(case)], case)


def test_the_family_takes_only_what_it_computes():
    assert src.supports(mx.float16, mx.float16, 128, 128) and src.supports(mx.bfloat16, mx.bfloat16, 64, 48)
    assert not src.supports(mx.float32, mx.float32, 128, 128)  # the mma's inputs are 16-bit
    assert not src.supports(mx.float16, mx.bfloat16, 128, 128)
    assert not src.supports(mx.float16, mx.float16, 72, 64)  # D in 16-dim mma steps
    assert not src.supports(mx.float16, mx.float16, 64, 40)  # DV in pairs of 8-dim tiles (a lane's dims: whole words)
    assert not src.supports(mx.float16, mx.float16, 256, 256)  # Q's and O's fragments a lane past 128
    assert src.tiles(32, 8, 1, True) == 8 and src.tiles(32, 8, 16, True) == 32  # 4 heads x 16 rows: 4 tiles
    assert src.tiles(32, 8, 16, False) == 128 and src.tiles(64, 2, 1, False) == 4  # one row a tile; 32 heads: 2
    assert metal.supports(mx.float32, mx.float16, 256, 256) and metal.supports(mx.bfloat16, mx.bfloat16, 8, 8)
    assert not metal.supports(mx.float16, mx.float32, 64, 64) and not metal.supports(mx.float16, mx.float16, 64, 60)
    assert metal.tiles(32, 8, 1, True) == 8 and metal.tiles(32, 8, 16, True) == 64  # 8 slots a simdgroup
