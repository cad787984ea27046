"""Logits -> the distribution a token is drawn from; the same transform for target and draft.

Speculative sampling is exact only if p (target) and q (draft) are the distributions each side
would really sample from, so both go through `probabilities` with the same settings. The filters
are mlx-lm's own (top-p, min-p, top-k on log-probabilities, then temperature), in mlx-lm's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_repetition_penalty

from .options import MIN_TEMPERATURE, GenerateOptions


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @classmethod
    def from_options(cls, o: GenerateOptions) -> "Sampling":
        return cls(o.temperature, o.top_k, o.top_p, o.min_p)

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE  # smaller ones would divide logits into NaN


def probabilities(logits: mx.array, s: Sampling) -> mx.array:
    """(..., V) logits -> (..., V) float32 probabilities after filters and temperature."""
    logprobs = logits.astype(mx.float32)
    logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
    if s.top_p < 1.0:
        logprobs = apply_top_p(logprobs, s.top_p)
    if s.min_p > 0.0:
        logprobs = apply_min_p(logprobs, s.min_p)
    if 0 < s.top_k < logprobs.shape[-1]:
        logprobs = apply_top_k(logprobs, s.top_k)
    return mx.softmax(logprobs / s.temperature, axis=-1)


def sample(probs: mx.array, key: mx.array) -> mx.array:
    """Draw one token per row of (..., V) probabilities (zeros are never drawn)."""
    return mx.random.categorical(mx.log(probs), key=key)


def penalize(logits: mx.array, history: list[int], drafts: mx.array | None, penalty: float, last_n: int) -> mx.array:
    """Repeat penalty for each of the R rows of (R, V) logits, row i seeing history + drafts[:i].

    Row by row because each verify position has its own past; that keeps the penalised target
    distribution exactly what plain decoding would use at that position.
    """
    if penalty == 1.0 or last_n == 0:
        return logits
    # -1: the whole context; a window past the context is the whole context (MLX slices need int32)
    whole = len(history) + logits.shape[0]
    window = whole if last_n == -1 else min(last_n, whole)
    processor = make_repetition_penalty(penalty, window)
    past = mx.array(history[-window:], dtype=mx.uint32)
    rows = []
    for i in range(logits.shape[0]):
        seen = past if i == 0 or drafts is None else mx.concatenate([past, drafts[:i].astype(mx.uint32)])
        rows.append(processor(seen, logits[i : i + 1]) if seen.size else logits[i : i + 1])
    return mx.concatenate(rows, axis=0)
