"""The GPU kernels' Python wrappers (kernels/gpu.py) on this CPU, with mx.fast.cuda_kernel replaced by
a stand-in that records each launch and computes it with the reference: rows flattened for the kernel,
the output given x's leading shape directly (one launch) or concatenated (several), launch plans
cached per shape, the tensor-core wrapper's fallback, the gather's grouped path."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxspec.kernels import gpu
from mlxspec.kernels.gpu_source import row_capacity
from mlxspec.kernels.reference import qmm_reference


class StandIn:
    """A cuda_kernel stand-in: records (name, x shape, template, output shape, grid); y = the reference."""

    def __init__(self, launches: list, name: str, **_):
        self.launches, self.name = launches, name

    def __call__(self, inputs, template, output_shapes, output_dtypes, grid, threadgroup, **_):
        x, w, s, b, *rest = inputs
        self.launches.append((self.name, x.shape, dict(template), tuple(output_shapes[0]), grid))
        if rest:  # a gather: row p on expert indices[p]
            idx = rest[0].tolist()
            y = mx.concatenate([qmm_reference(x[p : p + 1], w[e], s[e], b[e], dict(template)["G"], dict(template)["BITS"])
                                for p, e in enumerate(idx)])
        else:
            mode = "mxfp4" if dict(template).get("MODE") == 1 else "affine"
            y = qmm_reference(x, w, s, b, dict(template)["G"], dict(template)["BITS"], mode)
        return [y.astype(output_dtypes[0]).reshape(output_shapes[0])]


def stand_in_launches(monkeypatch, backend: str) -> list:
    """mx.fast.{backend}_kernel replaced by StandIn (its launches recorded in the list returned)."""
    calls = []
    monkeypatch.setattr(gpu, f"require_{backend}", lambda: None)
    monkeypatch.setattr(mx.fast, f"{backend}_kernel", lambda **kw: StandIn(calls, kw["name"]))
    return calls


@pytest.fixture
def launches(monkeypatch):
    return stand_in_launches(monkeypatch, "cuda")


def weights(n=40, k=128, e=None):
    shape = (n, k) if e is None else (e, n, k)
    return mx.quantize(mx.random.normal(shape, key=mx.random.key(1)).astype(mx.float16), group_size=64, bits=4)


@pytest.mark.parametrize("lead", [(1, 1), (3,), (2, 9), (40,)])
def test_qmm_wrappers_keep_x_leading_shape(launches, lead):
    w, s, b = weights()
    x = mx.random.normal((*lead, 128), key=mx.random.key(2)).astype(mx.float16)
    want = qmm_reference(x, w, s, b, 64, 4)
    for fn in (gpu.cuda_qmm_function(), gpu.cuda_mma_qmm_function(None)):
        launches.clear()
        y = fn(x, w, s, b, 64, 4)
        assert y.shape == (*lead, 40) and mx.array_equal(y, want).item()
        m = x.size // 128
        assert all(len(shape) == 2 for _, shape, *_ in launches)  # the kernels read x as (rows, K)
        if launches[0][0] == gpu.NAME:  # the FMA kernel: 16 rows a launch, each at its row capacity
            assert [shape[0] for _, shape, *_ in launches] == [min(16, m - r) for r in range(0, m, 16)]
            assert all(t["ROWS"] == row_capacity(shape[0]) for _, shape, t, *_ in launches)
        else:  # tensor cores: one launch, any row count
            assert len(launches) == 1 and launches[0][3] == (*lead, 40)


def test_tensor_core_wrapper_sends_what_it_cannot_run_to_its_fallback(launches):
    w, s, b = weights()
    x = mx.random.normal((2, 128), key=mx.random.key(3))  # float32 x: no mma
    y = gpu.cuda_mma_qmm_function(gpu.cuda_qmm_function())(x, w, s, b, 64, 4)
    assert [name for name, *_ in launches] == [gpu.NAME] and y.shape == (2, 40)
    with pytest.raises(ValueError, match="unsupported"):
        gpu.cuda_mma_qmm_function(None)(x, w, s, b, 64, 4)


def test_tensor_core_launches_take_a_second_column_tile_from_nine_rows(launches):
    """x's loads serve twice the columns where a pass has many rows (the bits do not depend on it)."""
    from mlxspec.kernels import gpu_mma_source as mma

    w, s, b = weights()
    qmm = gpu.cuda_mma_qmm_function(None)
    for m in (1, 8, 9, 16):
        qmm(mx.zeros((m, 128), mx.float16), w, s, b, 64, 4)
    assert [t["TILES"] for _, _, t, *_ in launches] == [1, 1, 2, 2] == [mma.tiles_for(m) for m in (1, 8, 9, 16)]
    launches.clear()
    gpu.cuda_mma_qmm_function(None, tiles=2)(mx.zeros((1, 128), mx.float16), w, s, b, 64, 4)
    assert launches[0][2]["TILES"] == 2  # a build asked for by name (bench_gpu's variants)


def test_plans_are_built_once_per_shape(launches):
    w, s, b = weights()
    qmm = gpu.cuda_mma_qmm_function(None)
    gpu._mma_plan.cache_clear()
    for _ in range(5):
        qmm(mx.zeros((1, 1, 128), mx.float16), w, s, b, 64, 4)
    info = gpu._mma_plan.cache_info()
    assert info.misses == 1 and info.hits == 4


def test_gather_groups_rows_by_expert_only_when_asked(launches):
    w, s, b = weights(e=3)
    ids = mx.array([2, 0, 2, 1], mx.uint32)
    x = mx.random.normal((4, 128), key=mx.random.key(4)).astype(mx.float16)
    gather = gpu.cuda_gather_qmm_function()
    plain = gather(x, w, s, b, ids, 64, 4)
    grouped = gather(x, w, s, b, ids, 64, 4, per_expert=2)
    assert gather.groups_experts and mx.array_equal(plain, grouped).item()
    (name1, _, t1, _, grid1), (name2, _, t2, _, grid2) = launches
    assert (name1, t1["ROWS"], grid1[2]) == (gpu.GATHER_NAME, 1, 4)  # one row per z
    assert (name2, t2["ROWS"], grid2[2]) == (gpu.GROUPED_NAME, 2, 3)  # one expert per z


def test_attention_wrapper_passes_a_compiled_steps_length_as_a_one_number_int32_array():
    """MLX's Metal signature takes a 0-d input by reference, which the kernel's `length[0]` cannot
    read: the keys that count reach both attention launches' inputs as (1,) int32, from a () or (1,)
    array of the compiled step's graph, and a call without a length counts every key of its buffer
    (the kernel reads min(length, keys))."""
    from mlxspec.kernels import gpu_attention

    seen = []

    def make(name, input_names, **_):
        def launch(inputs, output_shapes, output_dtypes, **__):
            seen.append((name, dict(zip(input_names, inputs))))
            return [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes)]
        return launch

    sdpa = gpu_attention._sdpa_function(make, "cuda")
    q, k = mx.zeros((1, 4, 2, 64)), mx.zeros((1, 2, 512, 64))
    for length, want in ((mx.array(300, mx.int32), 300), (mx.array([300]), 300), (None, 512)):
        seen.clear()
        sdpa(q, k, k, 0.125, True, length=length)
        for name, inputs in seen:
            assert all(a.ndim >= 1 for a in inputs.values()), name
        partial = seen[0][1]
        assert partial["length"].shape == (1,) and partial["length"].dtype == mx.int32
        assert min(partial["length"].item(), k.shape[2]) == want


def test_attention_wrapper_makes_no_new_arrays_per_call():
    """A layer's constants (scale, mask kind, window, softcap) and the length of a call over its whole
    buffer are arrays made once: a new array starts in host memory that the GPU must then read."""
    from mlxspec.kernels import gpu_attention

    seen = []

    def make(name, input_names, **_):
        def launch(inputs, output_shapes, output_dtypes, **__):
            seen.append(dict(zip(input_names, inputs)))
            return [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes)]
        return launch

    sdpa = gpu_attention._sdpa_function(make, "cuda")
    q = mx.zeros((1, 4, 1, 64))
    for keys in (300, 301, 300):
        sdpa(q, mx.zeros((1, 2, keys, 64)), mx.zeros((1, 2, keys, 64)), 0.125, True)
    sdpa(q, mx.zeros((1, 2, 300, 64)), mx.zeros((1, 2, 300, 64)), 0.25, True)
    partials = [s for s in seen if "params" in s]
    assert len({id(s["params"]) for s in partials[:3]}) == 1 and len({id(s["length"]) for s in partials}) == 1
    assert partials[3]["params"] is not partials[0]["params"]  # another scale: its own constants
    assert partials[3]["params"].tolist()[0] == 0.25 and partials[0]["params"].tolist()[:2] == [0.125, 1.0]


def test_attention_launches_pick_their_warps_by_the_grid_and_one_block_walks_few_chunks():
    """Each launch's warps a block (the same bits whatever they are): 8 where its (block, chunk) pairs are few (a
    one-row step over 300 keys: 32 heads x 2 chunks), 1 where they are many (8 rows: 512 pairs; 8,192 keys: 256), a
    fixed count where the function was built with one; up to DIRECT_CHUNKS chunks one direct launch (grid z 1)."""
    from mlxspec.kernels import gpu_attention

    seen = []

    def make(name, input_names, **_):
        def launch(inputs, template, grid, threadgroup, output_shapes, output_dtypes, **__):
            seen.append((name, dict(template).get("WARPS"), grid, threadgroup))  # the combine has none
            return [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes)]
        return launch

    def first_launch(sdpa, m: int, keys: int) -> tuple:
        seen.clear()
        sdpa(mx.zeros((1, 32, m, 128)), mx.zeros((1, 8, keys, 128)), mx.zeros((1, 8, keys, 128)), 0.1, True)
        return seen[0]

    adaptive, fixed = gpu_attention._sdpa_function(make, "cuda"), gpu_attention._sdpa_function(make, "cuda", 4)
    direct, partial = "mlxspec_sdpa_direct", "mlxspec_sdpa_partial"
    assert first_launch(adaptive, 1, 300) == (direct, 8, (32, 8 * 32, 1), (32, 8, 1))  # 32 blocks, 2 chunks walked
    assert first_launch(adaptive, 8, 300) == (direct, 1, (32, 256, 1), (32, 1, 1))
    assert first_launch(adaptive, 1, 8192) == (partial, 1, (32, 8, 32), (32, 1, 1))  # 8 blocks of 4 heads, 32 chunks
    assert first_launch(adaptive, 1, 1100) == (partial, 8, (32, 8 * 32, 5), (32, 8, 1))  # 160 pairs
    assert first_launch(fixed, 8, 8192)[1:] == (4, (32, 4 * 64, 32), (32, 4, 1))


def test_tensor_core_attention_launches_a_warp_per_16_slots_and_refuses_what_it_cannot_compute(monkeypatch):
    """The tensor-core family: one warp per 16 (query head, row) slots of a kv head and chunk (128 keys); one chunk
    is one direct launch, more a partial + combine; a tree's pass serves one row a tile (TREE = 1); float32 queries
    and head dims past 128 are refused (ValueError: such a layer keeps the FMA family for every launch)."""
    from mlxspec.kernels import gpu_attention, tree_mask

    seen = []

    def make(name, input_names, **_):
        def launch(inputs, template, grid, threadgroup, output_shapes, output_dtypes, **__):
            seen.append((name, dict(template).get("TREE"), grid, threadgroup))
            return [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes)]
        return launch

    sdpa = gpu_attention.cuda_sdpa_mma_function(make=make)

    def launches(m: int, keys: int, dtype=mx.float16, d: int = 128, **kw) -> list:
        seen.clear()
        q, kv = mx.zeros((1, 32, m, d), dtype), mx.zeros((1, 8, keys, d), dtype)
        out = sdpa(q, kv, kv, 0.1, True, **kw)
        assert out.shape == (1, 32, m, d) and out.dtype == dtype
        return seen[:]

    direct, partial, combine = "mlxspec_sdpa_mma_direct", "mlxspec_sdpa_mma_partial", "mlxspec_sdpa_combine"
    assert launches(1, 100) == [(direct, 0, (32, 8, 1), (32, 1, 1))]  # 8 kv heads x 4 slots: 8 warps
    assert launches(1, 300)[0] == (partial, 0, (32, 8, 3), (32, 1, 1)) and launches(1, 300)[1][0] == combine
    assert launches(16, 8192)[0] == (partial, 0, (32, 32, 64), (32, 1, 1))  # 64 slots a kv head: 4 tiles
    tree = tree_mask.tree_rows((-1, 0, 0, 1), 96)
    assert launches(4, 100, tree=tree) == [(direct, 1, (32, 32, 1), (32, 1, 1))]  # one row a tile
    for bad in ({"dtype": mx.float32}, {"d": 256}):
        with pytest.raises(ValueError):
            launches(1, 100, **bad)
    other = sdpa.with_chunk(64)  # another chunk: a build of its own, made once (the timing's candidates)
    assert other.chunk == 64 and sdpa.with_chunk(64) is other and sdpa.with_chunk(128) is sdpa
    seen.clear()
    other(mx.zeros((1, 32, 1, 128), mx.float16), *[mx.zeros((1, 8, 100, 128), mx.float16)] * 2, 0.1, True)
    assert seen[0][0] == partial and seen[0][2] == (32, 8, 2)  # 100 keys: two 64-key chunks


def test_simdgroup_attention_launches_a_simdgroup_per_8_slots_and_takes_float32(monkeypatch):
    """Metal's twin: 8 slots a simdgroup; float32 queries (over a float16 cache too) and head dims to 256 taken, head
    dims off the 8-dim tiles refused."""
    from mlxspec.kernels import gpu_attention

    seen = []

    def make(name, input_names, **_):
        def launch(inputs, template, grid, threadgroup, output_shapes, output_dtypes, **__):
            seen.append((name, grid))
            return [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes)]
        return launch

    monkeypatch.setattr(gpu_attention, "require_metal", lambda: None)
    monkeypatch.setattr(mx.fast, "metal_kernel", lambda **kw: make(**kw))
    sdpa = gpu_attention.metal_sdpa_simdgroup_function()
    q, kv = mx.zeros((1, 32, 4, 256), mx.float32), mx.zeros((1, 8, 100, 256), mx.float16)
    assert sdpa(q, kv, kv, 0.1, True).shape == (1, 32, 4, 256) and sdpa.mixed
    assert seen == [("mlxspec_sdpa_simdgroup_direct", (32, 16, 1))]  # 8 kv heads x 16 slots: 2 simdgroups each
    with pytest.raises(ValueError):
        sdpa(mx.zeros((1, 32, 1, 100)), mx.zeros((1, 8, 100, 100)), mx.zeros((1, 8, 100, 100)), 0.1, True)


def test_other_k_splits_are_builds_of_their_own_and_prepare_only_the_rows_asked(launches, monkeypatch):
    """with_ksplit: the tensor-core qmm with another number of warps on K (its own template, one function
    per split); prepare(rows=...) compiles just those launches (the timing of a split: 1 and 8 rows)."""
    built = []
    monkeypatch.setattr(StandIn, "prebuild", lambda self, todo: built.extend((self.name, dict(t[3])) for t in todo),
                        raising=False)
    qmm = gpu.cuda_mma_qmm_function(None)
    k2 = qmm.with_ksplit(2)
    assert (qmm.ksplit, k2.ksplit) == (4, 2) and qmm.with_ksplit(2) is k2 and qmm.with_ksplit(4) is qmm
    w, s, b = weights()
    k2(mx.zeros((3, 128), mx.float16), w, s, b, 64, 4)
    assert launches[-1][2]["KSPLIT"] == 2
    k2.prepare([mx.float16], mx.float16, 64, 4, rows=(1, 8))
    assert [(name, t["KSPLIT"], t["RT"]) for name, t in built] == [(gpu.mma.NAME, 2, 1), (gpu.mma.NAME, 2, 1)]
    built.clear()
    qmm.prepare([mx.float16], mx.float16, 64, 4)
    assert len(built) == gpu.MAX_ROWS + 1  # 1 to 16 rows and the 72-row self-check's


@pytest.fixture
def metal_launches(monkeypatch):
    return stand_in_launches(monkeypatch, "metal")


def test_simdgroup_wrapper_runs_any_rows_in_one_launch_and_falls_back_where_it_must(metal_launches):
    """Metal's simdgroup-matrix qmm: one launch of the simdgroup kernel for 1 to 40 rows (its grid from
    gpu_simdgroup_source.launch), float32 x too; mxfp4 layers go to the FMA kernel (its fallback)."""
    from mlxspec.kernels import gpu_simdgroup_source as sg

    w, s, b = weights()
    qmm = gpu.metal_mma_qmm_function(gpu.metal_qmm_function())
    for m, dtype in ((1, mx.float16), (8, mx.float16), (9, mx.float32), (40, mx.float16)):
        metal_launches.clear()
        x = mx.random.normal((m, 128), key=mx.random.key(m)).astype(dtype)
        y = qmm(x, w, s, b, 64, 4)
        assert len(metal_launches) == 1 and mx.array_equal(y, qmm_reference(x, w, s, b, 64, 4).astype(y.dtype)).item()
        name, shape, targs, out, grid = metal_launches[0]
        assert name == sg.NAME and shape == (m, 128) and out == (m, 40)
        assert grid == sg.launch(m, 40)["grid"] and targs["RT"] == sg.row_tiles(m) and targs["KSPLIT"] == sg.KSPLIT
    metal_launches.clear()
    wf, sf = mx.quantize(mx.random.normal((40, 128), key=mx.random.key(1)), group_size=32, bits=4, mode="mxfp4")[:2]
    qmm(mx.zeros((2, 128), mx.bfloat16), wf, sf, None, 32, 4, mode="mxfp4")
    assert [name for name, *_ in metal_launches] == [gpu.NAME]
    assert qmm.with_ksplit(2).ksplit == 2 and qmm.with_ksplit(2) is qmm.with_ksplit(2)


class Recorded:
    """A kernel stand-in recording (name, ensure_row_contiguous) per launch; stored: a maker's cached kernel's mark."""

    def __init__(self, seen: list, name: str, ensure_row_contiguous: bool, stored: bool):
        self.seen, self.name, self.contiguous, self.stored = seen, name, ensure_row_contiguous, stored

    def __call__(self, inputs, output_shapes, output_dtypes, **_):
        self.seen.append((self.name, self.contiguous))
        return [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes)]


def recording_maker(seen: list, stored: bool):
    return lambda name, ensure_row_contiguous=True, **_: Recorded(seen, name, ensure_row_contiguous, stored)


@pytest.mark.parametrize("family", ["fma", "tensor cores"])
def test_cuda_attention_over_cache_buffers_launches_row_contiguous_twins_where_they_are_stored(monkeypatch, family):
    """A compiled step's call (whole buffers, a `length`) launches row-contiguous twins of the stride-reading kernels
    where the maker stores them once per machine (cuda_cache's path); calls over views keep the in-place builds
    (no copy of the cache). Without stored kernels (MLX's JIT, Metal) or once a self-check turned them off, every
    call takes the in-place builds."""
    from mlxspec.kernels import gpu_attention

    seen = []

    def built(stored: bool, backend: str = "cuda"):
        make = recording_maker(seen, stored)
        if family == "fma":
            return gpu_attention._sdpa_function(make, backend)
        return gpu_attention.cuda_sdpa_mma_function(make=make)

    def kinds(sdpa, keys: int, length=None) -> list:
        seen.clear()
        q, kv = mx.zeros((1, 4, 2, 64), mx.float16), mx.zeros((1, 2, keys, 64), mx.float16)
        sdpa(q, kv, kv, 0.125, True, **({"length": mx.array([length])} if length else {}))
        return seen[:]

    sdpa = built(stored=True)
    assert sdpa.stored_buffers
    for keys in (100, 3000):  # a direct launch, a partial + combine
        over_view, over_buffer = kinds(sdpa, keys), kinds(sdpa, keys, length=keys)
        assert [c for _, c in over_view] == [False] + [True] * (len(over_view) - 1)  # the combine: contiguous anyway
        assert [n for n, _ in over_buffer] == [n for n, _ in over_view] and all(c for _, c in over_buffer)
    sdpa.stored_buffers = False
    assert not kinds(sdpa, 612, length=100)[0][1]
    assert not built(stored=False).stored_buffers and not kinds(built(stored=False), 612, length=100)[0][1]
    if family == "fma":
        assert not built(stored=True, backend="metal").stored_buffers


def test_a_self_check_keeps_in_place_builds_where_the_stored_twins_differ_before_any_layer_launched():
    """attention.self_check compares a call over a whole buffer (the twins) with the call over its keys (in place): at
    the function's first check a difference turns the twins off, with a warning, and the check passes on the in-place
    builds; after a check has passed (layers may have launched the twins) a difference fails the signature."""
    from mlxspec.kernels import attention
    from mlxspec.kernels.cpu import cpu_sdpa_function

    base = cpu_sdpa_function()

    def twin_off_by_a_bit():
        def sdpa(q, k, v, scale, causal, length=None, **kw):
            y = base(q, k, v, scale, causal, **({"length": length} if length is not None else {}), **kw)
            return y * 1.001 if length is not None and sdpa.stored_buffers else y
        sdpa.lengths, sdpa.stored_buffers = True, True
        return sdpa

    sdpa = twin_off_by_a_bit()
    assert attention.self_check(sdpa, 4, 2, 64, 64, mx.float32) is None
    assert not sdpa.stored_buffers and sdpa.buffers_settled
    settled = twin_off_by_a_bit()
    settled.buffers_settled = True  # an earlier signature's check passed
    assert "longer buffer" in attention.self_check(settled, 4, 2, 64, 64, mx.float32)
    assert settled.stored_buffers  # not flipped once layers may have run it
