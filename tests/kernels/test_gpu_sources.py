"""The Metal and CUDA qmm / dense kernels, checked as far as a Linux CPU allows.

No GPU here, so the full program MLX would generate (signature, template, body; gpu_source.py) is
compiled with g++ under stand-ins for the GPU builtins (emulator/gpu_emulator.h) and run with one
thread per lane. That checks the syntax we share with C++ and the kernel's arithmetic: results
within the reference tolerance, and each row of a 16-row and of a 7-row launch bit-identical to a
1-row launch. On a real device the registry's self-check repeats the comparison.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from emulator_harness import C_TYPES, CXX, build_all, from_np, run, save
from mlxspec.kernels import gpu_source
from mlxspec.kernels.reference import dense_within_tolerance, output_dtype, within_tolerance

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

QMM_CASES = [  # (backend, x dtype, scales dtype, group size, bits, mode)
    ("metal", mx.float32, mx.float16, 32, 4, "affine"),
    ("metal", mx.float16, mx.float16, 64, 8, "affine"),
    ("cuda", mx.bfloat16, mx.bfloat16, 128, 4, "affine"),
    ("cuda", mx.float16, mx.float32, 128, 8, "affine"),
    ("metal", mx.bfloat16, mx.uint8, 32, 4, "mxfp4"),  # gpt-oss: e2m1 codes, 2^(s - 127) scales, no biases
    ("cuda", mx.float16, mx.uint8, 32, 4, "mxfp4"),
    ("metal", mx.float16, mx.float16, 64, 6, "affine"),  # 2/3/5/6 bits: codes straddle words (GGUF Q6_K/Q5_K)
    ("cuda", mx.bfloat16, mx.bfloat16, 32, 5, "affine"),
    ("cuda", mx.float32, mx.float16, 128, 3, "affine"),
    ("metal", mx.float32, mx.float32, 32, 2, "affine"),
]
GATHER_CASES = [QMM_CASES[0], QMM_CASES[3], QMM_CASES[4], QMM_CASES[5], QMM_CASES[7]]  # MoE experts: qmm's rows, one expert each
GROUPED_CASES = [GATHER_CASES[0], GATHER_CASES[1], GATHER_CASES[3], GATHER_CASES[4]]  # both backends, mxfp4, 5 bits
EXPERTS, INDICES = 4, [2, 0, 2, 1, 0, 2, 2]  # rows 0, 2, 5 and 6 share an expert; expert 3 has none
DENSE_CASES = [  # (backend, x dtype, w dtype)
    ("metal", mx.float16, mx.float16),
    ("metal", mx.float32, mx.bfloat16),
    ("cuda", mx.bfloat16, mx.bfloat16),
]
M, ODD = 16, (9, 7)  # a 16-row launch, each row alone, and rows [9, 16) as one 7-row launch
N = 11  # not a multiple of COLS: the last warp has duplicate columns
K_QMM, K_DENSE = 1280, 300  # 4-bit: 1.25 blocks of 1024 (8-bit: 2.5 of 512); dense: a partial k sweep

HARNESS = """
{source}
using T = {T}; using WT = {W}; using O = {O};
std::vector<O> launch(const T* x, int M, {wparams}, int N, int K) {{
  std::vector<O> y(size_t(M) * N);
  emu::run_grid((N + 3) / 4, 1, [&](int lane, int warp, int) {{ {call} }});
  return y;
}}
int main(int argc, char** argv) {{
  const std::string d = argv[1];
  const int M = std::atoi(argv[2]), N = std::atoi(argv[3]), K = std::atoi(argv[4]), r0 = {r0}, odd = {odd};
  auto x = load<T>(d + "/x", size_t(M) * K);
  {wload}
  std::ofstream out(d + "/y", std::ios::binary);
  save(out, launch(x.data(), M, {wargs}, N, K));
  for (int r = 0; r < M; ++r) save(out, launch(x.data() + size_t(r) * K, 1, {wargs}, N, K));
  save(out, launch(x.data() + size_t(r0) * K, odd, {wargs}, N, K));
  std::vector<T> shifted(size_t(M) * K + 1);  // x one element past its alignment: CUDA's one-by-one loads
  for (size_t i = 0; i < x.size(); ++i) shifted[i + 1] = x[i];
  save(out, launch(shifted.data() + 1, M, {wargs}, N, K));
}}
"""
QMM_W = dict(wparams="const uint32_t* w, const WT* s, const WT* b",
             wload="""auto w = load<uint32_t>(d + "/w", size_t(N) * K * {BITS} / 32);
  auto s = load<WT>(d + "/s", size_t(N) * K / {G}); auto b = load<WT>(d + "/b", size_t(N) * K / {G});""",
             wargs="w.data(), s.data(), b.data()", shapes="N, K * {BITS} / 32", inputs="x, xs, w, ws, s, b")
DENSE_W = dict(wparams="const WT* w", wload="""auto w = load<WT>(d + "/w", size_t(N) * K);""",
               wargs="w.data()", shapes="N, K", inputs="x, xs, w, ws")
CAPACITIES = (1, 2, 4, 8, 16)  # each launch runs the kernel compiled for its row capacity (gpu.py)
METAL_CALL = """int xs[2] = {{M, K}}, ws[2] = {{{shapes}}};
  const uint3 at{{unsigned(lane), unsigned(warp), 0}};
  switch (M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : M <= 8 ? 8 : 16) {{
{cases}
  }}"""
METAL_CASE = "    case {r}: {name}<{targs}, {r}>({inputs}, y.data(), at); break;"
CUDA_CALL = """Shape xs{{M, K}}, ws{{{shapes}}};
  threadIdx = dim3{{unsigned(lane), unsigned(warp % 2), 0}};
  blockIdx = dim3{{0, unsigned(warp / 2), 0}}; blockDim = dim3{{32, 2, 1}};
  switch (M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : M <= 8 ? 8 : 16) {{
{cases}
  }}"""
CUDA_CASE = "    case {r}: mlx::core::cu::{name}({inputs}, y.data()); break;"


def harness(backend: str, names, source: str, targs: str, parts: dict, x_dtype, w_dtype, out_dtype, **fmt) -> str:
    """names: the Metal template's name, or the CUDA functions' for CAPACITIES in order."""
    if backend == "metal":
        cases = [METAL_CASE.format(r=r, name=names, targs=targs, inputs=parts["inputs"]) for r in CAPACITIES]
    else:
        cases = [CUDA_CASE.format(r=r, name=n, inputs=parts["inputs"]) for r, n in zip(CAPACITIES, names)]
    call = (METAL_CALL if backend == "metal" else CUDA_CALL).format(
        cases="\n".join(cases), shapes=parts["shapes"].format(**fmt))
    return HARNESS.format(source=source, T=C_TYPES[x_dtype], W=C_TYPES[w_dtype], O=C_TYPES[out_dtype], call=call,
                          wparams=parts["wparams"], wload=parts["wload"].format(**fmt), wargs=parts["wargs"],
                          r0=ODD[0], odd=ODD[1])


def qmm_source(backend, x_dtype, s_dtype, group_size, bits, mode, gather=False) -> tuple[str, str]:
    out = output_dtype(x_dtype, s_dtype)
    if backend == "metal":
        return gpu_source.metal_source(x_dtype, s_dtype, out, group_size, bits,
                                       dict.fromkeys(gpu_source.GATHER_INPUTS, 1 << 20), mode, gather)
    names, source = gpu_source.cuda_source(x_dtype, s_dtype, out, group_size, bits, mode, gather,
                                           1 if gather else CAPACITIES)
    return (names[0] if gather else names), source


def qmm_code(backend, x_dtype, s_dtype, group_size, bits, mode) -> str:
    name, source = qmm_source(backend, x_dtype, s_dtype, group_size, bits, mode)
    targs = f"T, WT, O, {group_size}, {bits}, {gpu_source.MODES[mode]}"
    return harness(backend, name, source, targs, QMM_W, x_dtype, s_dtype, output_dtype(x_dtype, s_dtype),
                   G=group_size, BITS=bits)


GATHER_MAIN = """
{source}
using T = {T}; using WT = {W}; using O = {O};
int main(int argc, char** argv) {{
  const std::string d = argv[1];
  const int P = std::atoi(argv[2]), N = std::atoi(argv[3]), K = std::atoi(argv[4]), E = std::atoi(argv[5]);
  const int WORDS = K * {BITS} / 32, GROUPS = K / {G};
  auto x = load<T>(d + "/x", size_t(P) * K);
  auto w = load<uint32_t>(d + "/w", size_t(E) * N * WORDS);
  auto s = load<WT>(d + "/s", size_t(E) * N * GROUPS); auto b = load<WT>(d + "/b", size_t(E) * N * GROUPS);
  auto idx = load<uint32_t>(d + "/idx", P);
  std::ofstream out(d + "/y", std::ios::binary);
  std::vector<T> shifted(x.size() + 1);  // x one element past its alignment: CUDA's one-by-one loads
  for (size_t i = 0; i < x.size(); ++i) shifted[i + 1] = x[i];
"""  # the experts' program: inputs loaded, x and an unaligned copy
GATHER_HARNESS = GATHER_MAIN + """  for (int rows : {{P, 1, -P}}) {{  // all rows in one launch, row 0 alone, all rows from the shifted copy
    const T* xp = rows < 0 ? shifted.data() + 1 : x.data();
    rows = rows < 0 ? -rows : rows;
    std::vector<O> y(size_t(rows) * N);
    emu::run_grid((N + 3) / 4, rows, [&](int lane, int warp, int z) {{ {call} }});
    save(out, y);
  }}
}}
"""
METAL_GATHER_CALL = """int xs[2] = {{P, K}}, ws[3] = {{E, N, WORDS}};
  {name}<T, WT, O, {G}, {BITS}, {MODE}, 1>(xp, xs, w.data(), ws, s.data(), b.data(), idx.data(), y.data(),
      uint3{{unsigned(lane), unsigned(warp), unsigned(z)}});"""
CUDA_GATHER_CALL = """Shape xs{{P, K}}, ws{{E, N, WORDS}};
  threadIdx = dim3{{unsigned(lane), unsigned(warp % 2), 0}};
  blockIdx = dim3{{0, unsigned(warp / 2), unsigned(z)}}; blockDim = dim3{{32, 2, 1}};
  mlx::core::cu::{name}(xp, xs, w.data(), ws, s.data(), b.data(), idx.data(), y.data());"""


def gather_code(backend, x_dtype, s_dtype, group_size, bits, mode) -> str:
    name, source = qmm_source(backend, x_dtype, s_dtype, group_size, bits, mode, gather=True)
    fmt = dict(name=name, G=group_size, BITS=bits, MODE=gpu_source.MODES[mode])
    call = (METAL_GATHER_CALL if backend == "metal" else CUDA_GATHER_CALL).format(**fmt)
    return GATHER_HARNESS.format(source=source, T=C_TYPES[x_dtype], W=C_TYPES[s_dtype],
                                 O=C_TYPES[output_dtype(x_dtype, s_dtype)], call=call, **fmt)


GROUPED_CAPACITIES = (2, 4)  # expert 2 has 4 of INDICES' rows: two passes of 2, one of 4
GROUPED_HARNESS = GATHER_MAIN + """  for (int pass = 0; pass < 2; ++pass)
    for (int cap = 0; cap < {ncaps}; ++cap) {{  // grid z: one threadgroup row per expert
      const T* xp = pass ? shifted.data() + 1 : x.data();
      std::vector<O> y(size_t(P) * N);
      emu::run_grid((N + 3) / 4, E, [&](int lane, int warp, int z) {{ switch (cap) {{ {cases} }} }});
      save(out, y);
    }}
}}
"""
METAL_GROUPED_CASE = """case {i}: {{ int xs[2] = {{P, K}}, ws[3] = {{E, N, WORDS}};
  {name}<T, WT, O, {G}, {BITS}, {MODE}, {r}>(xp, xs, w.data(), ws, s.data(), b.data(), idx.data(), y.data(),
      uint3{{unsigned(lane), unsigned(warp), unsigned(z)}}); break; }}"""
CUDA_GROUPED_CASE = """case {i}: {{ Shape xs{{P, K}}, ws{{E, N, WORDS}};
  threadIdx = dim3{{unsigned(lane), unsigned(warp % 2), 0}};
  blockIdx = dim3{{0, unsigned(warp / 2), unsigned(z)}}; blockDim = dim3{{32, 2, 1}};
  mlx::core::cu::{name}(xp, xs, w.data(), ws, s.data(), b.data(), idx.data(), y.data()); break; }}"""


def grouped_code(backend, x_dtype, s_dtype, group_size, bits, mode) -> str:
    out = output_dtype(x_dtype, s_dtype)
    fmt = dict(G=group_size, BITS=bits, MODE=gpu_source.MODES[mode])
    if backend == "metal":
        name, source = gpu_source.metal_source(x_dtype, s_dtype, out, group_size, bits,
                                               dict.fromkeys(gpu_source.GATHER_INPUTS, 1 << 20), mode, "grouped")
        cases = [METAL_GROUPED_CASE.format(i=i, r=r, name=name, **fmt) for i, r in enumerate(GROUPED_CAPACITIES)]
    else:
        names, source = gpu_source.cuda_source(x_dtype, s_dtype, out, group_size, bits, mode, "grouped",
                                               GROUPED_CAPACITIES)
        cases = [CUDA_GROUPED_CASE.format(i=i, name=n) for i, n in enumerate(names)]
    return GROUPED_HARNESS.format(source=source, T=C_TYPES[x_dtype], W=C_TYPES[s_dtype], O=C_TYPES[out],
                                  ncaps=len(GROUPED_CAPACITIES), cases="\n".join(cases), **fmt)


def dense_code(backend, x_dtype, w_dtype) -> str:
    out = output_dtype(x_dtype, w_dtype)
    source_fn = gpu_source.metal_dense_source if backend == "metal" else gpu_source.cuda_dense_source
    name, source = source_fn(x_dtype, w_dtype, out) if backend == "metal" else source_fn(x_dtype, w_dtype, out, CAPACITIES)
    return harness(backend, name, source, "T, WT, O", DENSE_W, x_dtype, w_dtype, out)


@pytest.fixture(scope="module")
def exes() -> dict:
    codes = ({("qmm",) + c: qmm_code(*c) for c in QMM_CASES} | {("dense",) + c: dense_code(*c) for c in DENSE_CASES}
             | {("gather",) + c: gather_code(*c) for c in GATHER_CASES}
             | {("grouped",) + c: grouped_code(*c) for c in GROUPED_CASES})
    return dict(zip(codes, build_all(list(codes.values()))))


def split_outputs(raw: bytes, out_dtype, n: int):
    """(16-row launch, the 16 one-row launches stacked, the 7-row launch, the 16-row launch on a copy
    of x one element past its alignment) from the harness's output file."""
    size = len(raw) // (3 * M + ODD[1])
    parts, start = [], 0
    for rows in (M, M, ODD[1], M):
        parts.append(from_np(raw[start : start + rows * size], out_dtype, (rows, n)))
        start += rows * size
    return tuple(parts)


def check_rows(label: str, y, rows, odd, shifted) -> None:
    assert mx.array_equal(y, rows).item(), f"{label}: rows of a {M}-row launch differ from 1-row launches"
    assert mx.array_equal(odd, rows[ODD[0]:]).item(), f"{label}: rows of a {ODD[1]}-row launch differ"
    assert mx.array_equal(shifted, y).item(), f"{label}: x at an unaligned address gives other bits"


def case_id(case) -> str:
    return "-".join(str(v) for v in case).replace("mlx.core.", "")


def quantized(n: int, k: int, s_dtype, group_size: int, bits: int, mode: str, seed: int = 0):
    """(w, scales, biases) of a random (N, K) matrix in MLX's layout; mxfp4's biases: unused zeros."""
    if mode == "mxfp4":
        w, s = mx.quantize(mx.random.normal((n, k), key=mx.random.key(seed)), group_size=32, bits=4, mode="mxfp4")
        return w, s, mx.zeros_like(s)
    return mx.quantize(mx.random.normal((n, k), key=mx.random.key(seed)).astype(s_dtype), group_size=group_size,
                       bits=bits)


@pytest.mark.parametrize("case", QMM_CASES, ids=[case_id(c) for c in QMM_CASES])
def test_qmm_source_matches_reference_and_is_row_invariant(tmp_path, exes, case):
    backend, x_dtype, s_dtype, group_size, bits, mode = case
    w, s, b = quantized(N, K_QMM, s_dtype, group_size, bits, mode)
    x = mx.random.normal((M, K_QMM), key=mx.random.key(1)).astype(x_dtype)
    save(tmp_path, x=x, w=w, s=s, b=b)
    run(exes[("qmm",) + case], tmp_path, M, N, K_QMM)
    y, rows, odd, shifted = split_outputs((tmp_path / "y").read_bytes(), output_dtype(x_dtype, s_dtype), N)
    ok, ratio = within_tolerance(y, x, w, s, None if mode == "mxfp4" else b, group_size, bits, mode=mode)
    assert ok, f"{case_id(case)}: error {ratio:.3g}x the tolerance"
    check_rows(case_id(case), y, rows, odd, shifted)


def experts_saved(tmp_path, x_dtype, s_dtype, group_size, bits, mode):
    """EXPERTS random experts stacked, x of one row per INDICES entry, all saved for the harness: (experts, x, P)."""
    experts = [quantized(N, K_QMM, s_dtype, group_size, bits, mode, seed=e) for e in range(EXPERTS)]
    w, s, b = (mx.stack([e[i] for e in experts]) for i in range(3))
    x = mx.random.normal((len(INDICES), K_QMM), key=mx.random.key(5)).astype(x_dtype)
    save(tmp_path, x=x, w=w, s=s, b=b, idx=mx.array(INDICES, mx.uint32))
    return experts, x, len(INDICES)


@pytest.mark.parametrize("case", GATHER_CASES, ids=[case_id(c) for c in GATHER_CASES])
def test_gather_qmm_rows_have_the_bits_of_one_row_qmm_on_their_expert(tmp_path, exes, case):
    """Each row of a gather launch (MoE experts) = the qmm kernel's one-row launch on its expert's
    matrix, bit for bit, whatever other rows and experts share the launch; within tolerance."""
    backend, x_dtype, s_dtype, group_size, bits, mode = case
    experts, x, p = experts_saved(tmp_path, x_dtype, s_dtype, group_size, bits, mode)
    run(exes[("gather",) + case], tmp_path, p, N, K_QMM, EXPERTS)
    out = output_dtype(x_dtype, s_dtype)
    raw = (tmp_path / "y").read_bytes()
    size = len(raw) // (2 * p + 1)  # all rows, row 0 alone, all rows from x one element past its alignment
    y = from_np(raw[: p * size], out, (p, N))
    assert mx.array_equal(from_np(raw[p * size : (p + 1) * size], out, (1, N)), y[:1]).item(), "row 0 alone differs"
    assert mx.array_equal(from_np(raw[(p + 1) * size :], out, (p, N)), y).item(), "unaligned x gives other bits"
    for e, (we, se, be) in enumerate(experts):  # the plain qmm kernel, one row at a time, on expert e
        rows = [r for r, i in enumerate(INDICES) if i == e]
        if not rows:  # an expert no row chose
            continue
        xe = mx.concatenate([x[r : r + 1] for r in rows] + [x[:1]] * (M - len(rows)))  # padded to the harness's M
        save(tmp_path, x=xe, w=we, s=se, b=be)
        run(exes[("qmm",) + case], tmp_path, M, N, K_QMM)
        one_row = split_outputs((tmp_path / "y").read_bytes(), out, N)[1]
        for j, r in enumerate(rows):
            assert mx.array_equal(y[r], one_row[j]).item(), f"row {r} (expert {e}) differs from qmm's one row"
        ok, ratio = within_tolerance(y[mx.array(rows)], x[mx.array(rows)], we, se, None if mode == "mxfp4" else be,
                                     group_size, bits, mode=mode)
        assert ok, f"expert {e}: error {ratio:.3g}x the tolerance"


@pytest.mark.parametrize("case", GROUPED_CASES, ids=[case_id(c) for c in GROUPED_CASES])
def test_grouped_gather_gives_every_row_the_gathers_bits(tmp_path, exes, case):
    """The grouped gather (one threadgroup row per expert, its rows ROWS at a time, in one or two
    passes) gives each row the bits of the one-row gather: what lets the engine switch between them
    by the number of tokens without changing a token."""
    backend, x_dtype, s_dtype, group_size, bits, mode = case
    experts, x, p = experts_saved(tmp_path, x_dtype, s_dtype, group_size, bits, mode)
    out = output_dtype(x_dtype, s_dtype)
    run(exes[("gather",) + case], tmp_path, p, N, K_QMM, EXPERTS)
    raw = (tmp_path / "y").read_bytes()
    gathered = from_np(raw[: len(raw) // (2 * p + 1) * p], out, (p, N))
    run(exes[("grouped",) + case], tmp_path, p, N, K_QMM, EXPERTS)
    raw = (tmp_path / "y").read_bytes()
    launches = 2 * len(GROUPED_CAPACITIES)  # x and its unaligned copy, each at every capacity
    size = len(raw) // launches
    for i in range(launches):
        y = from_np(raw[i * size : (i + 1) * size], out, (p, N))
        assert mx.array_equal(y, gathered).item(), f"launch {i}: grouped rows differ from the gather's"


@pytest.mark.parametrize("case", DENSE_CASES, ids=[case_id(c) for c in DENSE_CASES])
def test_dense_source_matches_reference_and_is_row_invariant(tmp_path, exes, case):
    backend, x_dtype, w_dtype = case
    w = mx.random.normal((N, K_DENSE), key=mx.random.key(2)).astype(w_dtype)
    x = mx.random.normal((M, K_DENSE), key=mx.random.key(3)).astype(x_dtype)
    save(tmp_path, x=x, w=w)
    run(exes[("dense",) + case], tmp_path, M, N, K_DENSE)
    y, rows, odd, shifted = split_outputs((tmp_path / "y").read_bytes(), output_dtype(x_dtype, w_dtype), N)
    ok, ratio = dense_within_tolerance(y, x, w)
    assert ok, f"{case_id(case)}: error {ratio:.3g}x the tolerance"
    check_rows(case_id(case), y, rows, odd, shifted)


def test_sources_name_only_builtins_their_backend_has():
    """MLX passes builtins it finds by name in the body: each body must use its own backend's."""
    for metal, cuda in ((gpu_source.METAL_BODY, gpu_source.CUDA_BODY),
                        (gpu_source.METAL_DENSE_BODY, gpu_source.CUDA_DENSE_BODY)):
        assert "thread_position_in_grid" in metal and "threadIdx" not in metal
        assert "threadIdx" in cuda and "thread_position_in_grid" not in cuda
        for body in (metal, cuda):
            assert "x_shape" in body and "w_shape" in body and "scales_shape" not in body
    for metal, cuda in ((gpu_source.METAL_GATHER_BODY, gpu_source.CUDA_GATHER_BODY),):
        assert "thread_position_in_grid" in metal and "threadIdx" not in metal and "blockIdx" not in metal
        assert "blockIdx" in cuda and "thread_position_in_grid" not in cuda


@pytest.mark.skipif(not mx.metal.is_available(), reason="no Metal device")
def test_metal_kernel_on_device():
    from mlxspec.kernels.gpu import metal_qmm_function
    from mlxspec.kernels.registry import self_check

    assert self_check(metal_qmm_function(), 300, 256, 64, 4, mx.float16) is None
