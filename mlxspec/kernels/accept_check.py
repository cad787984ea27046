"""What a fused acceptance kernel must compute, and the self-check that holds it to that.

The raw kernel interfaces checked here (accept.py wraps them for decode):
    greedy(logits (k+1, V), drafts (k,) uint32) -> (2,) int32 [n, next]
    rejection(p (k+1, V), q (k, V), drafts (k,) uint32, u (k+1,) float32) -> (2,) int32 [n, next]

Greedy must equal verify.greedy_accept exactly. The reference rejection sampler draws with
mx.random.categorical (Gumbel-max), which no kernel can reproduce bit for bit, so rejection is
exact when n equals the reference's formula for the same uniforms (`reference_n`) and next is the
inverse CDF of the reference's distribution at u[k] (`inverse_cdf`, float64), up to float32
rounding of the CDF (`DRAW_RTOL`): then next is distributed exactly as the reference's draw.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..verify import greedy_accept, leading_true

DRAW_RTOL = 1e-5  # CDF boundaries may move by this fraction of the mass (float32 sums in any order)
SHAPES = [(0, 257), (1, 50), (4, 1000), (8, 257)]  # (k, V): empty, tiny, a few rows, V % 32 != 0
TRIALS = 6


def reference_n(p: mx.array, q: mx.array, drafts: mx.array, u: mx.array) -> int:
    """verify.rejection_accept's n for these uniforms (its exact comparison u * q_d < p_d)."""
    k = drafts.shape[0]
    if k == 0:
        return 0
    idx = drafts.astype(mx.int32)[:, None]
    p_d = mx.take_along_axis(p[:k], idx, axis=-1)[:, 0]
    q_d = mx.take_along_axis(q, idx, axis=-1)[:, 0]
    return int(leading_true(u[:k] * q_d < p_d).item())


def draw_row(p: np.ndarray, q: np.ndarray, n: int) -> np.ndarray:
    """The (unnormalised) row the reference draws from after keeping n of k drafts."""
    if n == q.shape[0]:
        return p[n]
    residual = np.maximum(p[n] - q[n], np.float32(0))
    return residual if residual.sum() > 0 else p[n]


def inverse_cdf(row: np.ndarray, u: float) -> tuple[int, np.ndarray, float]:
    """(first token whose CDF exceeds u * mass, the float64 CDF, u * mass); zero-mass tokens never win."""
    cdf = np.cumsum(row.astype(np.float64))
    target = float(u) * cdf[-1]
    token = int(np.searchsorted(cdf, target, side="right"))
    return min(token, int(np.flatnonzero(row > 0)[-1])), cdf, target


def draw_error(row: np.ndarray, u: float, token: int) -> str | None:
    """None if `token` is the inverse-CDF draw of `row` at u, allowing only float32 rounding at a boundary."""
    exact, cdf, target = inverse_cdf(row, u)
    if token == exact:
        return None
    slack = DRAW_RTOL * cdf[-1]
    below = cdf[token - 1] if token > 0 else 0.0
    if 0 <= token < row.size and row[token] > 0 and below - slack <= target < cdf[token] + slack:
        return None
    return f"drew {token}, inverse CDF gives {exact}"


def self_check(greedy, rejection, dtypes=(mx.float32, mx.float16, mx.bfloat16), seed: int = 0) -> str | None:
    """None if both kernels agree with the definitions on random rounds, else what went wrong."""
    rng = np.random.default_rng(seed)
    try:
        for k, v in SHAPES:
            for t in range(TRIALS):
                failure = _greedy_round(greedy, rng, k, v, dtypes[t % len(dtypes)]) or _rejection_round(
                    rejection, rng, k, v, t)
                if failure:
                    return f"k={k} V={v}: {failure}"
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def _greedy_round(greedy, rng, k: int, v: int, dtype) -> str | None:
    logits = mx.array(rng.integers(-3, 4, (k + 1, v)).astype(np.float32)).astype(dtype)  # many ties
    best = np.array(mx.argmax(logits, axis=-1))
    keep = int(rng.integers(0, k + 1))  # plant a run of `keep` agreeing drafts, then a wrong one
    drafts = rng.integers(0, v, k)
    drafts[:keep] = best[:keep]
    if keep < k:
        drafts[keep] = (best[keep] + 1) % v
    drafts = mx.array(drafts.astype(np.uint32))
    n, nxt = greedy_accept(logits, drafts)
    got = greedy(logits, drafts).tolist()
    want = [n.item(), nxt.item()]
    return None if got == want else f"greedy {dtype}: kernel {got}, reference {want}"


def _rejection_round(rejection, rng, k: int, v: int, trial: int) -> str | None:
    p = _random_probs(rng, k + 1, v)
    q = _random_probs(rng, k, v)
    if k and trial % 3 == 1:  # a deterministic drafter: one-hot rows
        q = np.eye(v, dtype=np.float32)[rng.integers(0, v, k)]
    q64 = q.astype(np.float64)  # numpy's choice wants a float64 sum of 1
    drafts = np.array([rng.choice(v, p=row / row.sum()) for row in q64], dtype=np.uint32)
    if k and trial % 3 == 2:  # q_0 == p_0 and a draft p_0 excludes: rejected with no residual mass
        p[0, -1] = 0  # make sure p_0 excludes a token (renormalised below)
        p[0] /= p[0].sum()
        q[0] = p[0]
        drafts[0] = np.flatnonzero(p[0] == 0)[0]
    u = rng.random(k + 1).astype(np.float32)
    got = rejection(mx.array(p), mx.array(q.reshape(k, v)), mx.array(drafts), mx.array(u)).tolist()
    n = reference_n(mx.array(p), mx.array(q.reshape(k, v)), mx.array(drafts), mx.array(u))
    if got[0] != n:
        return f"rejection kept {got[0]} drafts, reference {n}"
    error = draw_error(draw_row(p, q.reshape(k, v), n), u[k], got[1])
    return f"rejection after n={n}: {error}" if error else None


def _random_probs(rng, rows: int, v: int) -> np.ndarray:
    """Softmax rows with about a third of the tokens filtered to exactly 0, as top-k / top-p leave them."""
    logits = rng.normal(size=(rows, v)) * 2
    logits[rng.random((rows, v)) < 0.33] = -np.inf
    logits[:, 0] = np.maximum(logits[:, 0], 0)  # never an empty row
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)
