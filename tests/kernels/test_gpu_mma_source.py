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

from emulator_harness import C_TYPES, CXX, build_all, from_np, run, save
from mlxspec.kernels import gpu_mma_source as src
from mlxspec.kernels.reference import output_dtype, within_tolerance

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

HARNESS = """
{source}
using T = {T}; using WT = {W}; using O = {O};
std::vector<O> launch(int build, const T* x, int M, const uint32_t* w, const WT* s, const WT* b, int N, int K) {{
  const int tiles[] = {{{tiles}}}, row_tiles[] = {{{row_tiles}}}, ksplit[] = {{{ksplit}}};
  std::vector<O> y(size_t(M) * N);
  Shape xs{{M, K}}, ws{{N, K * {BITS} / 32}};
  const int ys = (N + 16 * tiles[build] - 1) / (16 * tiles[build]), zs = (M + 8 * row_tiles[build] - 1) / (8 * row_tiles[build]);
  emu::run_blocks(ys, zs, ksplit[build], [&](int lane, int warp, int by, int bz) {{
    threadIdx = dim3{{unsigned(lane), unsigned(warp), 0}};
    blockIdx = dim3{{0, unsigned(by), unsigned(bz)}}; blockDim = dim3{{32, unsigned(ksplit[build]), 1}};
    switch (build) {{
{cases}
    }}
  }});
  return y;
}}
int main(int argc, char** argv) {{
  const std::string d = argv[1];
  const int M = std::atoi(argv[2]), N = std::atoi(argv[3]), K = std::atoi(argv[4]);
  auto x = load<T>(d + "/x", size_t(M) * K);
  auto w = load<uint32_t>(d + "/w", size_t(N) * K * {BITS} / 32);
  auto s = load<WT>(d + "/s", size_t(N) * K / {G}); auto b = load<WT>(d + "/b", size_t(N) * K / {G});
  std::ofstream out(d + "/y", std::ios::binary);
  for (int build = 0; build < {builds}; ++build) save(out, launch(build, x.data(), M, w.data(), s.data(), b.data(), N, K));
  for (int r = 0; r < M; ++r) save(out, launch(0, x.data() + size_t(r) * K, 1, w.data(), s.data(), b.data(), N, K));
  save(out, launch(0, x.data() + size_t({r0}) * K, {odd}, w.data(), s.data(), b.data(), N, K));
  std::vector<T> shifted(x.size() + 1);  // x one element past its alignment: one-by-one loads
  for (size_t i = 0; i < x.size(); ++i) shifted[i + 1] = x[i];
  save(out, launch(3, shifted.data() + 1, M, w.data(), s.data(), b.data(), N, K));
}}
"""
CASE = "      case {i}: mlx::core::cu::{name}(x, xs, w, ws, s, b, y.data()); break;"


def code(x_dtype, s_dtype, group_size: int, bits: int) -> str:
    out = output_dtype(x_dtype, s_dtype)
    names, source = src.cuda_source(x_dtype, s_dtype, out, group_size, bits, builds=BUILDS)
    cases = "\n".join(CASE.format(i=i, name=n) for i, n in enumerate(names))
    return HARNESS.format(source=source, T=C_TYPES[x_dtype], W=C_TYPES[s_dtype], O=C_TYPES[out], cases=cases,
                          BITS=bits, G=group_size, r0=ODD[0], odd=ODD[1], builds=len(BUILDS),
                          **{name: ", ".join(str(b[i]) for b in BUILDS) for i, name in enumerate(("tiles", "row_tiles", "ksplit"))})


def case_id(case) -> str:
    return "-".join(str(v) for v in case).replace("mlx.core.", "")


@pytest.fixture(scope="module")
def exes() -> dict:
    return dict(zip(CASES, build_all([code(*c) for c in CASES])))


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_mma_qmm_matches_reference_and_rows_are_invariant(tmp_path, exes, case):
    x_dtype, s_dtype, group_size, bits = case
    w, s, b = mx.quantize(mx.random.normal((N, K), key=mx.random.key(0)).astype(s_dtype), group_size=group_size,
                          bits=bits)
    x = mx.random.normal((M, K), key=mx.random.key(1)).astype(x_dtype)
    save(tmp_path, x=x, w=w, s=s, b=b)
    run(exes[case], tmp_path, M, N, K)
    out = output_dtype(x_dtype, s_dtype)
    raw = (tmp_path / "y").read_bytes()
    counts = [M] * len(BUILDS) + [1] * M + [ODD[1], M]
    size = len(raw) // sum(counts)  # bytes per output row
    parts, start = [], 0
    for rows in counts:
        parts.append(from_np(raw[start : start + rows * size], out, (rows, N)))
        start += rows * size
    y, alone, (odd, shifted) = parts[0], mx.concatenate(parts[len(BUILDS) : -2]), parts[-2:]
    first = {}  # K split -> its first build's output: the others with that split must equal it
    for build, other in zip(BUILDS, parts):
        ok, ratio = within_tolerance(other, x, w, s, b, group_size, bits)
        assert ok, f"{case_id(case)} {build}: error {ratio:.3g}x the tolerance"
        ref = first.setdefault(build[2], other)
        assert mx.array_equal(other, ref).item(), f"(column tiles, row tiles, K split) {build} give other bits"
    assert mx.array_equal(alone, y).item(), f"rows of a {M}-row launch differ from 1-row launches"
    assert mx.array_equal(odd, y[ODD[0] : sum(ODD)]).item(), "rows of a 7-row launch differ"
    assert mx.array_equal(shifted, y).item(), "x at an unaligned address gives other bits"
    assert not mx.array_equal(y[0], y[1]).item()  # the rows are really different rows


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
