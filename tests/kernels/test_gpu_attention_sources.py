"""The Metal and CUDA few-row attention kernels (gpu_attention_source.py) under the CPU emulator.

As in test_gpu_sources.py: the program MLX would generate is compiled with g++ and run one thread
per lane. Checked: causal, unmasked and sliding-window results within attention_within_tolerance;
row i of a 16-row causal launch == a 1-row launch over keys [: L - 16 + i + 1] (some rows cross a
chunk boundary); rows of the unmasked launch == 1-row launches; a 7-row causal launch == the last 7
rows; row i of a windowed launch == a 1-row launch over exactly its window, which starts at another
key of its own copy (the window is not chunk-aligned in the cache). Builds with SINKS=1 run every
check with one sink logit per head (gpt-oss).
The M-row launches read k / v as a cache view (capacity L + ROOM keys, strided), the 1-row launches
over fewer keys read contiguous copies. A causal launch over the whole capacity with L a runtime value
(as a compiled step launches it) == the causal launch over L keys, windowed or not.
CHUNK is 64 here (256 in production, the same code) so a short L spans several chunks. The 1-row
calls are unmasked: one compiled kernel serves every mask (the mask is a runtime value).
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from emulator_harness import C_TYPES, CXX, build_all, from_np, run, save
from mlxspec.kernels import gpu_attention_source as src
from mlxspec.kernels.attention import attention_within_tolerance
from mlxspec.kernels.tree_mask import tree_rows

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

CHUNK = 64
WARPS = CHUNK // 32  # a block's warps: one 32-key step each, as in production (other builds: 1 and 4)
M, ODD = 16, 7
TREE = (-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 4, 8, 9, 7, 12, 10)  # M nodes, each row's parent row: depths up to 6
ROOM = 70  # cache positions past the L keys: a launch over the whole buffer spans one more chunk
CASES = [  # (backend, q dtype, kv dtype, sinks, H, HKV, D, DV, L, window, softcap); L - M + 1 <= 128 < L: rows see 2-3 chunks
    ("metal", mx.float32, mx.float32, False, 4, 2, 64, 64, 140, 70, 0.0),  # windows of 70 keys: 2 chunks, cut elsewhere
    ("metal", mx.bfloat16, mx.bfloat16, True, 2, 2, 128, 96, 133, 9, 0.0),
    ("cuda", mx.float16, mx.float16, False, 4, 1, 32, 32, 140, 100, 0.0),
    ("cuda", mx.float32, mx.float32, True, 2, 1, 64, 48, 70, 128, 0.0),  # a window longer than the cache: all keys
    ("metal", mx.float32, mx.float16, True, 4, 2, 64, 64, 140, 70, 0.0),  # float32 queries over a float16 cache (GGUF)
    ("cuda", mx.float32, mx.float16, False, 4, 1, 32, 32, 140, 100, 0.0),
    ("cuda", mx.float16, mx.float16, False, 4, 2, 64, 64, 140, 100, 2.0),  # Gemma 2's capped scores (a low cap)
    ("metal", mx.float32, mx.float32, False, 2, 1, 32, 32, 70, 40, 2.0),
    # rows alone over <= 64 keys (one chunk) == rows of launches over two
    ("cuda", mx.float16, mx.float16, False, 4, 2, 64, 64, 70, 40, 0.0),
]

HARNESS = """
{source}
using T = {T};
using KT = {KT};  // keys' and values' type
constexpr int CH = {chunk};
constexpr int HEADS_ = {heads}, DPL_ = {dpl}, WARPS_ = {warps};  // query heads per partial block, dims per lane, warps
constexpr int TREE_HEADS_ = {tree_heads};  // the tree build's (gpu_attention_source.tree_heads)
constexpr bool SINKS_ = {sinks};
int H, HKV, D, DV;
float params[5];  // scale, causal, window, by_rows, softcap
int length[1];  // keys that count
std::vector<int32_t> tree{{-1}};  // a tree pass's rows (tree_mask.tree_rows), or [-1]: none
std::vector<float> sinks;  // (H,): each head's sink logit (read only by SINKS=1 builds)
// launches over at most this many chunks run the direct build (gpu_attention_source.DIRECT_CHUNKS; EMU_DIRECT_CHUNKS)
const int direct_chunks = std::getenv("EMU_DIRECT_CHUNKS") ? std::atoi(std::getenv("EMU_DIRECT_CHUNKS")) : {direct_chunks};
int direct_walks = 0;  // direct launches over more than one chunk (written to <dir>/walks)
// q (H, M, D), k (HKV, cap, D), v (HKV, cap, DV) of which keys [0, L) -> o (H, M, DV); the launch sees
// keys [0, S): S = L, or (buffered, as a compiled step passes its cache) the whole capacity, L a runtime value
std::vector<T> attend(const std::vector<T>& q, int M, const std::vector<KT>& k, const std::vector<KT>& v, int L,
                      int cap, bool causal, int window = 0, bool buffered = false) {{
  const int S = buffered ? cap : L;
  params[1] = causal ? 1.0f : 0.0f;
  params[2] = float(window);
  const bool by_rows = tree[0] < 0 && (window == 0 || S <= window);  // as gpu_attention.py: every row starts at key 0
  params[3] = by_rows ? 1.0f : 0.0f;
  length[0] = L;
  const int heads = tree[0] >= 0 ? TREE_HEADS_ : HEADS_;
  const int per = H / HKV * (by_rows ? M : 1), blocks = HKV * (by_rows ? 1 : M) * ((per + heads - 1) / heads);
  const int NCH = ((window > 0 && window < S ? window : S) + CH - 1) / CH, HM = H * M;
  std::vector<float> pmax(HM * NCH), psum(HM * NCH), pacc(size_t(HM) * NCH * DV), s(HM);
  for (int hm = 0; hm < HM; ++hm) s[hm] = sinks[hm / M];  // as gpu_attention.py repeats them per row
  std::vector<T> o(size_t(HM) * DV);
  if (NCH <= direct_chunks && !SINKS_) {{  // the direct build walks the chunks and writes o, as gpu_attention.py launches it
    direct_walks += NCH > 1;
    if (tree[0] >= 0) emu::run_blocks(blocks, 1, WARPS_, [&](int lane, int w, int y, int z) {{ {direct_tree} }});
    else emu::run_blocks(blocks, 1, WARPS_, [&](int lane, int w, int y, int z) {{ {direct} }});
    return o;
  }}
  if (tree[0] >= 0)  // a tree pass: the TREE = 1 build, as gpu_attention.py launches it
    emu::run_blocks(blocks, NCH, WARPS_, [&](int lane, int w, int y, int z) {{ {partial_tree} }});
  else
    emu::run_blocks(blocks, NCH, WARPS_, [&](int lane, int w, int y, int z) {{ {partial} }});
  emu::run_grid(HM, 1, [&](int lane, int y, int) {{ {combine} }});
  return o;
}}
// rows [r0, r0 + n) of q (H, M, E) (or keys [r0, r0 + n) of a cache (HKV, M = capacity, E))
template <typename E_>
std::vector<E_> rows(const std::vector<E_>& q, int M, int r0, int n, int E) {{
  std::vector<E_> r;
  for (size_t h = 0; h < q.size() / (size_t(M) * E); ++h)
    r.insert(r.end(), q.begin() + (h * M + r0) * E, q.begin() + (h * M + r0 + n) * E);
  return r;
}}
int main(int argc, char** argv) {{
  const std::string d = argv[1];
  H = std::atoi(argv[2]); HKV = std::atoi(argv[3]); D = std::atoi(argv[5]); DV = std::atoi(argv[6]);
  const int M = std::atoi(argv[4]), L = std::atoi(argv[7]), cap = std::atoi(argv[8]), W = std::atoi(argv[9]);
  const int odd = {odd};
  auto q = load<T>(d + "/q", size_t(H) * M * D);
  auto k = load<KT>(d + "/k", size_t(HKV) * cap * D);
  auto v = load<KT>(d + "/v", size_t(HKV) * cap * DV);
  params[0] = load<float>(d + "/scale", 1)[0];
  params[4] = load<float>(d + "/softcap", 1)[0];
  sinks = load<float>(d + "/sinks", H);
  std::ofstream out(d + "/o", std::ios::binary);
  save(out, attend(q, M, k, v, L, cap, true));
  save(out, attend(q, M, k, v, L, cap, false));
  for (int i = 0; i < M; ++i) {{  // causal row i alone: an unmasked call over the keys it sees
    const int seen = L - M + i + 1;
    save(out, attend(rows(q, M, i, 1, D), 1, rows(k, cap, 0, seen, D), rows(v, cap, 0, seen, DV), seen, seen, false));
  }}
  for (int i = 0; i < M; ++i) save(out, attend(rows(q, M, i, 1, D), 1, k, v, L, cap, false));
  save(out, attend(rows(q, M, M - odd, odd, D), odd, k, v, L, cap, true));
  save(out, attend(q, M, k, v, L, cap, true, W));
  save(out, attend(q, M, k, v, L, cap, true, 0, true));  // the whole buffer launched, L keys counting
  for (int i = 0; i < M; ++i) {{  // windowed row i alone: an unmasked call over exactly its window
    const int seen = L - M + i + 1, lo = seen > W ? seen - W : 0;
    save(out, attend(rows(q, M, i, 1, D), 1, rows(k, cap, lo, seen - lo, D), rows(v, cap, lo, seen - lo, DV),
                     seen - lo, seen - lo, false));
  }}
  save(out, attend(q, M, k, v, L, cap, true, W, true));  // windowed over the whole buffer, L keys counting
  tree = load<int32_t>(d + "/tree", 1 + size_t(M) * {tree_row});  // the last M keys: a draft tree's nodes
  save(out, attend(q, M, k, v, L, cap, true));
  save(out, attend(q, M, k, v, L, cap, true, 0, true));  // over the whole buffer, L keys counting (a compiled pass)
  const std::vector<int32_t> rows_of = tree;
  tree = {{-1}};
  for (int i = 0; i < M; ++i) {{  // tree row i alone: an unmasked call over the cache, then its path's keys in order
    const int TS = rows_of[0], n = rows_of[1 + i * {tree_row}];
    std::vector<KT> kp = rows(k, cap, 0, TS, D), vp = rows(v, cap, 0, TS, DV), ks, vs;
    for (int h = 0; h < HKV; ++h) {{
      ks.insert(ks.end(), kp.begin() + size_t(h) * TS * D, kp.begin() + size_t(h + 1) * TS * D);
      vs.insert(vs.end(), vp.begin() + size_t(h) * TS * DV, vp.begin() + size_t(h + 1) * TS * DV);
      for (int j = 0; j < n; ++j) {{
        const size_t key = size_t(h) * cap + TS + rows_of[2 + i * {tree_row} + j];
        ks.insert(ks.end(), k.begin() + key * D, k.begin() + (key + 1) * D);
        vs.insert(vs.end(), v.begin() + key * DV, v.begin() + (key + 1) * DV);
      }}
    }}
    save(out, attend(rows(q, M, i, 1, D), 1, ks, vs, TS + n, TS + n, false));
  }}
  std::ofstream(d + "/walks") << direct_walks;
}}
"""
METAL_PARTIAL = """int qs[4] = {{1, H, M, D}}, ks[4] = {{1, HKV, S, D}}, vs[4] = {{1, HKV, S, DV}};
  int64_t qt[4] = {{int64_t(H) * M * D, M * D, D, 1}}, kt[4] = {{int64_t(HKV) * cap * D, cap * D, D, 1}},
      vt[4] = {{int64_t(HKV) * cap * DV, cap * DV, DV, 1}};
  const uint3 at{{unsigned(lane), unsigned(y * WARPS_ + w), unsigned(z)}};
  {p}<T, CH, {heads}, DPL_, {tree}, WARPS_, 1>(q.data(), qs, qt, k.data(), ks, kt, v.data(), vs, vt, params, length, tree.data(),
                                           {outs}, at);"""
METAL_COMBINE = """int as[3] = {{HM, NCH, DV}};
  {c}<T, {sinks}>(pmax.data(), psum.data(), pacc.data(), as, s.data(), o.data(), uint3{{unsigned(lane), unsigned(y), 0}});"""
CUDA_PARTIAL = """Shape qs{{1, H, M, D}}, ks{{1, HKV, S, D}}, vs{{1, HKV, S, DV}};
  Strides qt{{int64_t(H) * M * D, M * D, D, 1}}, kt{{int64_t(HKV) * cap * D, cap * D, D, 1}},
      vt{{int64_t(HKV) * cap * DV, cap * DV, DV, 1}};
  threadIdx = dim3{{unsigned(lane), unsigned(w), 0}}; blockIdx = dim3{{0, unsigned(y), unsigned(z)}};
  blockDim = dim3{{32, WARPS_, 1}};
  mlx::core::cu::{p}(q.data(), qs, qt, k.data(), ks, kt, v.data(), vs, vt, params, length, tree.data(), {outs});"""
CUDA_COMBINE = """Shape as{{HM, NCH, DV}};
  threadIdx = dim3{{unsigned(lane), 0, 0}}; blockIdx = dim3{{0, unsigned(y), 0}}; blockDim = dim3{{32, 1, 1}};
  mlx::core::cu::{c}(pmax.data(), psum.data(), pacc.data(), as, s.data(), o.data());"""


PARTIAL_OUTS = "pmax.data(), psum.data(), pacc.data()"
ONE_BY_ONE = "  const bool wide = false;\n"
PACKED_TOGGLES = [("VR::OK && v_dense", 'VR::OK && !std::getenv("EMU_UNPACKED") && v_dense'),
                  ("vw[jj].unpack(vv);", 'vw[jj].unpack(vv);\n          if (std::getenv("EMU_CORRUPT")) vv[0] += 1.0f;')]  # CUDA's keys read as Metal reads them


def harness(backend: str, dtype, kv_dtype, sinks: bool, heads: int = src.HEADS, dpl: int = 8, narrow: bool = False,
            warps: int = WARPS, toggles: bool = False, pack: int = 1) -> str:
    names, source = src.program(backend, dtype, CHUNK, sinks, kv_dtype, heads, dpl, warps, pack)
    if narrow:
        assert src.CUDA_WIDE in source
        source = source.replace(src.CUDA_WIDE, ONE_BY_ONE)
    if toggles:  # CUDA: values read one by one where EMU_UNPACKED is set; the packed loads' first value off by 1
        for a, b in PACKED_TOGGLES:  # where EMU_CORRUPT is (proof that they ran)
            assert a in source
            source = source.replace(a, b)
    partial, combine = (METAL_PARTIAL, METAL_COMBINE) if backend == "metal" else (CUDA_PARTIAL, CUDA_COMBINE)
    fmt = dict(p=names["partial"], c=names["combine"], sinks=int(sinks), tree=0, heads="HEADS_", outs=PARTIAL_OUTS)
    tree = dict(fmt, p=names["partial_tree"], tree=1, heads="TREE_HEADS_")
    if sinks:  # no direct build: launches with sinks always combine
        direct = direct_tree = None
    else:
        direct, direct_tree = dict(fmt, p=names["direct"], outs="o.data()"), dict(tree, p=names["direct_tree"], outs="o.data()")
    return HARNESS.format(source=source, T=C_TYPES[dtype], KT=C_TYPES[kv_dtype], chunk=CHUNK, odd=ODD, heads=heads, dpl=dpl, warps=warps,
                          tree_row=src.TREE_ROW, tree_heads=src.tree_heads(heads, dpl), partial=partial.format(**fmt), partial_tree=partial.format(**tree),
                          direct=partial.format(**direct) if direct else "std::abort();",
                          direct_tree=partial.format(**direct_tree) if direct_tree else "std::abort();", combine=combine.format(**fmt),
                          sinks=str(sinks).lower(), direct_chunks=src.DIRECT_CHUNKS)


def case_id(case) -> str:
    return "-".join(str(v) for v in case).replace("mlx.core.", "")


ONE_HEAD = [CASES[0], CASES[2]]  # G = 2 and 4 query heads per kv head: also built one head a warp, and with
                                  # the case's own dims per lane (the others: 8, any head dim up to 256)


def builds(case) -> list[tuple]:
    """Labels of the other builds a ONE_HEAD case runs: (..., heads, dims per lane[, narrow, warps]): one head a
    block, the case's own dims per lane, and for the first case one warp walking a chunk's steps in turn, for the
    second four warps (two with no step)."""
    warps = 1 if case == ONE_HEAD[0] else 4
    return [case[:4] + (1, 8), case[:4] + (src.HEADS, src.dims_per_lane(case[6], case[7])),
            case[:4] + (src.HEADS, 8, False, warps)]


NARROW = [c for c in CASES if c[0] == "cuda"][:2]  # float16 and float32 caches


def narrow(case) -> tuple:
    """The label of a CUDA case's build that reads every key one value at a time."""
    return case[:4] + (src.HEADS, 8, True)


# CUDA reads a lane's dims of a value row in one load where they are contiguous (v_pack): the production head dims
# (128 at fp16: 8 bytes, 32 rows a batch) and 256 in float32 (32 bytes, 8 rows a batch), with the wrapper's dims a lane
PACKED = [("cuda", mx.float16, mx.float16, False, 4, 2, 128, 128, 140, 100, 0.0),
          ("cuda", mx.float32, mx.float32, False, 2, 1, 256, 256, 70, 40, 0.0)]


def packed(case, pack: int = 1) -> tuple:
    """The label of a PACKED case's build: its own dims a lane, values packed or not (EMU_UNPACKED); pack 2: half the
    value rows in flight (the same bits)."""
    return case[:4] + (src.HEADS, src.dims_per_lane(case[6], case[7]), False, WARPS, True, pack)


@pytest.fixture(scope="module")
def exes() -> dict:
    labels = sorted({c[:4] for c in CASES}, key=str) + [label for c in ONE_HEAD for label in builds(c)]
    labels += [narrow(c) for c in NARROW] + [packed(c, pack) for c in PACKED for pack in (1, 2)]
    return dict(zip(labels, build_all([harness(*label) for label in labels])))


def inputs(tmp_path, case):
    """Write the case's q, cache, scale and sinks; return (q, k, v, scale, sinks) as the test reads them."""
    backend, dtype, kv_dtype, with_sinks, h, hkv, d, dv, length, window, softcap = case
    kq, kk, kv, ks = mx.random.split(mx.random.key(h * 7 + d), 4)
    q = (mx.random.normal((1, h, M, d), key=kq) * 2).astype(dtype)  # * 2: peaked softmax rows too
    cache_k = mx.random.normal((1, hkv, length + ROOM, d), key=kk).astype(kv_dtype)  # a cache with room for more
    cache_v = mx.random.normal((1, hkv, length + ROOM, dv), key=kv).astype(kv_dtype)
    sinks = mx.random.normal((h,), key=ks) * 2
    save(tmp_path, q=q, k=cache_k, v=cache_v, scale=mx.array([d**-0.5], mx.float32), sinks=sinks,
         softcap=mx.array([softcap], mx.float32), tree=tree_rows(TREE, length - M))
    return q, cache_k[:, :, :length], cache_v[:, :, :length], d**-0.5, sinks


@pytest.mark.parametrize("case", ONE_HEAD, ids=[case_id(c) for c in ONE_HEAD])
def test_heads_dims_and_warps_of_a_block_do_not_change_the_bits(tmp_path, exes, case):
    """A partial block serves up to HEADS query heads of one kv head (one read of each key and value
    for all of them), holds only the dims its head needs, and its warps take a chunk's 32-key steps
    at once: every output is bit-identical to a build with one head per block, to one with 8 dims per
    lane, and to one with one warp (the steps one after another) or four (more than the steps)."""
    backend, dtype, kv_dtype, with_sinks, h, hkv, d, dv, length, window, _ = case
    inputs(tmp_path, case)
    outs = []
    for label in [case[:4]] + builds(case):
        run(exes[label], tmp_path, h, hkv, M, d, dv, length, length + ROOM, window)
        outs.append((tmp_path / "o").read_bytes())
    assert all(out == outs[0] for out in outs[1:]) and len(outs) == 4


@pytest.mark.parametrize("case", NARROW, ids=[case_id(c) for c in NARROW])
def test_keys_read_in_16_byte_loads_or_one_by_one_give_the_same_bits(tmp_path, exes, case):
    """CUDA reads a key's dims in 16-byte loads where the cache allows (UBSan checks they are aligned) and
    one by one elsewhere: both give every output bit for bit, as does Metal's way (always one by one)."""
    backend, dtype, kv_dtype, with_sinks, h, hkv, d, dv, length, window, _ = case
    inputs(tmp_path, case)
    outs = []
    for label in (case[:4], narrow(case)):
        run(exes[label], tmp_path, h, hkv, M, d, dv, length, length + ROOM, window)
        outs.append((tmp_path / "o").read_bytes())
    assert outs[0] == outs[1]


@pytest.mark.parametrize("case", PACKED, ids=[case_id(c) for c in PACKED])
def test_values_read_a_row_at_a_time_give_the_same_bits(tmp_path, exes, case, monkeypatch):
    """Every output (causal, unmasked, rows alone, windows, trees, whole buffers) with a lane's value dims read in
    one load equals the build reading them one by one, bit for bit, with 64 or 32 registers of value rows in flight
    (PACK 1, 2); the packed loads really ran (corrupted, the outputs change), and the bits equal the
    8-dims-a-lane build's, whose values are never packed (DV < 256)."""
    backend, dtype, kv_dtype, with_sinks, h, hkv, d, dv, length, window, _ = case
    inputs(tmp_path, case)
    outs = {}
    for pack in (1, 2):
        for flag in ("", "EMU_UNPACKED", "EMU_CORRUPT"):
            with monkeypatch.context() as env:
                if flag:
                    env.setenv(flag, "1")
                run(exes[packed(case, pack)], tmp_path, h, hkv, M, d, dv, length, length + ROOM, window)
            outs[pack, flag] = (tmp_path / "o").read_bytes()
        assert outs[pack, ""] == outs[pack, "EMU_UNPACKED"], f"packed value loads changed the bits (PACK {pack})"
        assert outs[pack, ""] != outs[pack, "EMU_CORRUPT"], f"the packed value loads never ran (PACK {pack})"
    assert outs[1, ""] == outs[2, ""], "the value rows in flight changed the bits"
    outs[""] = outs[1, ""]
    if dv < 256:
        run(exes[case[:4]], tmp_path, h, hkv, M, d, dv, length, length + ROOM, window)
        assert (tmp_path / "o").read_bytes() == outs[""], "dims a lane changed the bits"


SPLITS = [CASES[0], CASES[2], PACKED[0]]  # Metal and CUDA, windows cut across chunks, CUDA's packed value loads


@pytest.mark.parametrize("case", SPLITS, ids=[case_id(c) for c in SPLITS])
def test_one_block_walking_the_chunks_gives_the_bits_of_partial_and_combine(tmp_path, exes, case, monkeypatch):
    """Launches over up to DIRECT_CHUNKS chunks run the direct build (one block walks them and combines them itself):
    every output (causal, unmasked, rows alone, windows, trees, whole buffers) equals, bit for bit, that of launches
    running partial + combine for more than one chunk (EMU_DIRECT_CHUNKS=1) or always (0), and the walks really ran."""
    backend, dtype, kv_dtype, with_sinks, h, hkv, d, dv, length, window, _ = case
    inputs(tmp_path, case)
    outs, walks = {}, {}
    for limit in ("", "1", "0"):
        with monkeypatch.context() as env:
            if limit:
                env.setenv("EMU_DIRECT_CHUNKS", limit)
            run(exes[packed(case) if case in PACKED else case[:4]], tmp_path, h, hkv, M, d, dv, length, length + ROOM, window)
        outs[limit], walks[limit] = (tmp_path / "o").read_bytes(), int((tmp_path / "walks").read_text())
    assert walks[""] > 0 and walks["1"] == walks["0"] == 0, walks
    assert outs[""] == outs["1"] == outs["0"], "the direct build's walk over several chunks changed the bits"


@pytest.mark.parametrize("case", CASES + PACKED, ids=[case_id(c) for c in CASES + PACKED])
def test_attention_source_matches_reference_and_is_row_invariant(tmp_path, exes, case):
    backend, dtype, kv_dtype, with_sinks, h, hkv, d, dv, length, window, softcap = case
    q, k, v, scale, sinks = inputs(tmp_path, case)
    run(exes[packed(case) if case in PACKED else case[:4]], tmp_path, h, hkv, M, d, dv, length, length + ROOM, window)
    raw = (tmp_path / "o").read_bytes()
    size = len(raw) // (11 * M + ODD)  # bytes of one row (H, DV)

    def part(first: int, count: int, per_row: bool) -> mx.array:  # (1, H, count, DV)
        a = from_np(raw[first * size : (first + count) * size], dtype, (count, h, dv) if per_row else (h, count, dv))
        return (a.transpose(1, 0, 2) if per_row else a)[None]

    causal, full = part(0, M, False), part(M, M, False)
    causal_rows, full_rows, odd = part(2 * M, M, True), part(3 * M, M, True), part(4 * M, ODD, False)
    windowed, buffered = part(4 * M + ODD, M, False), part(5 * M + ODD, M, False)
    windowed_rows, windowed_buffered = part(6 * M + ODD, M, True), part(7 * M + ODD, M, False)
    tree, tree_buffered, tree_rows_alone = part(8 * M + ODD, M, False), part(9 * M + ODD, M, False), part(10 * M + ODD, M, True)
    used = sinks if with_sinks else None
    for y, is_causal, w in ((causal, True, 0), (full, False, 0), (windowed, True, window)):
        ok, ratio = attention_within_tolerance(y, q, k, v, scale, is_causal, w, used, softcap)
        assert ok, f"{case_id(case)} causal={is_causal} window={w}: error {ratio:.3g}x the tolerance"
    assert mx.array_equal(causal, causal_rows).item(), "causal rows differ from 1-row calls over their keys"
    assert mx.array_equal(full, full_rows).item(), "unmasked rows differ from 1-row calls"
    assert mx.array_equal(odd, causal[:, :, M - ODD :]).item(), f"a {ODD}-row causal call differs"
    assert mx.array_equal(windowed, windowed_rows).item(), "windowed rows differ from 1-row calls over their windows"
    assert mx.array_equal(buffered, causal).item(), "a launch over the whole buffer with L keys counting differs"
    assert mx.array_equal(windowed_buffered, windowed).item(), "a windowed launch over the whole buffer differs"
    assert mx.array_equal(tree, tree_rows_alone).item(), "tree rows differ from 1-row calls over their paths' keys"
    assert mx.array_equal(tree_buffered, tree).item(), "a tree pass over the whole buffer with L keys counting differs"
    for i in range(M):  # and each is that attention: the cache, then its path's keys
        path, node = [], i
        while node >= 0:
            path, node = [node] + path, TREE[node]
        seen = mx.array(list(range(length - M)) + [length - M + j for j in path])
        ok, ratio = attention_within_tolerance(tree[:, :, i : i + 1], q[:, :, i : i + 1], k[:, :, seen], v[:, :, seen],
                                               scale, False, 0, used, softcap)
        assert ok, f"{case_id(case)} tree row {i}: error {ratio:.3g}x the tolerance"
    assert not mx.array_equal(tree, causal).item()  # the tree really masks otherwise than causal
    if with_sinks:  # the sinks are really used: without them the answer is another one
        ok, _ = attention_within_tolerance(causal, q, k, v, scale, True, softcap=softcap)
        assert not ok, "a launch with sinks gave the answer without them"
    if softcap:  # the cap is really applied
        ok, _ = attention_within_tolerance(causal, q, k, v, scale, True, sinks=used)
        assert not ok, "a launch with a softcap gave the uncapped answer"


def test_bodies_name_only_builtins_their_backend_has():
    for (backend, _), body in src.BODIES.items():
        assert ("thread_position_in_grid" in body) == (backend == "metal")
        assert ("threadIdx" in body) == (backend == "cuda")
