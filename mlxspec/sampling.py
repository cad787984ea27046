"""Logits -> the distribution a token is drawn from; the same transform for target and draft.

Speculative sampling is exact only if p (target) and q (draft) are the distributions each side
would really sample from, so both go through `probabilities` with the same settings. The filters
are mlx-lm's own (top-p, min-p, top-k on log-probabilities, then temperature), in mlx-lm's order.
"""

from __future__ import annotations

from dataclasses import dataclass

import math

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_p, make_repetition_penalty

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
    """(..., V) logits -> (..., V) float32 probabilities after filters and temperature.

    With top-k (Ollama's default 40) every filter keeps a prefix of the most likely tokens, so the
    whole computation runs on the k candidates (`_top_k_probabilities`); without it, mlx-lm's filters
    run over the vocabulary. Both are the same law; each costs what the vocabulary's passes cost
    (on a CPU an exp pass over 49k logits is ~0.9 ms, mlx-lm's top-p sort ~4 ms)."""
    x = logits.astype(mx.float32)
    if 0 < s.top_k < x.shape[-1]:
        return _top_k_probabilities(x, s)
    if s.top_p == 1.0 and s.min_p == 0.0:  # no filter needs log-probabilities: softmax's shift is its own
        return mx.softmax(x / s.temperature, axis=-1)
    logprobs = x - mx.logsumexp(x, axis=-1, keepdims=True)
    if s.top_p < 1.0:
        logprobs = apply_top_p(logprobs, s.top_p)
    if s.min_p > 0.0:
        logprobs = apply_min_p(logprobs, s.min_p)
    return mx.softmax(logprobs / s.temperature, axis=-1)


def _top_k_probabilities(x: mx.array, s: Sampling) -> mx.array:
    """mlx-lm's top-p, min-p then top-k, computed on the k most likely tokens and scattered back.

    Top-p keeps the most likely tokens until the mass above one reaches top_p (and all tokens tied
    with the last kept), min-p those within log(min_p) of the most likely: each keeps a prefix of
    the tokens by probability, so keeping the top k after them keeps their intersection with the k
    candidates. Only top-p and min-p need the normalizer (one pass over the vocabulary)."""
    k = s.top_k
    idx = mx.argpartition(-x, kth=k - 1, axis=-1)[..., :k]  # (..., k) the k largest, unordered
    vals = mx.take_along_axis(x, idx, axis=-1)
    order = mx.argsort(-vals, axis=-1)  # most likely first
    idx, vals = mx.take_along_axis(idx, order, axis=-1), mx.take_along_axis(vals, order, axis=-1)
    keep = None
    if s.top_p < 1.0 or s.min_p > 0.0:
        lp = vals - mx.logsumexp(x, axis=-1, keepdims=True)  # log-probabilities of the candidates
        keep = mx.ones(lp.shape, mx.bool_)
        if s.top_p < 1.0:
            above = mx.cumsum(mx.exp(lp), axis=-1, inclusive=False)  # the mass of the more likely ones
            last = mx.min(mx.where(above < s.top_p, lp, mx.inf), axis=-1, keepdims=True)
            keep = keep & (lp >= last)
        if s.min_p > 0.0:
            keep = keep & (lp >= lp[..., :1] + math.log(s.min_p))
    scaled = vals / s.temperature
    if keep is not None:
        scaled = mx.where(keep, scaled, -mx.inf)
    dense = mx.zeros(x.shape, mx.float32)
    return mx.put_along_axis(dense, idx, mx.softmax(scaled, axis=-1), axis=-1)


def sample(probs: mx.array, key: mx.array) -> mx.array:
    """Draw one token per row of (..., V) probabilities (zeros are never drawn): the first index whose
    cumulative mass exceeds a uniform draw over the row's total (one pass, no logarithms)."""
    cdf = mx.cumsum(probs, axis=-1)
    u = mx.random.uniform(shape=(*probs.shape[:-1], 1), key=key) * cdf[..., -1:]
    return (cdf <= u).astype(mx.uint32).sum(axis=-1)


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
