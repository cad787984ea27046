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

from attention_harness import (CUDA_COMBINE, CUDA_PARTIAL, HARNESS, METAL_COMBINE, METAL_PARTIAL, M, ODD, PARTIAL_OUTS,
                               ROOM, check_attention, inputs)
from emulator_harness import C_TYPES, CXX, build_all, run
from mlxspec.kernels import gpu_attention_source as src

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

CHUNK = 64
WARPS = CHUNK // 32  # a block's warps: one 32-key step each, as in production (other builds: 1 and 4)
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
    check_attention(tmp_path, exes[packed(case) if case in PACKED else case[:4]], case)


def test_bodies_name_only_builtins_their_backend_has():
    for (backend, _), body in src.BODIES.items():
        assert ("thread_position_in_grid" in body) == (backend == "metal")
        assert ("threadIdx" in body) == (backend == "cuda")
