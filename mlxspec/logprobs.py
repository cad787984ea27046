"""Log-probabilities of the emitted tokens (Ollama's and OpenAI's `logprobs` / `top_logprobs`).

What they are: log softmax of the target's logits at the token's position, before repeat penalties,
grammar masks, temperature and the sampling filters (llama.cpp's server reports the same, and Ollama
passes it on). A verify pass scores every position it keeps with the same bits as a one-row step
(the exactness promise), so speculation reports exactly the logprobs plain decoding would.

    rows = LogprobRows.of(logits, tokens, top)   # (R, V) logits, (R,) tokens -> lazy arrays
    mx.eval(..., *rows.arrays)                   # with the round's one host read-back
    rows.read(n)                                 # the first n rows -> [TokenLogprob]
    token_bytes(tokenizer)(id)                   # what the daemon shows of a token: its bytes
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # the most likely tokens here, most likely first


@dataclass
class LogprobRows:
    chosen: mx.array  # (R,) float32: log p(token_i) in row i
    top_ids: mx.array | None  # (R, top) uint32, most likely first
    top_values: mx.array | None  # (R, top) float32
    tokens: mx.array  # (R,)

    @classmethod
    def of(cls, logits: mx.array, tokens: mx.array, top: int) -> "LogprobRows":
        """Lazy: row i's log softmax at tokens[i] and its `top` largest entries."""
        assert logits.ndim == 2 and tokens.shape == (logits.shape[0],), (logits.shape, tokens.shape)
        lp = logits.astype(mx.float32)
        lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
        chosen = mx.take_along_axis(lp, tokens.astype(mx.int32)[:, None], axis=-1)[:, 0]
        if top == 0:
            return cls(chosen, None, None, tokens)
        ids = mx.argpartition(-lp, top - 1, axis=-1)[:, :top]  # the top entries, unordered: O(V), not a sort
        values = mx.take_along_axis(lp, ids, axis=-1)
        order = mx.argsort(-values, axis=-1)
        ids, values = mx.take_along_axis(ids, order, axis=-1), mx.take_along_axis(values, order, axis=-1)
        return cls(chosen, ids.astype(mx.uint32), values, tokens)

    @property
    def arrays(self) -> list[mx.array]:
        return [a for a in (self.chosen, self.top_ids, self.top_values) if a is not None]

    def read(self, n: int) -> list[TokenLogprob]:
        """The first n rows, on the host (their arrays already evaluated with the round's read-back)."""
        tokens, chosen = self.tokens[:n].tolist(), self.chosen[:n].tolist()
        if self.top_ids is None:
            return [TokenLogprob(t, c) for t, c in zip(tokens, chosen)]
        ids, values = self.top_ids[:n].tolist(), self.top_values[:n].tolist()
        return [TokenLogprob(t, c, list(zip(i, v))) for t, c, i, v in zip(tokens, chosen, ids, values)]


def token_bytes(tokenizer) -> Callable[[int], bytes]:
    """token id -> its bytes (a piece of UTF-8 that may end mid-character), read from the table of
    mlx-lm's streaming detokenizer for this vocabulary: byte-level BPE pieces through GPT-2's byte
    alphabet, SentencePiece pieces with their space marker and <0xNN> byte tokens."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer, _byte_decoder

    detokenizer = tokenizer.detokenizer
    if isinstance(detokenizer, SPMStreamingDetokenizer):
        table, space = detokenizer.tokenmap, "\u2581".encode()
        return lambda token: table[token].replace(space, b" ")
    if isinstance(detokenizer, BPEStreamingDetokenizer):
        alphabet, table = _byte_decoder(), detokenizer.tokenmap  # as the detokenizer decodes them
        return lambda token: b"".join(bytes([alphabet[c]]) if c in alphabet else c.encode() for c in table[token])
    return lambda token: tokenizer.decode([token]).encode()
