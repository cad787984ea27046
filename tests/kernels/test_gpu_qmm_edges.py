"""Edge cases of the GPU matmul kernels under the CPU emulator: the FMA qmm, gather, grouped gather and dense
(gpu_source.py, Metal and CUDA), the tensor-core qmm (CUDA) and the simdgroup-matrix qmm (Metal).

One program per family and backend holds every layout (each width at K = G, mxfp4 with gpu.py's biases
stand-in) and runs a plan of launches: sizes; x's first row and its offset past 16-byte alignment (0,
2, 8 bytes: the same bits, no misaligned load); w / scales / biases as row slices of [w; w] (joined projections,
stacked experts), ending the buffer so a read past them faults (AddressSanitizer). N = 1, a column tile + 1;
M = 1, 17, 65; K = one group (fewer than the K-split warps) and five (uneven among 4); gathers with repeated,
unsorted indices, the largest expert, one expert, an expert no row chose and one taking two passes. Results
must be within the reference tolerance, each row bit-equal to a one-row launch (FMA: 16 rows a launch, as gpu._rows).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from emulator_harness import C_TYPES, CXX, NP_TYPES, build_all, from_np, run, save
from mlxspec.kernels import gpu
from mlxspec.kernels import gpu_mma_source as mma
from mlxspec.kernels import gpu_simdgroup_source as sg
from mlxspec.kernels import gpu_source as fma
from mlxspec.kernels.gpu_codegen import cuda_function, cuda_program, metal_function
from mlxspec.kernels.reference import dense_within_tolerance, output_dtype, within_tolerance
from test_gpu_sources import quantized

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

HARNESS = """
{source}
#include <cstring>
using T = {T}; using O = {O};
const unsigned char* read(const std::string& path, size_t n = 0) {{  // a buffer that ends where the file does
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  void* p = nullptr;
  if (in) n = size_t(in.tellg()), in.seekg(0);
  if (posix_memalign(&p, 64, n ? n : 1) != 0 || (n && !in.read((char*)p, n))) std::abort();
  return (const unsigned char*)p;
}}
int main(int argc, char** argv) {{
  const std::string d = argv[1];
  const unsigned char *X = read(d + "/x"), *W = read(d + "/w"), *S = read(d + "/s"), *B = read(d + "/b");
  const uint32_t* idx = (const uint32_t*)read(d + "/idx");
  std::ifstream plan(d + "/plan", std::ios::binary);
  std::ofstream out(d + "/y", std::ios::binary);
  for (int L[12]; plan.read((char*)L, sizeof(L));) {{  // id, M, N, K, E, x offset, x row, w/s/b offsets, grid
    const int id = L[0], M = L[1], N = L[2], K = L[3], E = L[4], gy = L[10], gz = L[11];
    const size_t xbytes = size_t(M) * K * sizeof(T);
    void* buf = nullptr;  // x's M rows, L[5] bytes past 64-byte alignment, ending the buffer
    if (posix_memalign(&buf, 64, L[5] + xbytes) != 0) std::abort();
    const T* x = (const T*)std::memcpy((char*)buf + L[5], X + size_t(L[6]) * K * sizeof(T), xbytes);
    const unsigned char *wp = W + L[7], *sp = S + L[8], *bp = B + L[9];
    std::vector<O> y(size_t(M) * N, O(std::numeric_limits<float>::quiet_NaN()));  // a row never written: NaN
    switch (id) {{
{cases}
      default: std::abort();
    }}
    save(out, y);
    free(buf);
  }}
}}
"""
FMA_CALL = {  # one warp per (y, z): lane, warp (grid y) and z as each backend has them
    "metal": """emu::run_grid(gy, gz, [&](int lane, int warp, int z) {{ const uint3 at{{unsigned(lane), unsigned(warp),
      unsigned(z)}}; int xs[2] = {{M, K}}, ws[3] = {{{ws}}}; {name}<{targs}>({args}, y.data(), at); }});""",
    "cuda": """emu::run_grid(gy, gz, [&](int lane, int warp, int z) {{ Shape xs{{M, K}}, ws{{{ws}}};
      threadIdx = dim3{{unsigned(lane), unsigned(warp % 2), 0}}; blockIdx = dim3{{0, unsigned(warp / 2), unsigned(z)}};
      blockDim = dim3{{32, 2, 1}}; mlx::core::cu::{name}({args}, y.data()); }});"""}
MATRIX_CALL = {  # threadgroups of KSPLIT warps sharing memory
    "metal": """emu::run_blocks(gy, gz, {ksplit}, [&](int lane, int part, int by, int bz) {{ int xs[2] = {{M, K}},
      ws[2] = {{{ws}}}; {name}<{targs}>({args}, y.data(), uint3{{unsigned(lane), unsigned(part), 0}},
      uint3{{0, unsigned(by), unsigned(bz)}}); }});""",
    "cuda": """emu::run_blocks(gy, gz, {ksplit}, [&](int lane, int part, int by, int bz) {{
      Shape xs{{M, K}}, ws{{{ws}}}; threadIdx = dim3{{unsigned(lane), unsigned(part), 0}};
      blockIdx = dim3{{0, unsigned(by), unsigned(bz)}}; blockDim = dim3{{32, {ksplit}, 1}};
      mlx::core::cu::{name}({args}, y.data()); }});"""}
QMM_ARGS = "x, xs, (const uint32_t*)wp, ws, (const {S}*)sp, (const {S}*)bp"

X_DTYPE = {"metal": mx.float16, "cuda": mx.bfloat16}  # 16-bit x: 2 bytes past alignment is a real offset
LAYOUTS = [(32, b, "affine") for b in gpu.AFFINE_BITS] + [(32, 4, "mxfp4"), (128, 4, "affine")]  # (G, bits, mode)
GATHER_LAYOUTS = [(32, 4, "affine"), (32, 4, "mxfp4"), (32, 5, "affine")]
CAPS, GROUPED_CAP = (1, 16), 4  # the FMA builds' row capacities; the grouped gather's (expert 4 takes 2 passes)
MATRIX_LAYOUTS = [(32, b, "affine") for b in mma.BITS] + [(128, 4, "affine"), (64, 8, "affine")]
MATRIX = {"cuda": (mma, [(1, 1, 4), (2, 8, 4)]), "metal": (sg, [(2, 1, 4), (2, 2, 4)])}  # builds (tiles, rt, ksplit)


def scale_dtype(x_dtype, mode):
    return mx.uint8 if mode == "mxfp4" else x_dtype


def program(backend: str, family: str) -> tuple[str, dict]:
    """(harness code, launch key -> case) for the FMA family ("fma") or the backend's matrix-unit qmm ("matrix")."""
    x = X_DTYPE[backend]
    out, texts, cases, ids = output_dtype(x, x), [], [], {}

    def add(key, kernel, dtypes, targs, body, call, ws, args, **fmt):
        if backend == "metal":
            name, text = metal_function(kernel, dtypes, dict.fromkeys(dtypes, 1 << 20), targs, body)
        else:
            name, text = cuda_function(kernel, dtypes, targs, body)
        ids[key], targs = len(cases), ", ".join(C_TYPES.get(v, str(v)) for _, v in targs)
        texts.append(text)
        call = call[backend].format(name=name, targs=targs, ws=ws, args=args, **fmt)
        cases.append(f"      case {ids[key]}: {call} break;")

    if family == "fma":
        for (g, bits, mode), (kind, gather, caps) in ((layout, kind) for layout in LAYOUTS for kind in (
                ("qmm", False, CAPS), ("gather", True, (1,)), ("grouped", "grouped", (GROUPED_CAP,)))):
            s = scale_dtype(x, mode)
            for r in caps if kind == "qmm" or (g, bits, mode) in GATHER_LAYOUTS else ():
                add((kind, g, bits, mode, r), *fma._qmm(x, s, out, gather),
                    fma.template_args(x, s, out, g, bits, mode, r), fma._body(backend, gather), FMA_CALL,
                    "E, " * bool(gather) + f"N, K * {bits} / 32",
                    QMM_ARGS.format(S=C_TYPES[s]) + ", idx" * bool(gather))
        for r in CAPS:
            add(("dense", r), *fma._dense(x, x, out), fma.dense_template_args(x, x, out, r),
                fma.METAL_DENSE_BODY if backend == "metal" else fma.CUDA_DENSE_BODY, FMA_CALL, "N, K",
                "x, xs, (const T*)wp, ws")
        header = fma.METAL_HEADER if backend == "metal" else fma.CUDA_HEADER
    else:
        src, builds = MATRIX[backend]
        for (g, bits, _), (tiles, rt, ksplit) in ((layout, build) for layout in MATRIX_LAYOUTS for build in builds):
            add((g, bits, tiles, rt), (src.NAME, src.INPUTS, src.OUTPUTS, [out]), dict(x=x, w=mx.uint32, scales=x,
                biases=x), src.template_args(x, x, out, g, bits, tiles, 8 * rt, ksplit), src.BODY, MATRIX_CALL,
                f"N, K * {bits} / 32", QMM_ARGS.format(S=C_TYPES[x]), ksplit=ksplit)
        header = src.HEADER
    source = header + "".join(texts) if backend == "metal" else cuda_program(header, texts)
    return HARNESS.format(source=source, T=C_TYPES[x], O=C_TYPES[out], cases="\n".join(cases)), ids


@pytest.fixture(scope="module")
def programs() -> dict:
    keys = [(b, f) for f in ("fma", "matrix") for b in ("metal", "cuda")]
    built = [program(*key) for key in keys]
    return {key: (exe, ids) for key, exe, (_, ids) in zip(keys, build_all([c for c, _ in built], asan=True), built)}


def run_groups(prog, tmp_path, groups: list[list[dict]], **arrays) -> list[mx.array]:
    """Run groups of launches (key, m, n, k, grid; e, xoff bytes, x's first row, w / s / b byte offsets wb / sb /
    bb) on `arrays`; each group's outputs, rows concatenated."""
    (exe, ids), fields = prog, ("m", "n", "k", "e", "xoff", "xrow", "wb", "sb", "bb")
    save(tmp_path, **arrays)
    np.array([[ids[l["key"]], *(l.get(f, 0) for f in fields), *l["grid"]] for group in groups for l in group],
             np.int32).tofile(tmp_path / "plan")
    run(exe, tmp_path)
    out = output_dtype(arrays["x"].dtype, arrays["x"].dtype)
    raw, parts, at = (tmp_path / "y").read_bytes(), [], 0
    for shape in ((sum(l["m"] for l in group), group[0]["n"]) for group in groups):
        parts.append(from_np(raw[at : at + shape[0] * shape[1] * NP_TYPES[out]().itemsize], out, shape))
        at += shape[0] * shape[1] * NP_TYPES[out]().itemsize
    return parts


def check_same(parts, label, names=("one-row launches", "x 2 bytes off", "x 8 bytes off, w's first rows")):
    for name, other in zip(names, parts[1:]):
        assert mx.array_equal(other, parts[0]).item(), f"{label}: {name} give other bits"
    return parts[0]


def fma_grid(backend, n, z=1):
    """gpu.py's grid (32, ceil(N / 4), z) over threadgroups of 2 warps, in warps: CUDA runs whole blocks (a spare
    warp past N returns at once); Metal's last threadgroup is cut to the grid."""
    ys = -(-n // fma.COLS)
    return (ys if backend == "metal" else 2 * -(-ys // 2), z)


def weights(n, k, s_dtype, g, bits, mode, seed=0):
    """(w, scales, biases), [w; w] with its scales and biases (mxfp4: the stand-in gpu.py passes),
    and the bytes of a row of each."""
    w, s, b = quantized(n, k, s_dtype, g, bits, mode, seed)
    b = None if mode == "mxfp4" else b
    two = {key: mx.concatenate([a, a]) for key, a in zip("wsb", (w, s, b)) if a is not None}
    two.setdefault("b", gpu._biases(None, s, mode))
    return (w, s, b), two, (w.shape[1] * 4, s.shape[1] * s.itemsize, 0 if b is None else b.shape[1] * b.itemsize)


def variants(key_of, grid_of, m, n, k, per_row, chunk):
    """Four ways to the same rows: M rows (`chunk` a launch) on w's second copy (ending the buffer), each row
    alone, M rows with x 2 bytes off, M rows with x 8 bytes off on w's first copy."""
    def rows(xoff, sliced, first=0, count=m):
        return [dict(key=key_of(c), m=c, n=n, k=k, grid=grid_of(c), xoff=xoff, xrow=r,
                     **{f: sliced * n * b for f, b in zip(("wb", "sb", "bb"), per_row)})
                for r in range(first, first + count, chunk) for c in [min(chunk, first + count - r)]]
    return [rows(0, 1), [rows(0, 1, r, 1)[0] for r in range(m)], rows(2, 1), rows(8, 0)]


QMM_CASES = [("fma", b, layout) for b in ("metal", "cuda") for layout in LAYOUTS] + [
    ("matrix", b, layout) for b in ("cuda", "metal") for layout in MATRIX_LAYOUTS]


@pytest.mark.parametrize("case", QMM_CASES, ids=lambda c: "-".join(map(str, (c[0], c[1], *c[2]))))
def test_qmm_edges(tmp_path, programs, case):
    """FMA: N under a tile and a tile + 1, 16 + 1 and 65 rows, K = G and 3 G. Tensor-core and simdgroup-matrix
    qmms: one launch of the build the wrapper takes for its rows (65: 2 column tiles and 8 or 2 row tiles);
    K = G: one group (3 of 4 warps idle), 5 G: warp 0 takes 2."""
    family, backend, (g, bits, mode) = case
    x_dtype, src, (narrow, wide) = X_DTYPE[backend], *MATRIX[backend]
    shapes = ((1, 1, 1), (17, 5, 1), (65, 3, 3)) if family == "fma" else ((1, 1, 1), (65, 17, 1), (65, 17, 5))
    for m, n, groups in shapes:  # (M, N, K in groups)
        k = g * groups
        mats, arrays, per_row = weights(n, k, scale_dtype(x_dtype, mode), g, bits, mode)
        x = mx.random.normal((m, k), key=mx.random.key(m)).astype(x_dtype)
        if family == "fma":  # gpu._rows: 16 rows a launch, each at its smallest build here
            key_of, grid_of, chunk = (lambda c: ("qmm", g, bits, mode, 1 if c == 1 else 16),
                                      lambda c: fma_grid(backend, n), fma.MAX_ROWS)
        else:
            build = {c: wide if c > 8 else narrow for c in (1, m)}
            assert all((src.tiles_for(c), src.row_tiles(c)) == b[:2] for c, b in build.items())  # the wrapper's
            grid = {c: src.launch(c, n, *b[::2])["grid"] for c, b in build.items()}
            key_of, grid_of, chunk = (lambda c: (g, bits, *build[c][:2]), lambda c: (grid[c][1] // 4, grid[c][2]), m)
        y = check_same(run_groups(programs[(backend, family)], tmp_path, variants(key_of, grid_of, m, n, k, per_row,
                                                                                 chunk), x=x, **arrays), f"{m}x{n}x{k}")
        ok, ratio = within_tolerance(y, x, *mats, g, bits, mode=mode)
        assert ok, f"{case} {m}x{n}x{k}: error {ratio:.3g}x the tolerance"


@pytest.mark.parametrize("backend", ["metal", "cuda"])
@pytest.mark.parametrize("layout", GATHER_LAYOUTS, ids=lambda v: "-".join(map(str, v)))
def test_gathers_give_each_row_the_qmm_bits_of_its_expert(tmp_path, programs, backend, layout):
    """Repeated, unsorted indices, the largest expert, an expert no row chose (3), an expert taking two passes
    of the grouped gather (4: 5 rows), a single expert: each row = the qmm's one-row launch on its expert's
    rows of the stacked experts (a row slice), in both gathers, with x 2 and 8 bytes off."""
    g, bits, mode = layout
    x_dtype, n, k = X_DTYPE[backend], 5, 2 * g
    for ids in ([4, 0, 4, 4, 1, 4, 4, 0, 2], [0, 0, 0]):
        p, experts = len(ids), max(ids) + 1
        mats = [weights(n, k, scale_dtype(x_dtype, mode), g, bits, mode, seed=e) for e in range(experts)]
        arrays = {key: mx.stack([e[0][i] for e in mats]) for i, key in enumerate("wsb") if mats[0][0][i] is not None}
        arrays.setdefault("b", mats[0][1]["b"])
        x = mx.random.normal((p, k), key=mx.random.key(p)).astype(x_dtype)
        gather, grouped = (dict(key=(kind, g, bits, mode, r), m=p, n=n, k=k, e=experts, grid=fma_grid(backend, n, z))
                           for kind, r, z in (("gather", 1, p), ("grouped", GROUPED_CAP, experts)))
        qmm = [dict(key=("qmm", g, bits, mode, 1), m=1, n=n, k=k, xrow=r, grid=fma_grid(backend, n),
                    **{f: e * n * b for f, b in zip(("wb", "sb", "bb"), mats[0][2])}) for r, e in enumerate(ids)]
        groups = [[gather], qmm, [gather | dict(xoff=2)], [grouped | dict(xoff=8)], [grouped]]
        parts = run_groups(programs[(backend, "fma")], tmp_path, groups, x=x, idx=mx.array(ids, mx.uint32), **arrays)
        y = check_same(parts, f"{layout} {ids}", ("qmm's one-row launches", "x 2 bytes off",
                                                  "the grouped gather, x 8 bytes off", "the grouped gather"))
        for e, ((we, se, be), *_) in enumerate(mats):
            if rows := [r for r, i in enumerate(ids) if i == e]:
                ok, ratio = within_tolerance(y[mx.array(rows)], x[mx.array(rows)], we, se, be, g, bits, mode=mode)
                assert ok, f"{layout} expert {e}: error {ratio:.3g}x the tolerance"


@pytest.mark.parametrize("backend", ["metal", "cuda"])
def test_dense_edges(tmp_path, programs, backend):
    x_dtype = X_DTYPE[backend]
    for m, n, k in ((1, 1, 1), (17, 5, 33), (65, 3, 40)):
        w = mx.random.normal((n, k), key=mx.random.key(k)).astype(x_dtype)
        x = mx.random.normal((m, k), key=mx.random.key(m)).astype(x_dtype)
        groups = variants(lambda c: ("dense", 1 if c == 1 else 16), lambda c: fma_grid(backend, n), m, n, k,
                          (k * w.itemsize, 0, 0), chunk=fma.MAX_ROWS)
        y = check_same(run_groups(programs[(backend, "fma")], tmp_path, groups, x=x, w=mx.concatenate([w, w])),
                       f"dense {m}x{n}x{k}")
        ok, ratio = dense_within_tolerance(y, x, w)
        assert ok, f"dense {m}x{n}x{k}: error {ratio:.3g}x the tolerance"


def test_wrappers_launch_nothing_for_no_rows_and_keep_cuda_grids_in_range(monkeypatch):
    """gpu.py over stand-in kernels: no rows (or pairs) make no launch (a grid dimension of 0 is invalid) and give
    the right shapes; a 262144-column head (Gemma 3's vocabulary) at 1, 17 and 65 rows keeps each grid dimension
    of the FMA and tensor-core launches, in blocks, within CUDA's 65535 (y, z)."""
    from test_gpu_wrappers import stand_in_launches
    from test_gpu_wrappers import weights as small

    launches = stand_in_launches(monkeypatch, "cuda")
    qmm, tensor, gather = gpu.cuda_qmm_function(), gpu.cuda_mma_qmm_function(None), gpu.cuda_gather_qmm_function()
    for fn in (qmm, tensor):
        assert fn(mx.zeros((2, 0, 128), mx.float16), *small(), 64, 4).shape == (2, 0, 40)
    for per_expert in (1, 2):
        no_pairs = (mx.zeros((0, 128), mx.float16), *small(e=3), mx.zeros((0,), mx.uint32), 64, 4)
        assert gather(*no_pairs, per_expert=per_expert).shape == (0, 40)
    assert launches == []
    w, s, b = mx.quantize(mx.zeros((262144, 32), mx.float16), group_size=32, bits=4)
    for fn in (qmm, tensor):
        for m in (1, 17, 65):
            assert fn(mx.zeros((m, 32), mx.float16), w, s, b, 32, 4).shape == (m, 262144)
    for name, _, _, _, grid in launches:
        group = fma.THREADGROUP if name == fma.NAME else (32, mma.KSPLIT, 1)
        blocks = [-(-a // t) for a, t in zip(grid, group)]
        assert blocks[0] == 1 and all(1 <= v <= 65535 for v in blocks[1:]), (name, grid)
