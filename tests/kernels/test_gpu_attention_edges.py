"""Edge cases of the few-row attention kernels launched exactly as the wrappers launch them: the FMA family
(gpu_attention_source.py) and the matrix-unit one (tensor cores, simdgroup matrices: gpu_attention_mma_source.py,
gpu_attention_simdgroup_source.py; 64-key chunks here, every case whose head dims the family takes).

Each launch's template, grid, params, length and sinks are what gpu_attention._sdpa_function computes (CHUNK = 64 as in
test_gpu_attention_sources.py: blocks share key reads from 449 keys; WARPS = 2 warps a block), run under the emulator (ASan, UBSan alignment),
Metal in float16, CUDA in bfloat16. Checked: within attention_within_tolerance, and bit-equal where the kernel
promises (row i of an M-row launch == a 1-row launch over its keys or window; strided, offset, padded views ==
contiguous inputs; a whole buffer with `length` == the launch over those keys):
- L = 1, 63, 64, 65, 97, 448, 449, 512, 513; M = 1, 2, 15, 16 and M == L; GQA 1, 7, 8; D = DV = 80, 84, 96, 256, D != DV;
- q / k / v views: transposed, caches with room, k and v halves of one buffer, 2 and 8 bytes past 16-byte alignment,
  rows / heads / dims off CUDA's 16-byte grid: CUDA takes 16-byte key loads exactly where keys_wide allows;
- windows shorter than a chunk, not chunk-aligned, of 8+ chunks (blocks sharing reads); sinks; softcap; length past the buffer.
What a launch must not read (outside a view, past `length`, around a lone row's window) is NaN, as are the partial's
outputs before it runs (psum 1): a stray read or an unwritten slot fails. Last: the wrapper's ValueErrors for shapes a
GPU could not run (a grid dimension of 0 or, on CUDA, past 65535; k / v reads past their ends).
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from emulator_harness import C_TYPES, CXX, build_all, from_np, run, to_np
from mlxspec.kernels import gpu_attention
from mlxspec.kernels import gpu_attention_mma_source, gpu_attention_simdgroup_source
from mlxspec.kernels import gpu_attention_source as src
from mlxspec.kernels.attention import attention_within_tolerance
from mlxspec.kernels.gpu_codegen import cuda_function, cuda_program, metal_function
from attention_harness import CUDA_COMBINE, METAL_COMBINE
from test_gpu_attention_sources import CHUNK, WARPS

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

BACKENDS = {"metal": mx.float16, "cuda": mx.bfloat16}  # q, k and v in this dtype
BUILDS = [(1, 3), (4, 3), (1, 8)]  # (HEADS, DPL) of the partials compiled: every launch below is one of them
# The matrix-unit family (tensor cores, simdgroup matrices): 64 keys a warp here (128 in production); a build per head
# dims (its templates' DK, DN), those of the launches below that the family takes (D 84: none; 256: Metal's only)
MATRIX = {"cuda": gpu_attention_mma_source, "metal": gpu_attention_simdgroup_source}
MMA_CHUNK = 64
MMA_DIMS = [(80, 80), (96, 64), (64, 96), (96, 96), (256, 256)]
FAMILIES = ["fma", "mma"]


def mma_builds(backend: str) -> list[tuple[int, int]]:
    """(D, DV) of the matrix family's builds on this backend."""
    dtype = BACKENDS[backend]
    return [(d, dv) for d, dv in MMA_DIMS if MATRIX[backend].supports(dtype, dtype, d, dv)]


def takes(backend: str, family: str, d: int, dv: int) -> bool:
    dtype = BACKENDS[backend]
    return family == "fma" or MATRIX[backend].supports(dtype, dtype, d, dv)
INTS = ["build", "direct", "sinks", "H", "HKV", "M", "D", "DV", "S", "L", "blocks", "nch", "narrow", "causal", "window", "by_rows"]
I64 = ["s_at", "s_n"] + [f"{a}_{f}" for a in "qkv" for f in ("at", "n", "off", "s0", "s1", "s2", "s3")]
FIELDS = INTS + ["scale", "softcap"] + I64
HARNESS = """
inline bool force_narrow = false;  // CUDA: keys one by one whatever keys_wide says
inline int wide_seen = 0;  // bit 1: a warp read keys one by one, bit 2: in 16-byte loads
{source}
using T = {T};
template <typename E> std::vector<E> part(const std::vector<E>& pool, int64_t at, int64_t n) {{
  return std::vector<E>(pool.begin() + at, pool.begin() + at + n);  // an allocation of its own: ASan's bounds
}}
int main(int argc, char** argv) {{
  const std::string d = argv[1];
  const int n = std::atoi(argv[2]);
  const auto spec = load<double>(d + "/spec", size_t(n) * {F});
  const auto qp = load<T>(d + "/q", std::atoll(argv[3])), kp = load<T>(d + "/k", std::atoll(argv[4])),
             vp = load<T>(d + "/v", std::atoll(argv[5]));
  const auto sp = load<float>(d + "/s", std::atoll(argv[6]));  // each launch's (H*M,) sinks, or one unused
  std::ofstream out(d + "/o", std::ios::binary), wides(d + "/wide", std::ios::binary);
  for (int i = 0; i < n; ++i) {{
    const double* f = &spec[size_t(i) * {F}];
{unpack}
    auto q = part(qp, q_at, q_n), k = part(kp, k_at, k_n), v = part(vp, v_at, v_n);
    const auto s = part(sp, s_at, s_n);
    if (reinterpret_cast<size_t>(k.data()) % 16 || reinterpret_cast<size_t>(v.data()) % 16) std::abort();
    float params[5] = {{scale, float(causal), float(window), float(by_rows), softcap}};
    int length[1] = {{L}}, HM = H * M, NCH = nch;
    std::vector<int32_t> tree{{-1}};
    std::vector<float> pmax(HM * NCH, NAN), psum(HM * NCH, 1.0f), pacc(size_t(HM) * NCH * DV, NAN);
    std::vector<T> o(size_t(HM) * DV);
    force_narrow = narrow, wide_seen = 0;
    {shapes}
    switch (build + (direct ? {builds} : 0)) {{  // the direct builds (<= DIRECT_CHUNKS chunks, no sinks) write o themselves
{partials}
      default: std::abort();
    }}
    if (direct) {{}}
    else if (sinks) emu::run_grid(HM, 1, [&](int lane, int y, int) {{ {combine1} }});
    else emu::run_grid(HM, 1, [&](int lane, int y, int) {{ {combine0} }});
    save(out, o);
    wides.put(char(wide_seen));
  }}
}}
"""
ARGS = ("q.data() + q_off, qs, qt, k.data() + k_off, ks, kt, v.data() + v_off, vs, vt, params, length, tree.data(), "
        "{outs}")
CALL = {"metal": "{fn}<T, %d, {heads}, {dpl}, 0, %d, 1>(%s, uint3{{unsigned(lane), unsigned(y * %d + w), unsigned(z)}});"
                  % (CHUNK, WARPS, ARGS, WARPS),
        "cuda": "threadIdx = dim3{{unsigned(lane), unsigned(w), 0}}; blockIdx = dim3{{0, unsigned(y), unsigned(z)}};\n"
                "        blockDim = dim3{{32, %d, 1}}; mlx::core::cu::{fn}(%s);" % (WARPS, ARGS)}
MMA_CALL = {"metal": "{fn}<T, T, %d, {dk}, {dn}, 0>(%s, uint3{{unsigned(lane), unsigned(y), unsigned(z)}});" % (MMA_CHUNK, ARGS),
            "cuda": "threadIdx = dim3{{unsigned(lane), 0, 0}}; blockIdx = dim3{{0, unsigned(y), unsigned(z)}};\n"
                    "        blockDim = dim3{{32, 1, 1}}; mlx::core::cu::{fn}(%s);" % ARGS}
OUTS = {"partial": "pmax.data(), psum.data(), pacc.data()", "direct": "o.data()"}
SHAPES = {"metal": "int qs[4] = {1, H, M, D}, ks[4] = {1, HKV, S, D}, vs[4] = {1, HKV, S, DV};\n    int64_t "
                   "qt[4] = {q_s0, q_s1, q_s2, q_s3}, kt[4] = {k_s0, k_s1, k_s2, k_s3}, vt[4] = {v_s0, v_s1, v_s2, v_s3};",
          "cuda": "Shape qs{1, H, M, D}, ks{1, HKV, S, D}, vs{1, HKV, S, DV};\n    "
                  "Strides qt{q_s0, q_s1, q_s2, q_s3}, kt{k_s0, k_s1, k_s2, k_s3}, vt{v_s0, v_s1, v_s2, v_s3};"}


def harness(backend: str, family: str = "fma") -> str:
    if family == "mma":
        return mma_harness(backend)
    dtype = BACKENDS[backend]
    kernels, texts, names = src._kernels(dtype), [], []  # BUILDS' partials, their direct builds, then the combine
    sizes = dict.fromkeys(src.PARTIAL_INPUTS + src.COMBINE_INPUTS, 99) | {"params": 5, "length": 1, "tree": 1}
    for kind, targs in [(kind, src.partial_template(dtype, CHUNK, h, p, warps=WARPS)) for kind in ("partial", "direct")
                        for h, p in BUILDS] + [("combine", src.combine_template(dtype, s)) for s in (False, True)]:
        kernel, dtypes = kernels[kind]
        body = src.BODIES[(backend, kind)]
        name, text = (metal_function(kernel, dtypes, sizes, targs, body) if backend == "metal"
                      else cuda_function(kernel, dtypes, targs, body))
        names.append(name), texts.append(text)
    if backend == "metal":
        source = src.METAL_HEADER + "".join(texts)
    else:
        source = cuda_program(src.CUDA_HEADER, texts)
        assert src.CUDA_WIDE in source
        wide = src.CUDA_WIDE.replace("= keys_wide", "= !force_narrow && keys_wide") + "  wide_seen |= wide ? 2 : 1;\n"
        source = source.replace(src.CUDA_WIDE, wide)
    partials = "\n".join(f"      case {i}: emu::run_blocks(blocks, nch, {WARPS}, [&](int lane, int w, int y, int z) {{\n        "
                         + CALL[backend].format(fn=names[i], heads=h, dpl=p, outs=OUTS[kind]) + "\n      }); break;"
                         for i, (kind, (h, p)) in enumerate((kind, b) for kind in ("partial", "direct") for b in BUILDS))
    return _harness(backend, source, partials, len(BUILDS), names[-2:])


def mma_harness(backend: str) -> str:
    """The matrix family's partial and direct builds for each of mma_builds(backend), then the combine."""
    dtype, mod, builds = BACKENDS[backend], MATRIX[backend], mma_builds(backend)
    kernels = mod.kernels(dtype, dtype)
    sizes = mod.SIZES | {"sinks": 99, "o": 99, "o_out": 99} if backend == "metal" else None
    texts, names = [], []
    for kind, targs in [(kind, mod.template(dtype, dtype, d, dv, MMA_CHUNK)) for kind in ("partial", "direct")
                        for d, dv in builds] + [
            ("combine", src.combine_template(dtype, s)) for s in (False, True)]:
        kernel, dtypes = kernels[kind]
        name, text = (metal_function(kernel, dtypes, sizes, targs, mod.BODIES[kind]) if backend == "metal"
                      else cuda_function(kernel, dtypes, targs, mod.BODIES[kind]))
        names.append(name), texts.append(text)
    if backend == "metal":
        source = mod.HEADER + "".join(texts)
    else:
        source = cuda_program(mod.HEADER, texts)
        for flag in ("k_wide", "v_wide"):  # forced narrow: one value at a time whatever the views allow
            assert f"const bool {flag} = " in source
            source = source.replace(f"const bool {flag} = ", f"const bool {flag} = !force_narrow && ")
        source = source.replace("  const uint16_t* kh =", "  wide_seen |= k_wide ? 2 : 1;\n  const uint16_t* kh =")
    step = 16 if backend == "cuda" else 8  # DK's dims a step
    partials = "\n".join(f"      case {i}: emu::run_blocks(blocks, nch, 1, [&](int lane, int w, int y, int z) {{\n        "
                         + MMA_CALL[backend].format(fn=names[i], dk=d // step, dn=dv // 8, outs=OUTS[kind]) + "\n      }); break;"
                         for i, (kind, (d, dv)) in enumerate((kind, b) for kind in ("partial", "direct") for b in builds))
    return _harness(backend, source, partials, len(builds), names[-2:])


def _harness(backend: str, source: str, partials: str, builds: int, combines: list[str]) -> str:
    ctype = {f: "int" if f in INTS else "float" if f in ("scale", "softcap") else "int64_t" for f in FIELDS}
    unpack = "\n".join(f"    const {ctype[f]} {f} = {ctype[f]}(f[{i}]);" for i, f in enumerate(FIELDS))
    combine = METAL_COMBINE if backend == "metal" else CUDA_COMBINE
    dtype = BACKENDS[backend]
    return HARNESS.format(source=source, T=C_TYPES[dtype], F=len(FIELDS), unpack=unpack, partials=partials, builds=builds,
                          shapes=SHAPES[backend], combine0=combine.format(c=combines[0], sinks=0),
                          combine1=combine.format(c=combines[1], sinks=1))


@pytest.fixture(scope="module")
def exes() -> dict:
    labels = [(b, f) for b in BACKENDS for f in FAMILIES]
    return dict(zip(labels, build_all([harness(b, f) for b, f in labels], asan=True)))


def raw(shape, dtype, seed: int, mult: float = 1.0) -> np.ndarray:
    """Random values in `dtype` as numpy holds them (bfloat16: its bits as uint16)."""
    return to_np((mx.random.normal(shape, key=mx.random.key(seed)) * mult).astype(dtype))


def place(a: np.ndarray, dtype, shape=None, pick=lambda b: b, off: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(buffer, view): a NaN buffer of `shape` (default a's) `off` elements into its allocation, and pick(it) = a."""
    nan = to_np(mx.array([math.nan]).astype(dtype))
    buf = np.full(off + math.prod(shape or a.shape), nan[0], nan.dtype)
    view = pick(buf[off:].reshape(shape or a.shape))
    view[...] = a
    return buf, view


class Batch:
    """Launches made as the wrapper makes them (its template, grid, params, length, sinks), run in one process."""

    def __init__(self, backend: str, family: str = "fma"):
        self.backend, self.family, self.dtype, self.launches = backend, family, BACKENDS[backend], []
        self.pools = {p: [] for p in "qkvs"}
        self.walks = 0  # direct launches over more than one chunk
        seen = self.seen = []

        def make(name, input_names, **_):
            def launch(inputs, template, grid, output_shapes, output_dtypes, **__):
                seen.append((name, dict(zip(input_names, inputs)), dict(template), grid))
                return [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes)]
            return launch

        if family == "fma":
            self.sdpa = gpu_attention._sdpa_function(make, backend, WARPS)
        else:
            self.sdpa = gpu_attention._matrix_sdpa_function(make, backend, MATRIX[backend], MMA_CHUNK)

    def add(self, q, k, v, causal: bool = True, narrow: bool = False, **kw) -> int:
        """q, k, v: (buffer, view) pairs (place); kw: the wrapper's window, sinks, length, softcap."""
        self.seen.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gpu_attention, "CHUNK", CHUNK)
            self.sdpa(*(mx.zeros(a.shape, self.dtype) for _, a in (q, k, v)), q[1].shape[3] ** -0.5, causal, **kw)
        (p_name, p_in, p_t, p_grid), *combine = self.seen  # a direct launch (few chunks, no sinks) has no combine
        (_, h, m, d), (_, hkv, keys, dv) = q[1].shape, v[1].shape
        direct, window = p_name.endswith("_direct"), kw.get("window", 0)
        fma = self.family == "fma"
        nch = -(-min(keys, window or keys) // (CHUNK if fma else MMA_CHUNK))
        most = src.DIRECT_CHUNKS if fma else 1  # chunks a direct launch walks
        assert direct == (nch <= most and kw.get("sinks") is None) and len(combine) == (0 if direct else 1)
        assert p_grid[2] == (1 if direct else nch)  # a direct launch: one block walks the chunks
        self.walks += direct and nch > 1
        (_, c_in, c_t, c_grid), = combine or [(None, {"sinks": np.zeros(1, np.float32)}, {"SINKS": 0}, (32, h * m, 1))]
        warps = WARPS if fma else 1
        assert p_grid[0] == 32 and p_grid[1] % warps == 0 and p_t.get("WARPS", 1) == warps and c_grid == (32, h * m, 1)
        build = BUILDS.index((p_t["HEADS"], p_t["DPL"])) if fma else mma_builds(self.backend).index((d, dv))
        fields = dict(build=build, direct=direct, sinks=c_t["SINKS"], H=h, HKV=hkv, M=m, D=d, DV=dv,
                      S=keys, L=p_in["length"].item(), blocks=p_grid[1] // warps, nch=p_grid[2], narrow=narrow,
                      **dict(zip(["scale", "causal", "window", "by_rows", "softcap"], p_in["params"].tolist())))
        for name, (buf, view) in zip("qkvs", (q, k, v, (np.array(c_in["sinks"]),) * 2)):
            buf = buf.reshape(-1)  # the same memory
            fields.update({f"{name}_at": sum(map(len, self.pools[name])), f"{name}_n": len(buf)})
            self.pools[name].append(buf)
            if name != "s":
                fields[f"{name}_off"] = (view.ctypes.data - buf.ctypes.data) // buf.itemsize
                fields.update({f"{name}_s{i}": s // buf.itemsize for i, s in enumerate(view.strides)})
        self.launches.append((fields, (1, h, m, dv)))
        return len(self.launches) - 1

    def run(self, exe, tmp_path) -> tuple[list[mx.array], bytes]:
        """Every launch's output (1, H, M, DV), and which key loads each took (bit 1: one by one, 2: 16 bytes)."""
        np.array([[f[n] for n in FIELDS] for f, _ in self.launches], np.float64).tofile(tmp_path / "spec")
        for name, bufs in self.pools.items():
            np.concatenate(bufs).tofile(tmp_path / name)
        run(exe, tmp_path, len(self.launches), *(sum(map(len, self.pools[p])) for p in "qkvs"))
        data, ends = (tmp_path / "o").read_bytes(), np.cumsum([0] + [math.prod(s) * self.dtype.size for _, s in self.launches])
        outs = [from_np(data[a:b], self.dtype, s) for a, b, (_, s) in zip(ends, ends[1:], self.launches)]
        return outs, (tmp_path / "wide").read_bytes()


def logical(view: np.ndarray, dtype) -> mx.array:
    return from_np(np.ascontiguousarray(view).tobytes(), dtype, view.shape)


def check(batch: Batch, exe, tmp_path, near: list, same: list) -> bytes:
    """Run the batch; near: (launch, (q, k, v), reference kwargs, label) within tolerance; same: (a, b, label) bit-equal,
    each a launch, a list of 1-row launches (its rows) or (launch, row). Returns each launch's key loads."""
    outs, wide = batch.run(exe, tmp_path)
    pick = lambda at: (mx.concatenate([outs[i] for i in at], axis=2) if isinstance(at, list)  # noqa: E731
                       else outs[at[0]][:, :, at[1] : at[1] + 1] if isinstance(at, tuple) else outs[at])
    for at, (q, k, v), kw, label in near:
        ok, ratio = attention_within_tolerance(outs[at], *(logical(a, batch.dtype) for a in (q, k, v)), q.shape[3] ** -0.5, **kw)
        assert ok, f"{batch.backend} {label}: error {ratio:.3g}x the tolerance"
    for a, b, label in same:
        assert mx.array_equal(pick(a), pick(b)).item(), f"{batch.backend} {label}: other bits"
    return wide


SHAPES_RUN = [  # (H, HKV, D, DV, L, M): 449 keys = 8 chunks, where a warp starts serving HEADS query heads
    (2, 2, 80, 80, 1, 1), (14, 2, 96, 64, 63, 2), (8, 1, 80, 80, 64, 16), (14, 2, 64, 96, 65, 15), (2, 2, 256, 256, 16, 16),
    (14, 2, 96, 96, 448, 2), (8, 1, 80, 80, 449, 16), (14, 2, 96, 96, 513, 1), (2, 2, 80, 80, 512, 15),
    (2, 1, 84, 84, 97, 2)]  # keys ending at a 32-key step inside a chunk; D % 8 != 0


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_key_counts_rows_heads_and_head_dims(tmp_path, exes, backend, family):
    dtype, batch, near, same = BACKENDS[backend], Batch(backend, family), [], []
    for n, (h, hkv, d, dv, length, m) in enumerate(SHAPES_RUN):
        if not takes(backend, family, d, dv):
            continue
        q, k, v = raw((1, h, m, d), dtype, 3 * n, 2.0), raw((1, hkv, length, d), dtype, 3 * n + 1), raw(
            (1, hkv, length, dv), dtype, 3 * n + 2)
        views = place(q, dtype), *(place(a, dtype, a.shape[:2] + (length + 7,) + a.shape[3:], lambda b: b[:, :, :length])
                                   for a in (k, v))  # a cache with room: NaN past the keys
        causal, full = batch.add(*views), batch.add(*views, causal=False)
        alone = [batch.add(place(q[:, :, i : i + 1], dtype), place(k[:, :, : length - m + i + 1], dtype),
                           place(v[:, :, : length - m + i + 1], dtype), causal=False) for i in range(m)]
        label = f"{(h, hkv, d, dv, length, m)}"
        near += [(causal, (q, k, v), dict(causal=True), label), (full, (q, k, v), dict(causal=False), label + " unmasked")]
        same += [(causal, alone, label + " rows alone"), ((full, m - 1), (alone[-1], 0), label + " unmasked last row")]
    builds = BUILDS if family == "fma" else mma_builds(backend)
    assert {f["build"] for f, _ in batch.launches} == set(range(len(builds)))  # FMA: one head a warp and HEADS, DPL 3, 8
    assert {f["direct"] for f, _ in batch.launches} == {0, 1}  # FMA up to DIRECT_CHUNKS chunks, else one: direct builds
    assert bool(batch.walks) == (family == "fma")
    check(batch, exes[backend, family], tmp_path, near, same)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_and_misaligned_views_give_the_same_bits(tmp_path, exes, backend, family):
    """CUDA's 16-byte key loads (bit 2 of `wide`) only where keys_wide allows them: contiguous dims, key rows and
    head strides multiples of 8 values, k 16-byte aligned, D a multiple of 8; else one by one (bit 1): the same bits."""
    dtype, batch, (h, hkv, m, length, cap) = BACKENDS[backend], Batch(backend, family), (4, 2, 4, 100, 130)
    q, k, v = raw((1, h, m, 80), dtype, 0, 2.0), raw((1, hkv, length, 80), dtype, 1), raw((1, hkv, length, 80), dtype, 2)
    q84, k84, v84 = raw((1, h, m, 84), dtype, 3, 2.0), raw((1, hkv, length, 84), dtype, 4), raw((1, hkv, length, 84), dtype, 5)
    halves = place(np.concatenate([k, v], axis=3), dtype, (1, hkv, cap, 160), lambda b: b[:, :, :length])
    padded = [place(a, dtype, (1, hkv, length, 88), lambda b: b[..., :84]) for a in (k84, v84)]
    variants = {  # name: (q, k, v, narrow, the key loads CUDA must take)
        "contiguous": (place(q, dtype), place(k, dtype), place(v, dtype), False, 2),
        "views": (place(q, dtype, (1, m, h, 80), lambda b: b.transpose(0, 2, 1, 3)),
                  *(place(a, dtype, (1, hkv, cap, 80), lambda b: b[:, :, :length]) for a in (k, v)), False, 2),
        "halves": (place(q, dtype), (halves[0], halves[1][..., :80]), (halves[0], halves[1][..., 80:]), False, 2),
        "2 bytes off": (place(q, dtype), place(k, dtype, off=1), place(v, dtype, off=1), False, 1),
        "8 bytes off": (place(q, dtype), place(k, dtype, off=4), place(v, dtype, off=4), False, 1),
        "rows off 16 bytes": (place(q, dtype, (1, h, m, 83), lambda b: b[..., :80]),
                              *(place(a, dtype, (1, hkv, length, 84), lambda b: b[..., :80]) for a in (k, v)), False, 1),
        "heads off 16 bytes": (place(q, dtype), *(place(a, dtype, (1, hkv, length * 80 + 4),
                                                        lambda b: b[..., : length * 80].reshape(a.shape)) for a in (k, v)), False, 1),
        "dims strided": (place(q, dtype, (1, m, 80, h), lambda b: b.transpose(0, 3, 1, 2)),
                         *(place(a, dtype, a.shape + (2,), lambda b: b[..., 0]) for a in (k, v)), False, 1),
        "one by one": (place(q, dtype), place(k, dtype), place(v, dtype), True, 1),
        "D 84 contiguous": (place(q84, dtype), place(k84, dtype), place(v84, dtype), False, 1),
        "D 84 in rows of 88, the buffer ending at the last dim": (  # 16-byte loads would read 8 bytes past it
            place(q84, dtype), *((b[:-4], view) for b, view in padded), False, 1),
    }
    if not takes(backend, family, 84, 84):  # the matrix family's dims come in 8- or 16-dim tiles
        variants = {name: variant for name, variant in variants.items() if not name.startswith("D 84")}
    at = {name: batch.add(qv, kv, vv, narrow=narrow) for name, (qv, kv, vv, narrow, _) in variants.items()}
    near = [(at["contiguous"], (q, k, v), dict(causal=True), "contiguous")]
    if "D 84 contiguous" in at:
        near.append((at["D 84 contiguous"], (q84, k84, v84), dict(causal=True), "D 84"))
    same = [(at[name], at["D 84 contiguous" if name.startswith("D 84") else "contiguous"], name) for name in variants]
    wide = check(batch, exes[backend, family], tmp_path, near, same)
    for name, (*_, loads) in variants.items():
        assert wide[at[name]] == (loads if backend == "cuda" else 0), f"{backend} {name}: key loads {wide[at[name]]}"


WINDOWED = [  # (H, HKV, D = DV, sinks, softcap, L, windows): Gemma 2's dims and cap; gpt-oss's sinks; windows of 8+ chunks
    (2, 1, 256, False, 2.0, 150, (0, 5, 40, 70, 130)), (4, 2, 80, True, 0.0, 150, (0, 5, 40, 70, 130)),
    (8, 2, 80, False, 0.0, 520, (460,))]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_windows_sinks_softcap_and_lengths(tmp_path, exes, backend, family):
    """Windows shorter than a chunk (64) and not chunk-aligned (0: none), causal over M = 8 rows: row i bit-equal to a
    1-row launch over exactly its window, a launch over the whole buffer (NaN past L) with length L bit-equal."""
    dtype, batch, near, same, m = BACKENDS[backend], Batch(backend, family), [], [], 8
    for n, (h, hkv, d, with_sinks, softcap, length, windows) in enumerate(WINDOWED):
        if not takes(backend, family, d, d):
            continue
        cap = length + 40
        q, k, v = raw((1, h, m, d), dtype, 10 + n, 3.0), *(raw((1, hkv, length, d), dtype, 20 + 10 * n + i) for i in (0, 1))
        kw = dict(sinks=mx.random.normal((h,), key=mx.random.key(n)) * 2 if with_sinks else None, softcap=softcap)
        qv, kb, vb = place(q, dtype), *(place(a, dtype, (1, hkv, cap, d), lambda b: b[:, :, :length]) for a in (k, v))
        whole = [(buf, buf.reshape(1, hkv, cap, d)) for buf, _ in (kb, vb)]  # the buffer: NaN past the keys
        for w in windows:
            label, exact = f"{(h, d, length)} window {w}", batch.add(qv, kb, vb, window=w, **kw)
            buffered = batch.add(qv, *whole, window=w, length=mx.array(length, mx.int32), **kw)
            rows = [slice(max(0, length - m + i + 1 - w) if w else 0, length - m + i + 1) for i in range(m)]
            alone = [batch.add(place(q[:, :, i : i + 1], dtype), place(k[:, :, r], dtype), place(v[:, :, r], dtype),
                               causal=False, **kw) for i, r in enumerate(rows)]  # row i alone over exactly its window
            near.append((exact, (q, k, v), dict(causal=True, window=w, **kw), label))
            same += [(exact, alone, label + " rows alone"), (buffered, exact, label + " with a length")]
            if w:  # the last row alone, causal over the whole buffer: every key outside its window is NaN
                bufs = [place(a[:, :, length - w :], dtype, (1, hkv, cap, d), lambda b: b[:, :, length - w : length])[0]
                        for a in (k, v)]
                lone = batch.add(place(q[:, :, m - 1 :], dtype), *((b, b.reshape(1, hkv, cap, d)) for b in bufs),
                                 window=w, length=mx.array([length]), **kw)
                same.append(((exact, m - 1), lone, label + " last row alone, NaN around its window"))
            else:  # a length past the buffer: every key counts
                same.append((batch.add(qv, kb, vb, length=mx.array([cap + 100]), **kw), exact, label + " length past it"))
    check(batch, exes[backend, family], tmp_path, near, same)


REFUSED = {  # q, k, v shapes (float16) the kernel would read out of bounds for, or launch with a grid dimension 0 or,
    "no kv heads": ((1, 2, 1, 64), (1, 0, 10, 64), (1, 0, 10, 64)),  # on CUDA, over 65535
    "no rows": ((1, 2, 0, 64), (1, 1, 10, 64), (1, 1, 10, 64)),
    "no heads": ((1, 0, 1, 64), (1, 1, 10, 64), (1, 1, 10, 64)),
    "k's dims fewer than q's": ((1, 2, 1, 64), (1, 1, 10, 32), (1, 1, 10, 64)),
    "v's keys fewer than k's": ((1, 2, 1, 64), (1, 1, 10, 64), (1, 1, 5, 64)),
    "v's heads fewer than k's": ((1, 4, 1, 64), (1, 2, 10, 64), (1, 1, 10, 64)),
    "k's batch not 1": ((1, 2, 1, 64), (2, 1, 10, 64), (2, 1, 10, 64)),
    "65536 heads x rows": ((1, 1024, 64, 16), (1, 1, 64, 16), (1, 1, 64, 16)),  # (16 dims: the matrix family's too)
    "65536 key chunks": ((1, 1, 1, 16), (1, 1, 65536 * src.CHUNK, 16), (1, 1, 65536 * src.CHUNK, 16)),
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", REFUSED)
def test_wrapper_refuses_launches_a_gpu_could_not_run(name, family):
    def make(**_):
        return lambda **__: pytest.fail(f"{name}: launched")

    if family == "fma":
        sdpa = gpu_attention._sdpa_function(make, "cuda")
    else:
        sdpa = gpu_attention._matrix_sdpa_function(make, "cuda", MATRIX["cuda"], MMA_CHUNK)
    with pytest.raises(ValueError, match="sdpa kernel"):
        sdpa(*(mx.zeros(shape, mx.float16) for shape in REFUSED[name]), 0.125, False)
