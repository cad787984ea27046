"""Decoding steps as compiled MLX graphs: a step's graph is built once per shape, then replayed.

Building a decoding step's graph in Python costs about as much as a GPU takes to run it for a small
model (SmolLM2-135M: ~2.7 ms of Python in a ~7 ms step on an H100, ~900 graph nodes). `mx.compile`
records the graph once per input shape and replays it from C++. Its inputs must be arrays of fixed
shapes, so a compiled step sees each layer's KV cache as the buffers mlx-lm's KVCache holds, with the
position as an array: each layer writes its rows there (`slice_update`), RoPE takes it as an array
offset, and attention reads the whole buffer with the number of keys that count (mlxspec's attention
kernels take it as `length=` and compute exactly what a call over those keys computes; MLX's op gets
a mask instead; the CPU's fused blocks take the position as an array). Every decoding pass goes
through such a graph, so speculation stays exact wherever the kernels are row-invariant.

One graph per (pass, rows, capacity). Capacities come from fixed buckets (powers of two from 256 up
to MAX_GROWTH, then its multiples), so every request meets the same few and each is traced once per
row count for the whole process (~20 ms a trace on the CPU).

    steps = StepGraphs(model)                  # enabled=False: model(x, cache=cache) itself
    logits = steps(x, cache)                   # (1, M) ids -> (1, M, V), as model(x, cache=cache)
    logits, hidden = steps(x, cache, hidden=True)   # as features.target_forward

Each row count's first pass is also built eagerly (kernels check and time themselves on first use,
which a trace cannot) and the compiled pass is checked against it once: the same bits, or close
(another fusion of elementwise ops; every decoding pass runs compiled, so speculation stays exact),
or compiled steps go off for the model (`status()` says how each row count matched).
Sliding-window layers (mlxspec's WindowKVCache: Gemma 2/3/4, gpt-oss, Cohere 2 ...) keep one buffer
capacity for good (`window_capacity`: a little over the window), compacted when full, with their own
buffer position as an array next to the model's; their rows see their last `window` keys there.
Recurrent layers (mlx-lm's ArraysCache: gated delta nets, Mamba-2) pass their state arrays through the
trace (cache.StateView); a layer that holds several caches (mlx-lm's CacheList: Falcon-H1, Baichuan-M1) passes each
one's. Other caches (quantized KV caches) and models that cannot trace this way run
eagerly, as before.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, make_prompt_cache

from .cache import REWIND_SLACK, HalfKVCache, KVView, StateView, WindowKVCache, layer_caches
from .features import target_forward
from .kernels.passes import DECODE_ROWS

log = logging.getLogger(__name__)

COMPILABLE = (KVCache, HalfKVCache, WindowKVCache, ArraysCache)  # exactly these: subclasses may store or mask otherwise
MAX_ROWS = DECODE_ROWS  # a pass of more rows (a prompt chunk) is built eagerly: prefill shapes vary too much to cache
CLOSE = 1e-2  # a compiled pass may differ from the eager one by this share of the largest |logit|, no more
MAX_GROWTH = 4096  # cache capacities double up to this many positions, then grow by it


class StepGraphs:
    """Decoding passes (up to MAX_ROWS rows) of one model through compiled graphs, on the model's own
    KV caches; anything else through the model eagerly. `off` says why compiled steps are not used.
    A subclass may trace other passes over a KV cache (`_pass`, `replay`): EAGLE's draft steps do."""

    def __init__(self, model: nn.Module | None, enabled: bool = True):
        self.model = model
        self.off: str | None = None if enabled else "off"
        caches = make_prompt_cache(model) if enabled and model is not None else []
        kinds = {type(c).__name__ for c in layer_caches(caches) if type(c) not in COMPILABLE}
        if kinds:
            self.off = f"off: its caches are not all KV caches or recurrent states ({', '.join(sorted(kinds))})"
        eager = sorted({type(m).__name__ for _, m in model.named_modules() if getattr(m, "EAGER_STEPS", False)}
                       if enabled and model is not None else [])
        if eager:  # layers that need a KV cache's exact keys (latent_attention.py's rows on GPUs)
            self.off = f"off: {', '.join(eager)} need a KV cache's exact keys"
        self._compiled: dict[str, object] = {}  # pass name -> its mx.compile'd function (made on first use)
        # other passes over the model's caches, by name: (inputs, cache views) -> outputs (tree.py's tree passes)
        self.extra: dict[str, Callable[[tuple, list], list[mx.array]]] = {}
        self.extra_off: dict[str, str] = {}  # such a pass that failed or disagreed -> why (it alone runs eagerly)
        self.checks: dict[tuple[str, int], str] = {}  # (pass, rows) -> how its compiled pass matched the eager one
        self.graphs: set[tuple] = set()  # the shapes traced so far (one compiled graph each)

    def __call__(self, x: mx.array, cache: list, hidden: bool | tuple[int, ...] = False):
        """(1, M) ids -> logits (1, M, V) [, hidden (1, M, H)], as model(x, cache=cache) / target_forward
        (`hidden` a tuple of layers: their inputs, target_forward's `layers`)."""
        name = "logits" if not hidden else "hidden" if hidden is True else f"hidden:{','.join(map(str, hidden))}"
        out = self.replay(name, (x,), cache) if x.ndim == 2 and x.shape[0] == 1 else None
        if out is None:
            return _eager(self.model, x, cache, hidden)
        return tuple(out) if hidden else out[0]

    def replay(self, name: str, inputs: tuple, cache: list) -> list | None:
        """Pass `name` (`_pass`) over inputs (inputs[0]: (1, rows) ids or (rows,) ones; the rest any arrays) through its
        compiled graph, writing its rows into the cache; its outputs, or None where compiled steps do
        not apply (then nothing was written)."""
        rows, flat = _rows(inputs), layer_caches(cache)  # CacheLists opened: their caches' arrays in order
        if name in self.extra_off or not self._applies(rows, flat):
            return None
        for c in flat:
            _make_room(c, rows)
        layout = tuple(_layout(c) for c in cache)
        kv = [c for c in flat if type(c) is not ArraysCache]
        offset = mx.array(kv[0].offset if kv else 0, dtype=mx.int32)
        start = mx.array(next((c.start for c in flat if type(c) is WindowKVCache), 0), dtype=mx.int32)
        buffers = [a for c in flat for a in _arrays(c)]
        traced = partial(self._traced, name, len(inputs), layout)
        if (name, layout) not in self._compiled:
            self._compiled[(name, layout)] = mx.compile(traced)
        try:
            # A kernel's first call with a shape checks (and times) itself, evaluating arrays, which a trace
            # cannot: a row count's first pass is built eagerly too, and its compiled graph checked against it.
            first = (name, rows) not in self.checks
            eager = traced(offset, start, *inputs, *buffers) if first else None
            out = self._compiled[(name, layout)](offset, start, *inputs, *buffers)
            if first:
                out = self._check(name, rows, eager, out)
        except Exception as e:  # a model that does arithmetic on the offset, an op compile refuses: eager from now
            self._turn_off(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", name)
            return None
        self.graphs.add((name, rows, kv[0].keys.shape[2] if kv else 0, *(str(a.dtype) for a in inputs)))
        heads = at = len(out) - len(buffers)  # the pass's outputs, then each cache's arrays in order
        for c in flat:
            n = len(_arrays(c))
            _store(c, out[at : at + n], rows)
            at += n
        return out[:heads]

    def _check(self, name: str, rows: int, eager: list, compiled: list) -> list:
        """The self-check of a row count's first compiled pass: its first output against the eager pass's
        (one evaluation of each, once). The same bits, or within CLOSE of its largest value (another fusion
        of elementwise ops, say: these passes all run compiled, so speculation stays exact), or compiled
        steps go off for this model. Returns the outputs to use."""
        mx.eval(eager[0], compiled[0])
        want, got = eager[0].astype(mx.float32), compiled[0].astype(mx.float32)
        if mx.array_equal(want, got).item():
            self.checks[(name, rows)] = "same bits"
            return compiled
        diff, scale = mx.abs(want - got).max().item(), mx.abs(want).max().item()
        self.checks[(name, rows)] = f"max |diff| {diff:.3g} of values up to {scale:.3g}"
        if not diff <= CLOSE * scale:  # NaN fails too
            self._turn_off(f"compiled {rows}-row {name} passes disagree with eager ones ({self.checks[(name, rows)]})",
                           name)
            return eager
        return compiled

    def _turn_off(self, why: str, name: str = "") -> None:
        """Compiled passes off for this model; for a pass of `extra`, only that pass (the decoding steps keep theirs)."""
        if name in self.extra:
            self.extra_off[name] = why
            log.warning("mlxspec: compiled %s passes off for this model (%s); building them eagerly", name, why)
            return
        self.off = why
        log.warning("mlxspec: compiled decoding steps off for this model (%s); building each step", why)

    def _applies(self, rows: int, cache: list) -> bool:
        """cache: the layers' caches, CacheLists opened (layer_caches)."""
        if not (self.off is None and 0 < rows <= MAX_ROWS and bool(cache)
                and all(type(c) in COMPILABLE and _ready(c) for c in cache)):
            return False
        # Sliding-window layers share one mask, so they must share a window and a first kept position (they
        # do: they fill and compact alike); their positions then travel as one array.
        return len({(c.window, c.slack, c.start) for c in cache if type(c) is WindowKVCache}) <= 1

    def _traced(self, name: str, n: int, layout: tuple[tuple, ...], offset: mx.array, start: mx.array,
                *arrays: mx.array) -> list[mx.array]:
        """A pass as a pure function of arrays: (position, sliding layers' first kept position, n inputs,
        buffers) -> (outputs, buffers). layout: each cache's kind (_layout), in order."""
        inputs, buffers = arrays[:n], list(arrays[n:])
        full = offset.reshape(1)  # (1,): MLX's Metal kernels take a 0-d input by reference, not pointer
        sliding = full - start  # a sliding layer's buffer row of the position (unused: not in the graph)
        at = {False: (full, full + _rows(inputs)), True: (sliding, sliding + _rows(inputs))}  # row, keys that count

        def view(kind: str, size):  # size: a KV cache's window (0: none), a state's number of arrays, a list's layouts
            nonlocal buffers
            if kind == "list":
                return CacheList(*(view(*inner) for inner in size))
            count = 2 if kind == "kv" else size
            mine, buffers = buffers[:count], buffers[count:]
            return KVView(*mine, offset, *at[size > 0], size) if kind == "kv" else StateView(mine)

        views = [view(*kind) for kind in layout]
        return self._pass(name, inputs, views) + [a for v in layer_caches(views) for a in _arrays(v)]

    def _pass(self, name: str, inputs: tuple, views: list) -> list[mx.array]:
        """The target's passes: 'logits' (model(x)), 'hidden' (features.target_forward: logits, hidden), and
        those registered in `extra`."""
        if name in self.extra:
            return self.extra[name](inputs, views)
        (x,) = inputs
        if name.startswith("hidden"):
            layers = tuple(int(i) for i in name.partition(":")[2].split(",")) if ":" in name else None
            return list(target_forward(self.model, x, views, layers))
        return [self.model(x, cache=views)]

    def status(self) -> dict:
        checks = {f"{rows} rows" + ("" if name == "logits" else f" ({name})"): how
                  for (name, rows), how in sorted(self.checks.items())}
        return {"compiled": self.off is None, "off": self.off, "graphs": len(self.graphs), "checks": checks,
                **({"passes_off": dict(self.extra_off)} if self.extra_off else {})}


def _rows(inputs: tuple) -> int:
    """A pass's rows: inputs[0] is (1, rows) ids or (rows,) ones."""
    return inputs[0].shape[1] if inputs[0].ndim > 1 else inputs[0].shape[0]


def _eager(model: nn.Module, x: mx.array, cache: list, hidden: bool | tuple[int, ...]):
    if not hidden:
        return model(x, cache=cache)
    return target_forward(model, x, cache, hidden if isinstance(hidden, tuple) else None)


def _layout(c) -> tuple[str, int | tuple]:
    """What a trace must know of a cache: ("kv", its window or 0), ("state", its number of arrays) or, for a layer
    that holds several (mlx-lm's CacheList: Falcon-H1's state and KV cache), ("list", their layouts)."""
    if isinstance(c, CacheList):
        return "list", tuple(_layout(inner) for inner in c.caches)
    if isinstance(c, ArraysCache):
        return "state", len(c.cache)
    return "kv", c.window if type(c) is WindowKVCache else 0


def _arrays(c) -> list[mx.array]:
    """A cache's (or view's) arrays as a trace takes and gives them."""
    return list(c.cache) if isinstance(c, ArraysCache) else [c.keys, c.values]


def _store(c, arrays: list[mx.array], rows: int) -> None:
    """A cache after a compiled pass of `rows` rows: the arrays it gave back."""
    if isinstance(c, ArraysCache):
        c.cache = list(arrays)  # a new list: a snapshot (cache.snapshot) keeps the old one
    else:
        c.keys, c.values = arrays
        c.offset += rows


def _ready(c) -> bool:
    """Does a compiled pass have this cache's arrays (after a prefill), and no batch bookkeeping?"""
    if isinstance(c, ArraysCache):
        return all(a is not None for a in c.cache) and c.lengths is None and c.left_padding is None
    return c.keys is not None


def _make_room(c, rows: int) -> None:
    """Room for `rows` more positions, in buffers of a bucket's capacity (`capacity`): every request
    then meets the same few capacities, each traced once per row count for the whole process (~20 ms a
    trace on the CPU), where KVCache's own growth (256 at a time, from wherever a prefill ended) would
    give each prompt length its own series. A cache off the buckets (after a prefill) is moved once.
    A sliding-window cache keeps one capacity for good, compacting when full (window_capacity)."""
    if type(c) is ArraysCache:  # a recurrent state: fixed shapes already
        return
    if type(c) is WindowKVCache:
        c.fixed_room(rows, window_capacity(c.window, c.slack))
        return
    held, need = c.keys.shape[2], c.offset + rows
    if need <= held and held == capacity(held):
        return
    room = capacity(max(need, held)) - c.offset
    c.keys, c.values = (mx.concatenate([a[..., : c.offset, :], mx.zeros((*a.shape[:2], room, a.shape[3]), a.dtype)],
                                       axis=2) for a in (c.keys, c.values))


def window_capacity(window: int, slack: int = REWIND_SLACK) -> int:
    """A sliding-window cache's buffer in compiled steps: what it must keep (its window, the slack a rewind
    may need, a pass's rows) and room to run on before it compacts (a copy of what it keeps) -- 256
    positions or a quarter window -- in multiples of 256 (Gemma 2's 4096-key window: 5,376 positions)."""
    need = window - 1 + slack + MAX_ROWS + max(256, window // 4)
    return -(-need // 256) * 256


def capacity(positions: int) -> int:
    """The bucket holding this many positions: powers of two from 256 up to MAX_GROWTH, then its multiples."""
    if positions <= MAX_GROWTH:
        return max(256, 1 << (positions - 1).bit_length())
    return -(-positions // MAX_GROWTH) * MAX_GROWTH
