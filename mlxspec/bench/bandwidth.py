"""The machine's memory bandwidth, measured: the ceiling of plain decoding.

Decoding one token reads every weight once, so tokens/s <= bandwidth / bytes per token (the
roofline). We measure with buffers far larger than the last-level cache (default 256 MiB; caches
here are tens of MiB), best of a few repeats:
  - copy: numpy `copyto`, counting bytes read + written (STREAM's convention);
  - read: a max-reduction over int32 (a pure read, cheap enough per byte to stay memory-bound).
On the CPU the roofline uses the larger of the two: a generous ceiling, so "above the roofline"
is earned. MLX's own copy on the default device is measured too: on a GPU (CUDA, or an Apple GPU's
share of unified memory) that is the device that decodes, so there it alone is the roofline (a
host-memory numpy copy says nothing about the GPU's memory). On the CPU it is reported as what
MLX's elementwise path reaches (often far less).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_MIB = 256


@dataclass
class Bandwidth:
    copy_gbs: float  # GB/s, bytes read + written
    read_gbs: float  # GB/s, bytes read
    mlx_copy_gbs: float | None  # GB/s through MLX's copy on the default device, if measured
    buffer_mib: int
    device: str = "cpu"  # the default MLX device: the one that decodes

    @property
    def roofline_gbs(self) -> float:
        if self.device != "cpu" and self.mlx_copy_gbs:
            return self.mlx_copy_gbs
        return max(self.copy_gbs, self.read_gbs)

    def to_dict(self) -> dict:
        return {**asdict(self), "roofline_gbs": self.roofline_gbs}


def _best_seconds(fn, repeats: int) -> float:
    fn()  # first touch: page faults are not bandwidth
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure_bandwidth(mib: int = DEFAULT_MIB, repeats: int = 5, with_mlx: bool = True) -> Bandwidth:
    n = mib * 2**20 // 4
    src = np.ones(n, dtype=np.int32)
    dst = np.empty_like(src)
    copy = 2 * src.nbytes / _best_seconds(lambda: np.copyto(dst, src), repeats) / 1e9
    read = src.nbytes / _best_seconds(lambda: src.max(), repeats) / 1e9
    mlx_copy = _mlx_copy_gbs(src, repeats) if with_mlx else None
    return Bandwidth(round(copy, 2), round(read, 2), mlx_copy, mib, _device_name() if with_mlx else "cpu")


def _device_name() -> str:
    try:
        import mlx.core as mx
    except ImportError:
        return "cpu"
    return "cpu" if mx.default_device().type == mx.cpu else "gpu"


def _mlx_copy_gbs(src: np.ndarray, repeats: int) -> float | None:
    try:
        import mlx.core as mx
    except ImportError:
        return None
    x = mx.array(src)  # on the default device: the GPU where there is one
    mx.eval(x)
    seconds = _best_seconds(lambda: mx.eval(x + 0), repeats)  # + 0: a real copy (read + write)
    return round(2 * src.nbytes / seconds / 1e9, 2)
