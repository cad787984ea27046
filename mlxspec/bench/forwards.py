"""Forward passes of M rows over a filled cache, timed with variants interleaved (benchmarks/ scripts).

    times = interleaved_forwards(model, cache, {"mlx": remove, "kernels": install}, (1, 8), repeats=5)
    # {"mlx": {1: [s, ...], 8: [...]}, "kernels": {...}}; build=: the graph-building share of each, too
    nodes = graph_nodes(model, cache, rows=1)   # MLX graph nodes of one forward (each a dispatch on a GPU)
"""

from __future__ import annotations

import time
from typing import Callable

import mlx.core as mx


def interleaved_forwards(model, cache, variants: dict[str, Callable[[], object]], rows, repeats: int,
                         vocab: int = 500, build: dict | None = None) -> dict:
    """{variant: {M: [seconds of one M-row forward]}}: every variant (name -> install it) in every repeat,
    after a warm-up round; the cache is rewound after each forward, so all run at the same context.
    An install may return the forward to time, `forward(x, cache)` (a step_graph.StepGraphs: each shape
    is run once untimed first, so its trace is not timed), else model(x, cache=cache) is timed.
    build (a dict): filled the same way with the seconds spent building each forward's graph (Python;
    for compiled steps, replaying it)."""
    from ..cache import rewind

    times = {v: {m: [] for m in rows} for v in variants}
    if build is not None:
        build.update({v: {m: [] for m in rows} for v in variants})
    for rep in range(repeats + 1):  # the first round warms up
        for name, use in variants.items():
            forward = use()
            compiled = callable(forward)
            forward = forward if compiled else (lambda x, c: model(x, cache=c))
            for m in rows:
                x = mx.random.randint(0, vocab, (1, m))
                mx.eval(x)
                if compiled:  # its first pass of a shape traces (and checks) the graph: not what a step costs
                    mx.eval(forward(x, cache))
                    rewind(cache, m)
                t = time.perf_counter()
                out = forward(x, cache)
                built = time.perf_counter() - t
                mx.eval(out)
                if rep:
                    times[name][m].append(time.perf_counter() - t)
                    if build is not None:
                        build[name][m].append(built)
                rewind(cache, m)
    return times


def graph_nodes(model, cache, rows: int = 1, vocab: int = 500) -> int:
    """How many MLX graph nodes one forward of `rows` rows builds (then it is evaluated and the cache rewound:
    left lazy, its cache writes would count again in the next forward's graph, as they once did)."""
    import re
    import tempfile
    from pathlib import Path

    from ..cache import rewind

    out = model(mx.random.randint(0, vocab, (1, rows)), cache=cache)
    with tempfile.TemporaryDirectory() as d:
        mx.export_to_dot(f"{d}/forward.dot", out)
        count = len(re.findall(r'label ="', Path(f"{d}/forward.dot").read_text()))
    mx.eval(out, [c.state for c in cache])
    rewind(cache, rows)
    return count
