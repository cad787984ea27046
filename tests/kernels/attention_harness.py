"""The few-row attention kernels' emulator harness, shared by the FMA family's tests and the tensor cores'.

HARNESS runs a build's launches as gpu_attention.py makes them (partial + combine, or the direct build over at
most `direct_chunks` chunks), then: causal, unmasked, each causal row alone over its keys, each row alone
unmasked, an ODD-row causal launch, windowed, the whole buffer with L keys counting, windowed rows alone over
their windows, windowed over the buffer, a draft tree's pass (over L keys and the buffer) and its rows alone over
their paths. `check_attention` reads them back and holds them to the reference and to row invariance.
"""

from __future__ import annotations

import mlx.core as mx

from emulator_harness import case_id, from_np, run, save
from mlxspec.kernels.attention import attention_within_tolerance
from mlxspec.kernels.tree_mask import tree_rows

M, ODD = 16, 7
TREE = (-1, 0, 0, 1, 1, 2, 3, 3, 5, 6, 4, 8, 9, 7, 12, 10)  # M nodes, each row's parent row: depths up to 6
ROOM = 70  # cache positions past the L keys: a launch over the whole buffer spans one more chunk

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


def check_attention(tmp_path, exe, case) -> None:
    """Run a harness build on `case` (backend, q dtype, kv dtype, sinks, H, HKV, D, DV, L, window, softcap): each
    launch within attention_within_tolerance of the reference, and every row invariance the harness saves."""
    backend, dtype, kv_dtype, with_sinks, h, hkv, d, dv, length, window, softcap = case
    q, k, v, scale, sinks = inputs(tmp_path, case)
    run(exe, tmp_path, h, hkv, M, d, dv, length, length + ROOM, window)
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
