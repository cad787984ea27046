"""KV cache helpers shared by the target and model drafters (mlx-lm caches: offset, trim)."""

from __future__ import annotations

import weakref

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, CacheList, ChunkedKVCache, KVCache, RotatingKVCache, make_prompt_cache
from mlx_lm.models.deepseek_v41 import LayerCache as DeepseekV41Cache

from .features import decoder_body, tapped

PREFILL_CHUNK = 512  # tokens per prompt chunk: bounds the attention scratch memory
KV_CACHE_TYPES = ("f16", "f32")  # how a float32 model's keys and values are stored (llama.cpp's --cache-type-k/v)


def layer_caches(cache: list) -> list:
    """Every cache of a model's cache list, mlx-lm's CacheLists opened (a layer that holds two: Falcon-H1's SSM
    state and KV cache, Baichuan-M1's conv state and KV cache, DeepSeek-V3.2's and LongCat's pairs of KV caches)."""
    return [inner for c in cache for inner in (layer_caches(c.caches) if isinstance(c, CacheList) else [c])]


def _swapped(caches: list, swap) -> list:
    """`caches` with `swap` applied to each cache, inside CacheLists too."""
    return [CacheList(*_swapped(list(c.caches), swap)) if isinstance(c, CacheList) else swap(c) for c in caches]


class HalfKVCache(KVCache):
    """mlx-lm's KVCache that stores float32 keys and values as float16 (llama.cpp's default cache
    type): half the memory and half the reads per step of a float32 model's cache (GGUF models
    compute in float32). Attention then reads float16 keys and values against float32 queries,
    exactly as if they were float32. Half-precision keys and values are stored as they come."""

    @staticmethod
    def stored_dtype(dtype: mx.Dtype) -> mx.Dtype:
        """The dtype keys and values computed in `dtype` are kept in (the fused CPU block asks)."""
        return mx.float16 if dtype == mx.float32 else dtype

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        return super().update_and_fetch(keys.astype(self.stored_dtype(keys.dtype)),
                                        values.astype(self.stored_dtype(values.dtype)))


class KVView:
    """One layer's KVCache as a compiled step (step_graph.py) sees it: mlx-lm's cache interface (offset,
    update_and_fetch, make_mask) over the cache's buffers, with the position as an array. Kernels that
    read the cache themselves take `at` / `key_length` (the fused CPU block, the attention kernels).
    A sliding-window layer's (a WindowKVCache: window > 0) writes at its buffer's own position `at`
    (offset - the cache's first kept position) and its rows see their last `window` keys there."""

    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array, at: mx.array, key_length: mx.array,
                 window: int = 0):
        self.keys, self.values, self.offset = keys, values, offset  # (1, KV, capacity, D), ..., () int32
        self.at, self.key_length = at, key_length  # (1,) buffer row of the first new row; (1,) keys that count
        # once the step's rows are in (the same arrays in every layer of a kind: one graph node each per step)
        self.window = window

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write the rows at the position (in the buffers' dtype, as the cache stores them); return
        the whole buffers: attention reads `key_length` of them."""
        self.keys = mx.slice_update(self.keys, keys.astype(self.keys.dtype), self.at, axes=(2,))
        self.values = mx.slice_update(self.values, values.astype(self.values.dtype), self.at, axes=(2,))
        return self.keys, self.values

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        """The buffers as the last update_and_fetch left them (for layers that share this one's keys)."""
        return self.keys, self.values

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        """Causal rows over the buffer (for MLX's attention): row i sees the keys up to buffer row at + i,
        with a window only the last `window` of them. Marked with the window and the keys that count, for
        kernels and for layers that get it without the cache (Gemma 4's KV-shared layers). A wider window than
        the cache keeps gets the cache's (WindowKVCache.make_mask)."""
        window = window_size or self.window
        if self.window:  # a sliding layer's buffer: never wider than it keeps
            window = min(window, self.window)
        queries = self.at + mx.arange(n)[:, None]
        keys = mx.arange(self.keys.shape[2])[None]
        mask = keys <= queries
        if window:
            mask = mask & (queries - keys < window)
        return mark_window_mask(mask, window, self.key_length)

    @property
    def attention_window(self) -> int:
        return self.window


class StateView(ArraysCache):
    """A recurrent layer's ArraysCache (linear attention, SSMs) as a compiled step sees it: its state
    arrays, inputs of the trace that the layer replaces as it runs (one sequence: no lengths or padding).
    An ArraysCache itself, since models test for one (qwen3_next's last layer)."""

    def __init__(self, arrays: list[mx.array]):
        super().__init__(len(arrays))
        self.cache = list(arrays)


def store_kv_in_half(model: nn.Module) -> None:
    """Make this model's caches (every make_prompt_cache(model), mlx-lm's included) HalfKVCaches where
    they would be plain KVCaches, and its WindowKVCaches (`exact_windows` first) half-storing ones;
    other kinds (quantized) stay. Per model: mlx-lm's `make_cache` hook, set on this instance only."""
    own = getattr(model, "make_cache", None)

    def make_cache() -> list:
        caches = own() if own is not None else [KVCache() for _ in model.layers]
        return _swapped(caches, lambda c: HalfKVCache() if type(c) is KVCache else WindowKVCache(
            c.window, c.slack, half=True) if type(c) is WindowKVCache else c)

    model.make_cache = make_cache


REWIND_SLACK = 64  # positions a sliding-window cache keeps past its window: rewinds up to this are exact


_WINDOW_MASKS: dict[int, tuple] = {}  # id(mask) -> (weak reference to it, window, key length), while the mask lives


def mark_window_mask(mask: mx.array, window: int, length: mx.array | None = None) -> mx.array:
    """Record that this mask stands for causal rows over their last `window` keys (0: all of them) and,
    for a compiled step's buffer, that only its first `length` keys count (mask_marks), for layers that
    receive the mask without the cache. Returns it."""
    key = id(mask)
    _WINDOW_MASKS[key] = (weakref.ref(mask, lambda _: _WINDOW_MASKS.pop(key, None)), window, length)
    return mask


def mask_marks(mask: mx.array) -> tuple[int, mx.array | None]:
    """(window, key length) mark_window_mask recorded for this very array, else (0, None)."""
    ref, window, length = _WINDOW_MASKS.get(id(mask), (None, 0, None))
    return (window, length) if ref is not None and ref() is mask else (0, None)


def marked_window(mask: mx.array) -> int:
    """The window mark_window_mask recorded for this very array, else 0."""
    return mask_marks(mask)[0]


class WindowKVCache:
    """A sliding-window layer's KV cache that speculation can rewind exactly (mlx-lm's
    RotatingKVCache cannot: after a many-row update its `trim` leaves the rejected rows' keys in the
    window and drops older ones the next step needs).

    Keys stay in time order and the mask applies the window: each query at position p sees the keys
    at p - window < position <= p. An update returns the window - 1 positions before its rows and
    its rows. The cache keeps `window - 1 + slack` past
    positions (more while it has not compacted), so rewinding up to `slack` positions still leaves
    every later query its whole window. A rewind that would cut into a window raises rather than
    decode inexactly.
    """

    step = 256

    def __init__(self, window: int, slack: int = REWIND_SLACK, half: bool = False):
        self.window, self.slack, self.half = window, slack, half  # half: float32 stored as float16
        self.keys = self.values = None
        self.offset = 0  # positions seen
        self.fetched = (0, 0)  # the buffer rows the last update_and_fetch returned
        self.start = 0  # position of keys[..., 0, :]

    def _past(self) -> int:
        """Past positions the next update returns with its own rows: the newest window - 1."""
        return min(self.offset - self.start, self.window - 1)

    def stored_dtype(self, dtype: mx.Dtype) -> mx.Dtype:
        """The dtype keys and values computed in `dtype` are kept in (the fused CPU block asks)."""
        return HalfKVCache.stored_dtype(dtype) if self.half else dtype

    def reserve(self, n: int, lead: tuple, key_dim: int, value_dim: int, key_dtype: mx.Dtype,
                value_dtype: mx.Dtype) -> tuple[int, int]:
        """Room for n more rows (stored in those dtypes), made as update_and_fetch makes it (compacting to
        the rows a rewind may still need first). Returns (held, past): the rows go at [held, held + n)
        and their attention reads rows [held - past, held + n). The caller writes them, then adds n
        to offset (the fused CPU block does)."""
        held, past = self.offset - self.start, self._past()
        if self.keys is None or held + n > self.keys.shape[2]:  # compact to `keep`, then room to grow
            keep = min(held, self.window - 1 + self.slack)
            self._move(keep, keep + n + self.step, lead, key_dim, value_dim, key_dtype, value_dtype)
            held = keep
        return held, past

    def fixed_room(self, n: int, capacity: int) -> None:
        """Room for n more rows in buffers of exactly `capacity` positions (a compiled step's: one shape a
        request, step_graph.py), compacted as `reserve` compacts when they would not fit. capacity must hold
        window - 1 + slack + n."""
        held = self.offset - self.start
        if self.keys.shape[2] == capacity and held + n <= capacity:
            return
        keep = min(held, self.window - 1 + self.slack)
        assert keep + n <= capacity, (keep, n, capacity)
        k, v = self.keys, self.values
        self._move(keep, capacity, k.shape[:2], k.shape[3], v.shape[3], k.dtype, v.dtype)

    def _move(self, keep: int, size: int, lead: tuple, key_dim: int, value_dim: int, key_dtype: mx.Dtype,
              value_dtype: mx.Dtype) -> None:
        """New buffers of `size` positions holding the newest `keep` positions first."""
        held = self.offset - self.start
        shape = (*lead, size, key_dim)
        k, v = mx.zeros(shape, key_dtype), mx.zeros((*shape[:3], value_dim), value_dtype)
        if keep:
            k[..., :keep, :], v[..., :keep, :] = self.keys[..., held - keep : held, :], self.values[..., held - keep : held, :]
        self.keys, self.values, self.start = k, v, self.offset - keep

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        keys, values = (a.astype(self.stored_dtype(a.dtype)) for a in (keys, values))  # as HalfKVCache stores them
        n = keys.shape[2]
        held, past = self.reserve(n, keys.shape[:2], keys.shape[3], values.shape[3], keys.dtype, values.dtype)
        self.keys[..., held : held + n, :], self.values[..., held : held + n, :] = keys, values
        self.offset += n
        self.fetched = (held - past, held + n)
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        """What the last update_and_fetch returned (mlx-lm's interface: Gemma 3n's KV-shared layers read their
        owner's cache so within the same forward, under the mask the owner's make_mask made)."""
        lo, hi = self.fetched
        return self.keys[..., lo:hi, :], self.values[..., lo:hi, :]

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        """The mask for n new queries over what update_and_fetch will return (called before it).
        Always an array, even where nothing is masked: then every call of a sliding layer runs the
        same attention, a one-row step as each row of a verify pass (mlxspec's few-row kernels read
        `attention_window` instead; MLX's op, where they do not run, the mask). Mixing two would change bits.
        A wider window than the cache keeps gets the cache's, as an mlx-lm RotatingKVCache's decoding steps do
        (mlx-lm's PLaMo 3 asks window_size + 1 of a RotatingKVCache(window_size)): every row of every pass the same."""
        window, past = min(window_size or self.window, self.window), self._past()
        queries = self.offset + mx.arange(n)[:, None]
        keys = self.offset - past + mx.arange(past + n)[None]
        return mark_window_mask((keys <= queries) & (queries - keys < window), window)

    @property
    def attention_window(self) -> int:
        """What its masks stand for, for attention kernels that take a window instead of a mask."""
        return self.window

    def can_rewind(self, n: int) -> bool:
        """Does the query after rewinding n positions still find its whole window here?"""
        return n <= self.offset and self.start <= max(0, self.offset - n - self.window + 1)

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        if not self.can_rewind(n):
            raise RuntimeError(f"rewinding {n} positions would cut into a {self.window}-position window")
        self.offset -= n
        return n

    @property
    def state(self):
        held = self.offset - self.start
        return [] if self.keys is None else [self.keys[..., :held, :], self.values[..., :held, :]]

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


def exact_windows(model: nn.Module) -> None:
    """Give this model's sliding-window layers WindowKVCaches in place of mlx-lm's RotatingKVCaches
    (per model: its `make_cache`), so that speculation rewinds them exactly."""
    own = getattr(model, "make_cache", None)
    if own is None:
        return

    def make_cache() -> list:
        return _swapped(own(), lambda c: WindowKVCache(c.max_size) if type(c) is RotatingKVCache and c.keep == 0 else c)

    model.make_cache = make_cache


def can_rewind(cache: list, n: int) -> bool:
    """Can every layer's cache go back n positions exactly?"""
    return all(_can_rewind(c, n) for c in layer_caches(cache))


def kv_can_rewind(cache: list, n: int) -> bool:
    """Can every layer's KV cache go back n positions exactly? (Recurrent states restore a snapshot instead.)"""
    return all(_can_rewind(c, n) for c in layer_caches(cache) if not isinstance(c, (ArraysCache, *REBINDING)))


def _can_rewind(c, n: int) -> bool:
    if hasattr(c, "can_rewind"):
        return c.can_rewind(n)
    if isinstance(c, ChunkedKVCache):  # Llama 4's chunked layers drop keys before the last chunk's worth: the
        # query after the rewind must still find its chunk's first key (mlx-lm's trim would silently stop short)
        query = c.offset - n
        return query >= 0 and c.start_position <= query // c.chunk_size * c.chunk_size
    return c.is_trimmable()


def kv_cache_type(model: nn.Module) -> str:
    """'f16' if this model's float32 keys and values are stored as float16, else 'f32' (as computed)."""
    caches = layer_caches(make_prompt_cache(model))
    return "f16" if any(isinstance(c, HalfKVCache) or getattr(c, "half", False) for c in caches) else "f32"


def new_cache(model: nn.Module) -> list:
    return make_prompt_cache(model)


class PrefillCancelled(Exception):
    """The request's cancel flag was set while its prompt was read: `fed` tokens are in the cache."""

    def __init__(self, fed: int):
        super().__init__(f"prefill cancelled after {fed} tokens")
        self.fed = fed


def prefill(model: nn.Module, cache: list, tokens: list[int], chunk: int = PREFILL_CHUNK,
            features: bool | tuple[int, ...] = False, cancel=None) -> mx.array | None:
    """Feed tokens into the cache in chunks. features=True: through the decoder body alone (no
    output head) and return its final hidden states (len(tokens), H), as learned drafters need; a
    tuple of layers: their inputs, concatenated (features.tapped: EAGLE-3's).
    `cancel` (a threading.Event): checked before each chunk after the first; once set, PrefillCancelled
    (a client that left stops holding the model for the rest of a long prompt)."""
    from .kernels.passes import prompt_pass  # here: the kernels package imports this module

    rows = []
    for i in range(0, len(tokens), chunk):
        if i and cancel is not None and cancel.is_set():
            raise PrefillCancelled(i)
        x = mx.array(tokens[i : i + chunk])[None]
        with prompt_pass():  # on GPUs MLX's ops, however short the chunk (kernels/passes.py)
            if features:
                final = decoder_body(model)(x, cache=cache)[0]
                rows.append(tapped(model, features)[0] if isinstance(features, tuple) else final)
                mx.eval(rows[-1], [c.state for c in cache])
            else:
                model(x, cache=cache)
                mx.eval([c.state for c in cache])
    if not features:
        return None
    return mx.concatenate(rows) if rows else None


def rewind(cache: list, n: int) -> None:
    """Take the last n positions out of every cache that can (KV caches); recurrent layers' states
    cannot go back: a caller that fed them rows it now drops restores a `snapshot` taken before."""
    if n > 0:
        for c in layer_caches(cache):
            if c.is_trimmable():
                c.trim(n)


# Caches that cannot trim but only ever rebind their arrays, never write into them, so a copy of their attributes is
# a snapshot: DeepSeek-V4.1's (its window, closed compressed groups and the open group's rows).
REBINDING = (DeepseekV41Cache,)


def has_states(cache: list) -> bool:
    """Does this cache hold layers whose rows cannot be trimmed, only snapshot and restored (hybrid models)?"""
    return any(isinstance(c, (ArraysCache, *REBINDING)) for c in layer_caches(cache))


def snapshot(cache: list) -> list:
    """The states of the layers that cannot trim (mlx-lm's ArraysCache: linear attention, SSMs; REBINDING), to
    `restore` after rows that must be undone; [] for a model of KV caches alone."""
    return [(c, list(c.cache) if isinstance(c, ArraysCache) else dict(vars(c)))
            for c in layer_caches(cache) if isinstance(c, (ArraysCache, *REBINDING))]


def restore(saved: list) -> None:
    for c, state in saved:  # MLX arrays are immutable: the saved ones are the old state
        if isinstance(state, dict):
            vars(c).update(state)
        else:
            c.cache = list(state)


def speculable(model: nn.Module) -> bool:
    """Can speculation undo rejected drafts in every layer of this model: a KV cache that trims, or
    a state it can snapshot? (mlx-lm's RotatingKVCache with kept tokens cannot.)"""
    return all(isinstance(c, (ArraysCache, *REBINDING)) or (c.is_trimmable() and not isinstance(c, RotatingKVCache))
               for c in layer_caches(make_prompt_cache(model)))
