"""Memory before a load: a model larger than the machine has is refused with its sizes (400, nothing
loaded, nothing else lost); idle models are unloaded, least recently used first, to make room; models
in use make it a 503. Footprints come from the files as stored (mlxspec.footprint)."""

from __future__ import annotations

import asyncio

import ollama
import pytest

from daemon_harness import ThreadDaemon
from gguf_fixtures import write_tiny_llama_gguf
from mlxspec.footprint import GIB, HEADROOM, InsufficientMemoryError, _meminfo_available, model_footprint, reference_bytes
from mlxspec.server import Settings
from mlxspec.server.registry import Registry
from mlxspec.server.requests import ApiError
from mlxspec.store import Manifest, Store, load_engine


class FakeEngine:
    def __init__(self, size: int):
        self.info = {"weight_bytes": size}


def registry(sizes: dict[str, int], free: int, loads: list) -> Registry:
    """Models named by their size; `free` bytes available whatever is unloaded (an OS that is slow to show it)."""
    def loader(manifest):
        loads.append(manifest.target)
        return FakeEngine(sizes[manifest.target])

    return Registry(4, 300, loader=loader, footprint=lambda m: sizes[m.target], available=lambda: free)


def test_too_large_for_the_machine_is_refused_with_sizes_before_loading():
    loads = []
    reg = registry({"big": 40 * GIB}, free=22 * GIB, loads=loads)
    with pytest.raises(InsufficientMemoryError, match=r"'big' needs about 40.0 GiB .* 22.0 GiB this machine has"):
        asyncio.run(reg.acquire("big", Manifest(target="big")))
    assert loads == [] and not reg.loaded


def test_idle_models_are_unloaded_least_recently_used_first_until_it_fits():
    async def scenario():
        loads = []
        reg = registry({"a": 6 * GIB, "b": 3 * GIB, "c": 12 * GIB}, free=10 * GIB, loads=loads)
        for name in ("a", "b"):
            entry, _ = await reg.acquire(name, Manifest(target=name))
            reg.release(entry, keep_alive=-1)
        await reg.acquire("c", Manifest(target="c"))  # 10 GiB + a's 6 >= 12: a goes, b (used later) stays
        return loads, sorted(reg.loaded)

    loads, loaded = asyncio.run(scenario())
    assert loads == ["a", "b", "c"] and loaded == ["b", "c"]


def test_models_in_use_make_it_a_503_and_unknown_sizes_skip_the_check():
    async def scenario():
        reg = registry({"a": 6 * GIB, "c": 12 * GIB}, free=10 * GIB, loads=[])
        await reg.acquire("a", Manifest(target="a"))  # in use: never unloaded under its request
        with pytest.raises(ApiError) as e:
            await reg.acquire("c", Manifest(target="c"))
        unknown = Registry(4, 300, loader=lambda m: FakeEngine(1), footprint=lambda m: None, available=lambda: 0)
        await unknown.acquire("x", Manifest(target="x"))
        return e.value, sorted(reg.loaded), sorted(unknown.loaded)

    err, loaded, unknown = asyncio.run(scenario())
    assert err.status == 503 and "while other models are in use" in err.message and loaded == ["a"]
    assert unknown == ["x"]


def test_footprints_are_the_stored_weights_plus_headroom(tmp_path, tiny_llama, tiny_qwen2):
    stored = sum(p.stat().st_size for p in tiny_llama.glob("*.safetensors"))
    assert reference_bytes(str(tiny_llama)) == stored
    assert model_footprint(Manifest(target=str(tiny_llama))) == int(stored * (1 + HEADROOM))
    both = model_footprint(Manifest(target=str(tiny_llama), draft=str(tiny_qwen2)))
    assert both == int((stored + reference_bytes(str(tiny_qwen2))) * (1 + HEADROOM))
    gguf = write_tiny_llama_gguf(tmp_path / "t.gguf", "Q4_0")
    assert reference_bytes(str(gguf)) == gguf.stat().st_size
    assert reference_bytes("no/such-repo-cached") is None and reference_bytes(str(tmp_path / "missing")) is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n")
    assert _meminfo_available(meminfo) == 20000000 * 1024 and _meminfo_available(tmp_path / "none") is None


def test_the_daemon_answers_400_with_the_sizes_and_keeps_serving(tmp_path, tiny_llama):
    store = Store(tmp_path)
    store.save("huge", Manifest(target=str(tiny_llama)))
    store.save("small", Manifest(target=str(tiny_llama), draft_length=2))
    sizes = {"huge": 1 << 50, "small": 1}
    reg = Registry(2, 300, loader=load_engine, available=lambda: 8 * GIB,
                   footprint=lambda m: sizes["small" if m.draft_length == 2 else "huge"])
    d = ThreadDaemon(store, Settings(), reg).start()
    try:
        client = ollama.Client(host=d.url)
        with pytest.raises(ollama.ResponseError) as e:
            client.generate("huge", prompt="hi")
        assert e.value.status_code == 400 and "needs about 1048576.0 GiB" in e.value.error and "8.0 GiB" in e.value.error
        assert client.generate("small", prompt="hi", options={"num_predict": 3}).done
        assert [m.model for m in client.ps().models] == ["small:latest"]
    finally:
        d.stop()
