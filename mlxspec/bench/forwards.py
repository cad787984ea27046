"""Forward passes of M rows over a filled cache, timed with variants interleaved (benchmarks/ scripts).

    times = interleaved_forwards(model, cache, {"mlx": remove, "kernels": install}, (1, 8), repeats=5)
    # {"mlx": {1: [s, ...], 8: [...]}, "kernels": {...}}
"""

from __future__ import annotations

import time
from typing import Callable

import mlx.core as mx


def interleaved_forwards(model, cache, variants: dict[str, Callable[[], object]], rows, repeats: int,
                         vocab: int = 500) -> dict:
    """{variant: {M: [seconds of one M-row forward]}}: every variant (name -> install it) in every repeat,
    after a warm-up round; the cache is rewound after each forward, so all run at the same context."""
    from ..cache import rewind

    times = {v: {m: [] for m in rows} for v in variants}
    for rep in range(repeats + 1):  # the first round warms up
        for name, use in variants.items():
            use()
            for m in rows:
                x = mx.random.randint(0, vocab, (1, m))
                mx.eval(x)
                t = time.perf_counter()
                mx.eval(model(x, cache=cache))
                if rep:
                    times[name][m].append(time.perf_counter() - t)
                rewind(cache, m)
    return times
