"""Gemma 4's assistant drafting (heads/gemma4_assistant.py): a few layers over the target's own keys and values.

It has no cache of its own: at each proposal it reads the target's cache (bound per request), the keys
and values of the target's last full-attention layer (all positions) and of its last sliding-window layer
(the window around the query), and the target's final hidden state of the last cached position, which
the loop hands over with every verify pass (`wants_hidden`). Its draft steps all query that position; each
feeds the token just drafted and the assistant's own projected hidden state. Nothing is read back to the
host: the drafts stay lazy until the verify pass is read.

Where decoding passes are compiled (on GPUs by default), a draft step is one compiled graph (`_step`): it
reads the target's whole cache buffers with the number of keys that count and the sliding layers' window
as a marked mask (cache.mark_window_mask: the attention kernels read only those keys, MLX's op masks the
rest), so every step of a request replays one graph instead of building ~4 layers' ops in Python.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..cache import WindowKVCache, mark_window_mask
from ..errors import MlxspecError
from ..features import decoder_body, vocabulary_size
from ..heads import gemma4_assistant
from ..sampling import Sampling, probabilities, sample
from .base import Draft, Drafter


class AssistantDrafter(Drafter):
    wants_hidden = True

    def __init__(self, target: nn.Module, path: Path, min_confidence: float = 0.0, compiled: bool = False):
        """`min_confidence` > 0: a chain stops after a draft given less than that probability (llama.cpp's
        p-min for MTP drafters; a host read-back per draft step). `compiled`: draft steps replay a graph."""
        self.min_confidence = min_confidence
        self._compiled = None  # set once the layer types are known (below)
        self.head = gemma4_assistant.read(path, target)
        self.name, self.config = "mtp", {"kind": "gemma4_assistant", "file": str(path)}
        body = decoder_body(target)
        self.embed, self.scale = body.embed_tokens, float(getattr(body, "embed_scale", 1.0))
        self.head.set_dtype(self.embed(mx.array([0])).dtype)
        self.vocab_size = vocabulary_size(target)
        self.sources = _shared_layers(target)  # {layer type: index of the target layer whose cache it reads}
        missing = set(self.head.layer_types) - set(self.sources)
        if missing:
            raise MlxspecError(f"{path.name}: its {sorted(missing)[0]} layers have no such target layer to read")
        self.window = self.head.window  # its sliding layers read the target's keys within this of the query
        if compiled:
            self._compiled = mx.compile(partial(self._step_over_buffers, tuple(self.sources)))
        self.cache: list | None = None
        self.last: mx.array | None = None  # (Dt,) the target's hidden state of the last cached position

    def kernel_modules(self) -> list[nn.Module]:
        return [self.head]

    def bind_cache(self, cache: list) -> None:
        self.cache = cache

    def start(self, prompt: list[int], hidden: mx.array | None = None) -> None:
        self.last = None if hidden is None or hidden.shape[0] == 0 else hidden[-1]

    def accept(self, n: int, hidden: mx.array | None = None) -> None:
        if hidden is not None:  # rows of the last context token and the n kept drafts: the last is cached now
            self.last = hidden[n]

    def finish(self) -> None:
        self.cache, self.last = None, None

    def propose(self, context: list[int], k: int, sampling: Sampling, key: mx.array, width: int = 1) -> Draft:
        if self.last is None or self.cache is None or k <= 0:
            return Draft.empty()
        position = self.cache[self.sources[self.head.layer_types[0]]].offset - 1  # the last cached position
        assert position == len(context) - 2, (position, len(context))
        if self._compiled is not None:
            buffers = [a for i in self.sources.values() for a in self._buffers(self.cache[i])]
            at = mx.array(position, dtype=mx.int32)
            step = lambda t, h_: self._compiled(t, h_, at, *buffers)  # noqa: E731
        else:
            shared = {kind: self._keys_values(kind, self.cache[i]) for kind, i in self.sources.items()}
            step = lambda t, h_: self._step(t, h_, position, shared)  # noqa: E731
        keys = mx.random.split(key, k) if not sampling.greedy else [None] * k
        token, h = mx.array([context[-1]]), self.last[None, None]
        tokens, probs = [], []
        for i in range(k):
            logits, h = step(token, h)
            logits = logits[0, 0, : self.vocab_size]
            if sampling.greedy:
                token = mx.argmax(logits)[None]
            else:
                q = probabilities(logits[None], sampling)[0]
                token = sample(q[None], keys[i])
                probs.append(q)
            tokens.append(token)
            if self.min_confidence and i + 1 < k:  # an unsure draft ends the chain (it is kept)
                sure = (mx.softmax(logits.astype(mx.float32)) if sampling.greedy else q)[token[0]]
                self.syncs += 1
                if sure.item() < self.min_confidence:
                    break
        return Draft(mx.concatenate(tokens).astype(mx.uint32), mx.stack(probs) if probs else None, len(tokens))

    def _step(self, token: mx.array, h: mx.array, position, shared: dict, masks: dict | None = None):
        """One draft step: the token just chosen (1,) and h (1, 1, Dt) -> (logits (1, 1, V), h'), over
        {layer type: (keys, values)} (`masks`: which of them count)."""
        e = self.embed(token)[None] * self.scale  # (1, 1, Dt), as the target scales its embeddings
        return self.head(mx.concatenate([e, h.astype(e.dtype)], -1), shared, position, masks)

    def _step_over_buffers(self, kinds: tuple[str, ...], token: mx.array, h: mx.array, position: mx.array,
                           *arrays: mx.array):
        """_step as a compiled step takes it: per layer type (in `kinds` order) the target's whole key and
        value buffers and the number of keys that count."""
        per_kind = {kind: arrays[3 * i : 3 * i + 3] for i, kind in enumerate(kinds)}
        shared = {kind: (k, v) for kind, (k, v, _) in per_kind.items()}
        masks = {kind: self._mask(kind, k.shape[2], length) for kind, (k, _, length) in per_kind.items()}
        return self._step(token, h, position, shared, masks)

    def _mask(self, kind: str, buffer: int, length: mx.array) -> mx.array:
        """(1, buffer) keys a step reads of a whole buffer: [0, length), a sliding type's last `window` of them;
        marked with both, so the attention kernels read just those (cache.mark_window_mask)."""
        window = self.window if kind == "sliding_attention" else 0
        keys = mx.arange(buffer)[None]
        mask = keys < length
        if window:
            mask = mask & (keys >= length - window)
        return mark_window_mask(mask, window, length)

    def _buffers(self, c) -> tuple[mx.array, mx.array, mx.array]:
        """A target layer's whole key and value buffers (in time order from its first kept position) and the
        number of keys held, (1,) int32: the inputs of a compiled step, whose shapes change only as they grow."""
        _readable(c)
        first, held = (c.start, c.offset) if isinstance(c, WindowKVCache) else (0, c.offset)
        return c.keys, c.values, mx.array([held - first], dtype=mx.int32)

    def _keys_values(self, kind: str, c) -> tuple[mx.array, mx.array]:
        """A target layer's cached keys and values the assistant reads, in time order: all of a full-attention
        layer's, the last `window` of a sliding one's (the positions within the window of the query)."""
        _readable(c)
        first, held = (c.start, c.offset) if isinstance(c, WindowKVCache) else (0, c.offset)
        keys, values = c.keys[..., : held - first, :], c.values[..., : held - first, :]
        if kind == "sliding_attention":
            keys, values = keys[..., -self.window :, :], values[..., -self.window :, :]
        return keys, values


def _readable(c) -> None:
    """The assistant reads a target cache's keys in time order: not a rotating one's."""
    if type(c).__name__ == "RotatingKVCache":
        raise MlxspecError("Gemma 4's assistant reads the target's sliding-window cache in time order: "
                           "a rotating cache is not one it can read")


def _shared_layers(target: nn.Module) -> dict[str, int]:
    """{layer type: the target's last layer of that type that has its own keys and values}."""
    out = {}
    for i, layer in enumerate(target.layers):
        if getattr(layer.self_attn, "has_kv", True):
            out[layer.layer_type] = i
    return out
