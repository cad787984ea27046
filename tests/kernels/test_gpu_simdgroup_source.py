"""The Metal simdgroup-matrix qmm (gpu_simdgroup_source.py), checked as far as a Linux CPU allows.

The full Metal program is compiled with g++ under the emulator, whose simdgroup_matrix follows the lane
layout MLX's steel kernels rely on with its own summation order, and whose threadgroups share memory
and meet at threadgroup_barrier. It must come within the reference tolerance, and each row must be
bit-identical across every build with the same K split (1, 2 or 4 column tiles, 1 or 2 row tiles),
each row launched alone, and a 7-row launch. The registry's self-check repeats this on the user's Mac.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from emulator_harness import CXX, build_all, case_id, check_matrix_qmm, matrix_qmm_harness
from mlxspec.kernels import gpu_simdgroup_source as src
from mlxspec.kernels.gpu_codegen import METAL_TYPES
from mlxspec.kernels.reference import output_dtype

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

CASES = [  # (x dtype, scales dtype, group size, bits)
    (mx.float16, mx.float16, 64, 4),  # 6 groups of 2 blocks: simdgroups 0-3 take 3 blocks each
    (mx.bfloat16, mx.bfloat16, 32, 8),
    (mx.float32, mx.float16, 128, 4),  # float32 x: exact in the float32 matrices
    (mx.float32, mx.bfloat16, 64, 8),
    # the bit-stream widths: a lane's two codes in one word (2 bits) or straddling two (3, 5, 6 bits)
    (mx.float16, mx.float16, 32, 6),  # a GGUF's Q6_K (requantized, group 32)
    (mx.bfloat16, mx.bfloat16, 32, 5),
    (mx.float32, mx.float16, 64, 3),
    (mx.float16, mx.float16, 128, 2),
]
BUILDS = [(2, 1, 4), (1, 1, 4), (4, 1, 4), (2, 2, 4), (1, 2, 4),  # (8-column tiles, 8-row tiles, K split)
          (2, 1, 1), (2, 2, 1), (2, 1, 8), (1, 2, 8)]  # other K splits: other bits, each row-invariant
M, ODD = 40, (9, 7)  # a 40-row launch, each row alone, rows [9, 16) as one 7-row launch
N, K = 19, 384  # N: partial column tiles; K: 3 groups of 128, 12 of 32

CASE = "      case {i}: {name}<{targs}>(x, xs, w, ws, s, b, y.data(), in_group, group); break;"


def code(x_dtype, s_dtype, group_size: int, bits: int) -> str:
    out = output_dtype(x_dtype, s_dtype)
    names, source = src.metal_source(x_dtype, s_dtype, out, group_size, bits, builds=BUILDS)
    cases = []
    for i, (name, (tiles, rt, ksplit)) in enumerate(zip(names, BUILDS)):
        targs = src.template_args(x_dtype, s_dtype, out, group_size, bits, tiles, 8 * rt, ksplit)
        cases.append(CASE.format(i=i, name=name, targs=", ".join(METAL_TYPES[v] if isinstance(v, mx.Dtype) else str(v)
                                                                  for _, v in targs)))
    return matrix_qmm_harness(
        (x_dtype, s_dtype, group_size, bits), BUILDS, ODD, source=source, cols=8, cases="\n".join(cases), extra="",
        shapes=f"int xs[2] = {{M, K}}, ws[2] = {{N, K * {bits} / 32}};",
        ids="const uint3 in_group{unsigned(lane), unsigned(part), 0}, group{0, unsigned(by), unsigned(bz)};")


@pytest.fixture(scope="module")
def exes() -> dict:
    return dict(zip(CASES, build_all([code(*c) for c in CASES])))


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_simdgroup_qmm_matches_reference_and_rows_are_invariant(tmp_path, exes, case):
    check_matrix_qmm(tmp_path, exes[case], case, BUILDS, M, N, K, ODD)


def test_supports_only_what_the_source_handles():
    assert src.supports(mx.float16, 64, 4) and src.supports(mx.bfloat16, 128, 8) and src.supports(mx.float32, 32, 4)
    assert all(src.supports(mx.bfloat16, 32, bits) for bits in (2, 3, 5, 6))  # the bit-stream path
    assert not src.supports(mx.float16, 32, 4, "mxfp4") and not src.supports(mx.float16, 16, 4)


def test_launch_covers_every_column_and_row_with_the_template_it_names():
    for rows in (1, 7, 8, 9, 16, 17, 40):
        for tiles, ksplit in ((1, 1), (2, 4), (4, 8)):
            targs = dict(src.template_args(mx.float16, mx.float16, mx.float16, 64, 4, tiles, rows, ksplit))
            grid, group = src.launch(rows, 4100, tiles, ksplit).values()
            assert group == (32, ksplit, 1) and grid[1] % ksplit == 0
            assert grid[1] // ksplit * 8 * targs["TILES"] >= 4100 > (grid[1] // ksplit - 1) * 8 * targs["TILES"]
            assert grid[2] * 8 * targs["RT"] >= rows > (grid[2] - 1) * 8 * targs["RT"]
            assert targs["KSPLIT"] * targs["RT"] * targs["TILES"] * 2 * 32 * 4 <= 32 * 1024  # Metal's threadgroup memory
