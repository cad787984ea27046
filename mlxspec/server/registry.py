"""Loaded engines by model name: load on demand, keep alive for a while, unload to release memory.

All MLX work (loading, generating, freeing) runs on one dedicated thread, `mlx_thread`: the event
loop never blocks on MLX, and MLX is never driven from two threads at once.

Before a load the registry makes room: a free slot (MLXSPEC_MAX_LOADED_MODELS) and the memory the
model will take (mlxspec.footprint), unloading idle models least recently used first. A model that
cannot fit while others are in use is a 503 (come back); one larger than the memory this machine
has at all is refused with the sizes (InsufficientMemoryError, 400), before anything is loaded.
"""

from __future__ import annotations

import asyncio
import gc
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx

from ..engine import Engine
from ..footprint import InsufficientMemoryError, available_memory, gib, model_footprint
from ..store import Manifest, load_engine
from .requests import ApiError

FOREVER = float("inf")


@dataclass
class Loaded:
    name: str
    manifest: Manifest
    engine: Engine
    active: int = 0  # requests using it now: never unloaded under them
    expires_at: float = FOREVER  # wall-clock seconds; FOREVER for a negative keep_alive
    timer: asyncio.TimerHandle | None = None
    unload_when_idle: bool = False
    last_used: float = field(default_factory=time.monotonic)

    @property
    def size(self) -> int:
        info = self.engine.info
        return int(info.get("weight_bytes", 0)) + int(info.get("draft_weight_bytes", 0))


class Registry:
    def __init__(self, max_loaded: int, default_keep_alive: float, loader: Callable[[Manifest], Engine] = load_engine,
                 footprint: Callable[[Manifest], int | None] = model_footprint,
                 available: Callable[[], int | None] = available_memory):
        self.max_loaded = max_loaded
        self.default_keep_alive = default_keep_alive
        self.loader = loader
        self.footprint, self.available = footprint, available  # bytes a model needs / the machine has (None: unknown)
        self.mlx_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlx")
        self.loaded: dict[str, Loaded] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._room = asyncio.Lock()  # making room and reserving it happen as one step
        self._loading = 0  # loads under way: they hold a slot before they appear in `loaded`

    async def run(self, fn, *args):
        """Run `fn(*args)` on the MLX thread."""
        return await asyncio.get_running_loop().run_in_executor(self.mlx_thread, fn, *args)

    async def acquire(self, name: str, manifest: Manifest) -> tuple[Loaded, float]:
        """The loaded model (loading it if needed), marked in use; returns it and the load seconds."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            entry = self.loaded.get(name)
            if entry is not None and entry.manifest != manifest:  # re-created under the same name
                await self._unload(entry)
                entry = None
            seconds = 0.0
            if entry is None:
                entry, seconds = await self._load(name, manifest)
            entry.active += 1
            entry.last_used = time.monotonic()
            if entry.timer:
                entry.timer.cancel()
                entry.timer = None
            return entry, seconds

    async def _load(self, name: str, manifest: Manifest) -> tuple[Loaded, float]:
        need = await asyncio.get_running_loop().run_in_executor(None, self.footprint, manifest)  # file sizes
        # Overlapping loads of different models would each see room and all load: reserve a slot first.
        async with self._room:
            await self._make_room()
            await self._make_memory(name, need)
            self._loading += 1
        try:
            start = time.perf_counter()
            engine = await self.run(self.loader, manifest)
            entry = self.loaded[name] = Loaded(name, manifest, engine)
            return entry, time.perf_counter() - start
        finally:
            self._loading -= 1

    def release(self, entry: Loaded, keep_alive: float | None) -> None:
        """A request is done with the model: keep it `keep_alive` seconds (0: unload, < 0: forever)."""
        entry.active -= 1
        keep = self.default_keep_alive if keep_alive is None else keep_alive
        entry.unload_when_idle = entry.unload_when_idle or keep == 0
        entry.expires_at = FOREVER if keep < 0 else time.time() + keep
        if entry.active > 0:
            return
        if entry.unload_when_idle:
            asyncio.ensure_future(self._unload(entry))
        elif keep > 0:
            loop = asyncio.get_running_loop()
            entry.timer = loop.call_later(keep, lambda: asyncio.ensure_future(self._unload(entry)))

    async def unload(self, name: str) -> bool:
        """Unload now if idle, else as soon as its requests finish; False if it was not loaded."""
        entry = self.loaded.get(name)
        if entry is None:
            return False
        if entry.active:
            entry.unload_when_idle = True
            entry.expires_at = time.time()
        else:
            await self._unload(entry)
        return True

    async def _unload(self, entry: Loaded) -> None:
        if self.loaded.get(entry.name) is not entry or entry.active:
            return  # already gone, or in use again: the last release decides
        if entry.timer:
            entry.timer.cancel()
        del self.loaded[entry.name]
        entry.engine = None  # type: ignore[assignment]  # drop the last reference before freeing
        await self.run(_free_memory)

    async def _make_room(self) -> None:
        """Unload idle models, least recently used first, until one more fits."""
        while len(self.loaded) + self._loading >= self.max_loaded:
            idle = [e for e in self.loaded.values() if not e.active]
            if not idle:
                raise ApiError(
                    503, f"all {self.max_loaded} model slots are busy or loading (MLXSPEC_MAX_LOADED_MODELS)"
                )
            await self._unload(min(idle, key=lambda e: e.last_used))

    async def _make_memory(self, name: str, need: int | None) -> None:
        """Unload idle models, least recently used first, until `need` bytes are available."""
        free = self.available() if need is not None else None
        while free is not None and need > free:
            idle = [e for e in self.loaded.values() if not e.active]
            if not idle:
                if self.loaded or self._loading:  # models in use hold the memory: later it may fit
                    raise ApiError(503, f"not enough memory for {name!r} while other models are in use "
                                        f"(needs about {gib(need)}, {gib(free)} available)")
                raise InsufficientMemoryError(f"model {name!r} needs about {gib(need)} of memory, more than the "
                                              f"{gib(free)} this machine has available")
            victim = min(idle, key=lambda e: e.last_used)
            freed = victim.size
            await self._unload(victim)
            free = max(self.available() or 0, free + freed)  # the OS may not show freed pages at once

    async def close(self) -> None:
        for entry in list(self.loaded.values()):
            entry.active = 0
            await self._unload(entry)
        await self.run(mx.clear_streams)  # MLX needs it before its thread ends, or the process aborts at exit
        self.mlx_thread.shutdown(wait=True, cancel_futures=True)


def _free_memory() -> None:
    gc.collect()
    mx.clear_cache()
