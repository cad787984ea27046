"""Gemma 4's assistant drafting (heads/gemma4_assistant.py): a few layers over the target's own keys and values.

It has no cache of its own: at each proposal it reads the target's cache (bound per request), the keys
and values of the target's last full-attention layer (all positions) and of its last sliding-window layer
(the window around the query), and the target's final hidden state of the last cached position, which
the loop hands over with every verify pass (`wants_hidden`). Its draft steps all query that position; each
feeds the token just drafted and the assistant's own projected hidden state. Nothing is read back to the
host: the drafts stay lazy until the verify pass is read.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..cache import WindowKVCache
from ..errors import MlxspecError
from ..features import decoder_body, vocabulary_size
from ..heads import gemma4_assistant
from ..sampling import Sampling, probabilities, sample
from .base import Draft, Drafter


class AssistantDrafter(Drafter):
    wants_hidden = True

    def __init__(self, target: nn.Module, path: Path, min_confidence: float = 0.0):
        """`min_confidence` > 0: a chain stops after a draft given less than that probability (llama.cpp's
        p-min for MTP drafters; a host read-back per draft step)."""
        self.min_confidence = min_confidence
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
        shared = {kind: self._keys_values(kind, self.cache[i]) for kind, i in self.sources.items()}
        keys = mx.random.split(key, k) if not sampling.greedy else [None] * k
        token, h = mx.array([context[-1]]), self.last[None, None]
        tokens, probs = [], []
        for i in range(k):
            e = self.embed(token)[None] * self.scale  # (1, 1, Dt), as the target scales its embeddings
            logits, h = self.head(mx.concatenate([e, h.astype(e.dtype)], -1), shared, position)
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

    def _keys_values(self, kind: str, c) -> tuple[mx.array, mx.array]:
        """A target layer's cached keys and values the assistant reads, in time order: all of a full-attention
        layer's, the last `window` of a sliding one's (the positions within the window of the query)."""
        if type(c).__name__ == "RotatingKVCache":
            raise MlxspecError("Gemma 4's assistant reads the target's sliding-window cache in time order: "
                               "a rotating cache is not one it can read")
        first, held = (c.start, c.offset) if isinstance(c, WindowKVCache) else (0, c.offset)
        keys, values = c.keys[..., : held - first, :], c.values[..., : held - first, :]
        if kind == "sliding_attention":
            keys, values = keys[..., -self.window :, :], values[..., -self.window :, :]
        return keys, values


def _shared_layers(target: nn.Module) -> dict[str, int]:
    """{layer type: the target's last layer of that type that has its own keys and values}."""
    out = {}
    for i, layer in enumerate(target.layers):
        if getattr(layer.self_attn, "has_kv", True):
            out[layer.layer_type] = i
    return out
