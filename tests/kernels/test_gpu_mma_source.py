"""The tensor-core qmm (gpu_mma_source.py), checked as far as a Linux CPU allows.

The full CUDA program is compiled with g++ under the emulator, whose mma follows the PTX ISA's
fragment layout with its own summation order, and whose threadgroups share memory and meet at
__syncthreads. It must come within the reference tolerance, and each row must be bit-identical
across every build (1 or 2 column tiles, 1 to 8 row tiles: one to five row blocks of a 40-row
launch), each row launched alone, a 7-row launch, and x at an unaligned address.
tests/kernels/test_cuda_nvrtc.py compiles the real mma instruction with NVRTC; the registry's
self-check repeats all this on the device.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from emulator_harness import CXX, build_all, case_id, check_matrix_qmm, matrix_qmm_harness
from mlxspec.kernels import gpu_mma_source as src
from mlxspec.kernels.reference import output_dtype

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

CASES = [  # (x dtype, scales dtype, group size, bits)
    (mx.float16, mx.float16, 64, 4),  # 6 groups: warps 0, 1 take two, warps 2, 3 one
    (mx.bfloat16, mx.bfloat16, 32, 8),
    (mx.bfloat16, mx.bfloat16, 64, 4),  # 4 bits: codes become bfloat16 through 128 + q
    (mx.float16, mx.float32, 128, 4),  # 3 groups: the fourth warp has none
    # the bit-stream widths: lanes' 8 codes in one word (2 bits) or straddling two (3, 5, 6 bits)
    (mx.float16, mx.float16, 32, 6),  # a GGUF's Q6_K (requantized, group 32)
    (mx.bfloat16, mx.bfloat16, 32, 5),  # Q5_K / Q5_0: exact, group 32
    (mx.bfloat16, mx.bfloat16, 64, 3),
    (mx.float16, mx.float16, 128, 2),  # 3 groups of 4 blocks
]
BUILDS = [(1, 1, 4), (2, 1, 4), (1, 2, 4), (1, 4, 4), (1, 8, 4),  # (16-column tiles, 8-row tiles, warps on K)
          (1, 1, 2), (1, 8, 2), (1, 1, 8), (1, 8, 8)]  # other K splits: other bits, each row-invariant
M, ODD = 40, (9, 7)  # a 40-row launch, each row alone, rows [9, 16) as one 7-row launch
N, K = 19, 384  # N: a partial 16-column tile; K: 3 groups of 128, 12 of 32

SHIFTED = """  std::vector<T> shifted(x.size() + 8);  // x 1 element (2 bytes) and 8 bytes past 16-byte alignment:
  for (int off : {1, int(8 / sizeof(T))}) {  // each takes the loads its alignment allows, the same bits
    for (size_t i = 0; i < x.size(); ++i) shifted[i + off] = x[i];
    save(out, launch(3, shifted.data() + off, M, w.data(), s.data(), b.data(), N, K));
  }"""
CASE = "      case {i}: mlx::core::cu::{name}(x, xs, w, ws, s, b, y.data()); break;"


def code(x_dtype, s_dtype, group_size: int, bits: int) -> str:
    out = output_dtype(x_dtype, s_dtype)
    names, source = src.cuda_source(x_dtype, s_dtype, out, group_size, bits, builds=BUILDS)
    cases = "\n".join(CASE.format(i=i, name=n) for i, n in enumerate(names))
    return matrix_qmm_harness(
        (x_dtype, s_dtype, group_size, bits), BUILDS, ODD, source=source, cols=16, cases=cases, extra=SHIFTED,
        shapes=f"Shape xs{{M, K}}, ws{{N, K * {bits} / 32}};",
        ids="threadIdx = dim3{unsigned(lane), unsigned(part), 0};\n"
            "    blockIdx = dim3{0, unsigned(by), unsigned(bz)}; blockDim = dim3{32, unsigned(ksplit[build]), 1};")


@pytest.fixture(scope="module")
def exes() -> dict:
    return dict(zip(CASES, build_all([code(*c) for c in CASES])))


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_mma_qmm_matches_reference_and_rows_are_invariant(tmp_path, exes, case):
    y, shifted = check_matrix_qmm(tmp_path, exes[case], case, BUILDS, M, N, K, ODD, extra=2)
    for offset, other in zip(("2 bytes", "8 bytes"), shifted):
        assert mx.array_equal(other, y).item(), f"x {offset} past 16-byte alignment gives other bits"


def test_supports_only_what_the_source_handles():
    assert src.supports(mx.float16, 64, 4) and src.supports(mx.bfloat16, 128, 8)
    assert not src.supports(mx.float32, 64, 4)  # float32 x: the FMA kernel (an mma would round x)
    assert all(src.supports(mx.bfloat16, 32, bits) for bits in (2, 3, 5, 6))  # the bit-stream path
    assert not src.supports(mx.float16, 64, 4, "mxfp4") and not src.supports(mx.float16, 16, 4)


def test_partial_sums_fit_in_shared_memory_at_every_split_and_row_count():
    """The launch and the template agree on the column tiles, shrunk to 1 where 2 would not fit (8 warps on K,
    33+ rows); the grid then covers the columns in 16-column tiles."""
    for ksplit in (2, 4, 8):
        for rows in range(1, 73):
            targs = dict(src.template_args(mx.float16, mx.float16, mx.float16, 64, 4, src.tiles_for(rows), rows, ksplit))
            assert src.partial_bytes(targs["TILES"], rows, ksplit) <= src.SHARED_LIMIT
            grid = src.launch(rows, 4096, src.tiles_for(rows), ksplit)["grid"]
            assert grid[1] == 4096 // (16 * targs["TILES"]) * ksplit
    assert src.fit_tiles(2, 64, 8) == 1 and src.fit_tiles(2, 64, 4) == 2 and src.fit_tiles(2, 32, 8) == 2
