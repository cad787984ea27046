"""Peak memory of one run: MLX's allocator where it tells (`mx.get_peak_memory`), else process RSS.

MLX's figure counts every live MLX buffer, weights included, since the last reset. The RSS
fallback is the process's high-water mark since it started (it cannot be reset), so it is labelled.
"""

from __future__ import annotations

import resource
import sys
from contextlib import contextmanager

import mlx.core as mx


def source() -> str:
    return "mlx" if hasattr(mx, "get_peak_memory") and hasattr(mx, "reset_peak_memory") else "rss"


def reset_peak() -> None:
    if source() == "mlx":
        mx.reset_peak_memory()


def peak_bytes() -> int:
    if source() == "mlx":
        return int(mx.get_peak_memory())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


@contextmanager
def allocated():
    """Bytes MLX allocated inside the block above what was live at its start, its buffer cache off so
    that every allocation is a new one (a step that copies the KV cache shows as the cache's size):

        with allocated() as grew:
            mx.eval(step(x, cache))
        grew["bytes"]
    """
    grew = {"bytes": 0}
    limit = mx.set_cache_limit(0)
    try:
        before = mx.get_active_memory()
        mx.reset_peak_memory()
        yield grew
        grew["bytes"] = int(mx.get_peak_memory() - before)
    finally:
        mx.set_cache_limit(limit)
