"""Decoding steps as compiled MLX graphs: a step's graph is built once per shape, then replayed.

Building a decoding step's graph in Python costs about as much as a GPU takes to run it for a small
model (SmolLM2-135M: ~2.7 ms of Python in a ~7 ms step on an H100, ~900 graph nodes). `mx.compile`
records the graph once per input shape and replays it from C++. Its inputs must be arrays of fixed
shapes, so a compiled step sees each layer's KV cache as the buffers mlx-lm's KVCache holds, with the
position as an array: each layer writes its rows there (`slice_update`), RoPE takes it as an array
offset, and attention reads the whole buffer with the number of keys that count (mlxspec's attention
kernels take it as `length=` and compute exactly what a call over those keys computes; MLX's op gets
a mask instead). Every decoding pass goes through such a graph, so speculation stays exact wherever
the kernels are row-invariant.

One graph per (rows, capacity). The buffers double as they fill (by at most MAX_GROWTH positions at
once), so a generation traces each row count a handful of times (~20 ms a trace on the CPU).

    steps = StepGraphs(model)                  # enabled=False: model(x, cache=cache) itself
    logits = steps(x, cache)                   # (1, M) ids -> (1, M, V), as model(x, cache=cache)
    logits, hidden = steps(x, cache, hidden=True)   # as features.target_forward

Each row count's first pass is also built eagerly (kernels check and time themselves on first use,
which a trace cannot) and the compiled pass is checked against it once: the same bits, or close
(another fusion of elementwise ops; every decoding pass runs compiled, so speculation stays exact),
or compiled steps go off for the model (`status()` says how each row count matched).
Caches other than mlx-lm's KVCache (and mlxspec's HalfKVCache) -- sliding windows, recurrent
states, quantized caches -- and models that cannot trace this way run eagerly, as before.
"""

from __future__ import annotations

import logging
from functools import partial

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, make_prompt_cache

from .cache import HalfKVCache
from .features import target_forward

log = logging.getLogger(__name__)

COMPILABLE = (KVCache, HalfKVCache)  # exactly these types: subclasses may store or mask otherwise
MAX_ROWS = 64  # a pass of more rows (a prompt chunk) is built eagerly: prefill shapes vary too much to cache
CLOSE = 1e-2  # a compiled pass may differ from the eager one by this share of the largest |logit|, no more
MAX_GROWTH = 4096  # positions a cache's buffers grow by at most at once (they double up to that)


class KVView:
    """One layer's KVCache as a compiled step sees it: mlx-lm's cache interface (offset,
    update_and_fetch, make_mask) over the cache's buffers, with the position as an array."""

    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array, at: mx.array, key_length: mx.array):
        self.keys, self.values, self.offset = keys, values, offset  # (1, KV, capacity, D), ..., () int32
        self.at, self.key_length = at, key_length  # (1,) offset; () keys that count once the step's rows are in
        # (the same arrays in every layer: one graph node each per step, not one per layer)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write the rows at the position (in the buffers' dtype, as the cache stores them); return
        the whole buffers: attention reads `key_length` of them."""
        self.keys = mx.slice_update(self.keys, keys.astype(self.keys.dtype), self.at, axes=(2,))
        self.values = mx.slice_update(self.values, values.astype(self.values.dtype), self.at, axes=(2,))
        return self.keys, self.values

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        """Causal rows over the buffer: row i sees the keys up to position offset + i (for MLX's attention)."""
        if window_size:
            raise NotImplementedError("sliding-window layers are not compiled")
        queries = self.offset + mx.arange(n)[:, None]
        return mx.arange(self.keys.shape[2])[None] <= queries

    def is_trimmable(self) -> bool:  # some models ask their caches
        return True


class StepGraphs:
    """Decoding passes (up to MAX_ROWS rows) of one model through compiled graphs, on the model's own
    KV caches; anything else through the model eagerly. `off` says why compiled steps are not used."""

    def __init__(self, model: nn.Module, enabled: bool = True):
        self.model = model
        self.off: str | None = None if enabled else "off"
        kinds = {type(c).__name__ for c in make_prompt_cache(model) if type(c) not in COMPILABLE} if enabled else ()
        if kinds:
            self.off = f"off: its caches are not all KV caches ({', '.join(sorted(kinds))})"
        self._compiled = {hidden: mx.compile(partial(self._step, hidden)) for hidden in (False, True)}
        self.checks: dict[tuple[int, bool], str] = {}  # (rows, hidden) -> how its compiled pass matched the eager one
        self.graphs: set[tuple] = set()  # the shapes traced so far (one compiled graph each)

    def __call__(self, x: mx.array, cache: list, hidden: bool = False):
        if not self._applies(x, cache):
            return _eager(self.model, x, cache, hidden)
        rows = x.shape[1]
        for c in cache:
            _make_room(c, rows)
        offset = mx.array(cache[0].offset, dtype=mx.int32)
        buffers = [a for c in cache for a in (c.keys, c.values)]
        heads = 2 if hidden else 1
        try:
            # A kernel's first call with a shape checks (and times) itself, evaluating arrays, which a trace
            # cannot: a row count's first pass is built eagerly too, and its compiled graph checked against it.
            eager = None if (rows, hidden) in self.checks else self._step(hidden, x, offset, *buffers)
            out = self._compiled[hidden](x, offset, *buffers)
            if eager is not None:
                out = self._check(rows, hidden, eager, out)
        except Exception as e:  # a model that does arithmetic on the offset, an op compile refuses: eager from now
            self._turn_off(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return _eager(self.model, x, cache, hidden)
        self.graphs.add((rows, hidden, cache[0].keys.shape[2], str(x.dtype)))
        for i, c in enumerate(cache):
            c.keys, c.values = out[heads + 2 * i], out[heads + 2 * i + 1]
            c.offset += rows
        return tuple(out[:2]) if hidden else out[0]

    def _check(self, rows: int, hidden: bool, eager: list, compiled: list) -> list:
        """The self-check of a row count's first compiled pass: its logits against the eager pass's (one
        evaluation of each, once). The same bits, or within CLOSE of the largest logit (another fusion of
        elementwise ops, say: decoding passes all run compiled, so speculation stays exact), or compiled
        steps go off for this model. Returns the outputs to use."""
        mx.eval(eager[0], compiled[0])
        want, got = eager[0].astype(mx.float32), compiled[0].astype(mx.float32)
        if mx.array_equal(want, got).item():
            self.checks[(rows, hidden)] = "same bits"
            return compiled
        diff, scale = mx.abs(want - got).max().item(), mx.abs(want).max().item()
        self.checks[(rows, hidden)] = f"max |diff| {diff:.3g} of logits up to {scale:.3g}"
        if not diff <= CLOSE * scale:  # NaN fails too
            self._turn_off(f"compiled {rows}-row passes disagree with eager ones ({self.checks[(rows, hidden)]})")
            return eager
        return compiled

    def _turn_off(self, why: str) -> None:
        self.off = why
        log.warning("mlxspec: compiled decoding steps off for this model (%s); building each step", why)

    def _applies(self, x: mx.array, cache: list) -> bool:
        return (self.off is None and x.ndim == 2 and x.shape[0] == 1 and 0 < x.shape[1] <= MAX_ROWS and bool(cache)
                and all(type(c) in COMPILABLE and c.keys is not None for c in cache))

    def _step(self, hidden: bool, x: mx.array, offset: mx.array, *buffers: mx.array) -> list[mx.array]:
        """The pass as a pure function of arrays: (ids, position, buffers) -> (logits[, hidden], buffers)."""
        at, key_length = offset.reshape(1), offset + x.shape[1]
        views = [KVView(buffers[i], buffers[i + 1], offset, at, key_length) for i in range(0, len(buffers), 2)]
        heads = list(target_forward(self.model, x, views)) if hidden else [self.model(x, cache=views)]
        return heads + [a for v in views for a in (v.keys, v.values)]

    def status(self) -> dict:
        checks = {f"{rows} rows" + (" +hidden" if hidden else ""): how
                  for (rows, hidden), how in sorted(self.checks.items())}
        return {"compiled": self.off is None, "off": self.off, "graphs": len(self.graphs), "checks": checks}


def _eager(model: nn.Module, x: mx.array, cache: list, hidden: bool):
    return target_forward(model, x, cache) if hidden else model(x, cache=cache)


def _make_room(c: KVCache, rows: int) -> None:
    """Grow the buffers for `rows` more positions as KVCache.update_and_fetch would, but by the
    capacity so far (at least 256 positions, at most MAX_GROWTH): each capacity is one more graph per
    row count to trace (~20 ms each on the CPU), so a long generation should see few of them."""
    prev = c.offset
    if prev + rows <= c.keys.shape[2]:
        return
    if prev % c.step:
        c.keys, c.values = c.keys[..., :prev, :], c.values[..., :prev, :]
    grow = max((c.step + rows - 1) // c.step * c.step, min(c.keys.shape[2], MAX_GROWTH) // c.step * c.step)
    c.keys, c.values = (mx.concatenate([a, mx.zeros((*a.shape[:2], grow, a.shape[3]), a.dtype)], axis=2)
                        for a in (c.keys, c.values))
