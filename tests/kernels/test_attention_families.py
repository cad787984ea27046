"""Which attention family serves a layer on CUDA: the FMA kernels or the tensor cores (attention._serving).

Both families are stood in by the CPU kernel (row-invariant, so both pass their self-checks), tagged, with
time_call faked from tables: the tensor-core family serves a signature where it passed its self-check and
timing.prefer_tensor_core_attention prefers it, for every launch of that signature, decided once per process.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from gpu_stand_ins import serve
from mlxspec.kernels import attention, gpu_attention_mma_source, gpu_attention_simdgroup_source, registry, timing
from mlxspec.kernels.cpu import cpu_sdpa_function

FMA_US = {(1, 1024): 20.0, (8, 1024): 40.0, (1, 8192): 60.0, (16, 8192): 300.0}  # (rows, keys) -> microseconds
MLX_US = 30.0


SUPPORTS = {"cuda": gpu_attention_mma_source.supports, "metal": gpu_attention_simdgroup_source.supports}


def tagged(calls: list, tag: str, base, wrong_rows: bool = False, backend: str = "cuda", chunk: int = 128):
    """The CPU kernel recording (tag, rows, keys) per call (a matrix build's tag: mma-c<chunk>); wrong_rows: multi-row
    calls off by a little."""
    name = tag if tag == "fma" else f"mma-c{chunk}"

    def sdpa(q, k, v, scale, causal, **kw):
        calls.append((name, q.shape[2], k.shape[2]))
        y = base(q, k, v, scale, causal, **kw)
        return y * 1.001 if wrong_rows and q.shape[2] > 1 else y

    for attr in ("windows", "sinks", "lengths", "softcaps"):
        setattr(sdpa, attr, getattr(base, attr, False))
    sdpa.mixed = tag == "fma"
    sdpa.supports = SUPPORTS[backend]  # the matrix family's signatures (its stand-in's)
    sdpa.chunk, sdpa.tag = chunk, name
    sdpa.with_chunk = lambda c: tagged(calls, tag, base, wrong_rows, backend, c)
    return sdpa


def stand_in(monkeypatch, tmp_path, mma_us: dict, wrong_rows: bool = False, backend: str = "cuda",
             other_chunks: dict | None = None) -> list:
    """mma_us: the default build's microseconds; other_chunks: chunk -> the others' (default: twice FMA's)."""
    base, calls = cpu_sdpa_function(), []
    serve(monkeypatch, {"sdpa": lambda: tagged(calls, "fma", base),
                        "sdpa-mma": (lambda: tagged(calls, "mma", base, wrong_rows, backend), "stand-in mma")})
    monkeypatch.setattr(registry, "device_backend_name", lambda device=None: backend)
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path))
    us = {"fma": FMA_US, "mma-c128": mma_us} | {f"mma-c{c}": {key: 2 * t for key, t in FMA_US.items()}
                                               for c in timing.OTHER_CHUNKS}
    us |= {f"mma-c{c}": table for c, table in (other_chunks or {}).items()}

    def fake_time(fn, **kw):
        before = len(calls)
        fn()
        if len(calls) == before:
            return MLX_US  # MLX's own op
        tag, rows, keys = calls[-1]
        return us[tag][rows, keys]

    monkeypatch.setattr(timing, "time_call", fake_time)
    registry.reset()
    return calls


def attend(rows: int, dtype=mx.float16):
    q = mx.random.normal((1, 4, rows, 64), key=mx.random.key(rows)).astype(dtype)
    kv = mx.random.normal((1, 2, 50, 64), key=mx.random.key(9)).astype(dtype)
    return attention.few_row_attention(q, kv, kv, None, 0.125, "causal")


@pytest.mark.parametrize("mma_us, want", [
    ({(1, 1024): 18.0, (8, 1024): 19.0, (1, 8192): 40.0, (16, 8192): 45.0}, "mma"),  # cheaper everywhere
    ({(1, 1024): 25.0, (8, 1024): 26.0, (1, 8192): 60.0, (16, 8192): 70.0}, "mma"),  # a step 1.25x FMA's, within
    # 10% of MLX's own (30 us): plain decoding keeps exact mode's budget, and the verify passes are far cheaper
    ({(1, 1024): 34.0, (8, 1024): 20.0, (1, 8192): 40.0, (16, 8192): 45.0}, "fma"),  # a step past the budget
    ({(1, 1024): 20.0, (8, 1024): 40.0, (1, 8192): 60.0, (16, 8192): 301.0}, "fma"),  # no cheaper in total
])
@pytest.mark.parametrize("backend", ["cuda", "metal"])  # tensor cores; simdgroup matrices
def test_gpu_layers_take_the_matrix_unit_attention_where_it_times_faster(cpu_ext, monkeypatch, tmp_path, mma_us, want,
                                                                         backend):
    calls = stand_in(monkeypatch, tmp_path, mma_us, backend=backend)
    attend(1)
    calls.clear()
    for rows in (1, 4, 1):  # a step, a verify pass, a step: one family for all
        attend(rows)
    want = "mma-c128" if want == "mma" else want
    assert calls == [(want, 1, 50), (want, 4, 50), (want, 1, 50)]
    assert attention.serving_function(4, 2, 64, 64, mx.float16).tag == want  # what tree_passes_ready asks of trees
    status = {st["kernel"]: st for st in registry.status()}
    assert list(status[f"{backend}-sdpa-mma"]["chosen"].values()) == [128 if want == "mma-c128" else 0]
    assert "4x2 d64/64 float16 M=16 L=8192" in status[f"{backend}-sdpa-mma"]["timings"]
    assert "4x2 d64/64 float16 M=16 L=8192" in status[f"{backend}-sdpa"]["timings"]
    assert "4x2 d64/64 float16 M=16 L=8192 c64" in status[f"{backend}-sdpa-mma"]["timings"]  # the other chunks too
    registry.reset()  # a new process: the timings come from disk, not new timings
    monkeypatch.setattr(timing, "time_call", lambda fn, **kw: (_ for _ in ()).throw(AssertionError("re-timed")))
    calls.clear()
    attend(2)
    assert calls[-1] == (want, 2, 50)
    registry.reset()


def test_a_tensor_core_kernel_failing_its_self_check_leaves_the_layer_to_the_fma_family(cpu_ext, monkeypatch, tmp_path):
    calls = stand_in(monkeypatch, tmp_path, dict.fromkeys(FMA_US, 1.0), wrong_rows=True)
    attend(1)
    calls.clear()
    attend(3)
    assert calls == [("fma", 3, 50)]
    status = {st["kernel"]: st for st in registry.status()}["cuda-sdpa-mma"]
    assert status["failed"] and list(status["chosen"].values()) == [0] and not status["timings"]
    registry.reset()


def test_the_cheapest_chunk_serves_and_passes_its_own_self_check_first(cpu_ext, monkeypatch, tmp_path):
    """Of the matrix builds that beat FMA, the cheapest in total serves (here 64 keys a warp); it is self-checked
    before its first launch, and every launch of the signature meets it."""
    fast = {(1, 1024): 10.0, (8, 1024): 11.0, (1, 8192): 30.0, (16, 8192): 40.0}
    calls = stand_in(monkeypatch, tmp_path, FMA_US | {(16, 8192): 100.0}, other_chunks={64: fast})
    attend(1)
    calls.clear()
    attend(4)
    assert calls == [("mma-c64", 4, 50)]
    status = {st["kernel"]: st for st in registry.status()}["cuda-sdpa-mma"]
    assert list(status["chosen"].values()) == [64] and any(sig.endswith("'c64')") for sig in status["passed"])
    registry.reset()


def test_signatures_the_tensor_cores_do_not_compute_stay_with_the_fma_family(cpu_ext, monkeypatch, tmp_path):
    calls = stand_in(monkeypatch, tmp_path, dict.fromkeys(FMA_US, 1.0))
    attend(2, mx.float32)  # float32 queries: the mma's inputs are 16-bit (Metal's float32 matrices take them)
    assert calls[-1] == ("fma", 2, 50)
    assert not {st["kernel"]: st for st in registry.status()}.get("cuda-sdpa-mma", {}).get("chosen")
    registry.reset()
