"""Verification as pure functions: target rows + drafts (+ draft probabilities) -> (n, next).

`n` is how many drafted tokens the target keeps, `next` the token the target adds after them.
Both stay on the device (lazy mx arrays) so the round's one host read-back fetches them together.

Shapes: k drafted tokens; target rows (k+1, V): row i scores the position of drafts[i], row k the
position after the last draft; draft probabilities (k, V) or None for a deterministic drafter.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from .sampling import sample


def leading_true(flags: mx.array) -> mx.array:
    """Length of the run of True at the start of a (k,) bool array."""
    return mx.cumprod(flags.astype(mx.int32)).sum()


def greedy_accept(target_logits: mx.array, drafts: mx.array) -> tuple[mx.array, mx.array]:
    """Keep drafts while they equal the target's argmax; next = the argmax after them.

    Token-identical to plain greedy decoding as long as each row equals a one-row forward.
    """
    best = mx.argmax(target_logits, axis=-1)  # (k+1,)
    k = drafts.shape[0]
    n = leading_true(drafts.astype(best.dtype) == best[:k]) if k else mx.array(0, mx.int32)
    return n, best[n]


def rejection_accept(
    p: mx.array, drafts: mx.array, q: mx.array | None, key: mx.array
) -> tuple[mx.array, mx.array]:
    """Speculative sampling (Leviathan et al., Chen et al.): the output is distributed as p.

    Accept draft i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw from
    norm(max(0, p_i - q_i)); if all k are kept, draw from p_k. q = None means a deterministic
    drafter (q is one-hot on the drafted token), so acceptance is p_i(d_i).
    """
    k = drafts.shape[0]
    accept_key, draw_key = mx.random.split(key)
    if k == 0:
        return mx.array(0, mx.int32), sample(p[0], draw_key)
    idx = drafts.astype(mx.int32)[:, None]  # (k, 1)
    if q is None:
        q = mx.zeros((k, p.shape[-1]), p.dtype)
        q = mx.put_along_axis(q, idx, mx.array(1.0, p.dtype), axis=-1)
    elif q.shape[-1] != p.shape[-1]:
        q = _match_vocab(q, p.shape[-1])
    p_d = mx.take_along_axis(p[:k], idx, axis=-1)[:, 0]  # (k,) target prob of each draft
    q_d = mx.take_along_axis(q, idx, axis=-1)[:, 0]  # (k,) draft prob of each draft
    u = mx.random.uniform(shape=(k,), key=accept_key)
    # u < p/q written as u*q < p: no division, and q_d == 0 (impossible draft) never accepts... unless p_d > 0.
    n = leading_true(u * q_d < p_d)
    residual = mx.maximum(p[:k] - q, 0.0)  # (k, V)
    mass = residual.sum(axis=-1, keepdims=True)
    # p == q up to rounding leaves no residual mass; then p itself is the right fallback.
    residual = mx.where(mass > 0, residual / mx.maximum(mass, 1e-30), p[:k])
    rows = mx.concatenate([residual, p[k:]], axis=0)  # (k+1, V): row n is what to draw from
    return n, sample(rows[n], draw_key)


def accept_equal(p: mx.array, drafts: mx.array, key: mx.array) -> tuple[mx.array, mx.array]:
    """mlx-lm's rule, kept for comparison only: sample the target and keep drafts that equal it.

    Exact too, but acceptance is sum(p*q) instead of sum(min(p, q)): it collapses at temperature > 0.
    """
    k = drafts.shape[0]
    samples = sample(p, key)  # (k+1,)
    n = leading_true(drafts.astype(samples.dtype) == samples[:k]) if k else mx.array(0, mx.int32)
    return n, samples[n]


def _match_vocab(q: mx.array, size: int) -> mx.array:
    """Draft vocabularies padded to another size: zero-pad or cut to the target's V."""
    if q.shape[-1] > size:
        return q[:, :size]
    return mx.concatenate([q, mx.zeros((q.shape[0], size - q.shape[-1]), q.dtype)], axis=-1)


def ancestry(parents: list[int]) -> list[list[bool]]:
    """(N, N): row m marks m and its ancestors, for a tree given as parent rows (-1 for row 0)."""
    rows = []
    for m, up in enumerate(parents):
        row = list(rows[up]) if up >= 0 else [False] * len(parents)
        row[m] = True
        rows.append(row)
    return rows


def tree_greedy_accept(target_logits: mx.array, drafts: mx.array, parents: list[int]) -> tuple[mx.array, mx.array]:
    """Greedy acceptance over a draft tree -> (deepest node on the accepted path, next token).

    Node 0 is the last context token; node m > 0 holds drafts[m-1] and hangs under parents[m].
    A node is kept when every node on its path equals the target's argmax at its parent; siblings
    hold distinct tokens, so the kept nodes form one path and its deepest node ends it.
    """
    n = len(parents)
    assert target_logits.shape[0] == n and drafts.shape[0] == n - 1, (target_logits.shape, drafts.shape, n)
    up, path, depth = _tree_arrays(tuple(parents))
    best = mx.argmax(target_logits, axis=-1)  # (N,)
    ok = mx.concatenate([mx.array([True]), drafts.astype(best.dtype) == best[up]])  # (N,)
    kept = ~(path & ~ok[None, :]).any(axis=1)  # every node on m's path agrees
    node = mx.argmax(mx.where(kept, depth, 0))
    return node, best[node]


@functools.lru_cache(maxsize=64)
def _tree_arrays(parents: tuple[int, ...]) -> tuple[mx.array, mx.array, mx.array]:
    """A tree's constants, built once per shape (a drafter repeats its shapes): the parent of each
    draft (N-1,), the ancestry matrix (N, N) and each node's depth + 1 (N,)."""
    path = mx.array(ancestry(list(parents)))
    return mx.array(parents[1:], dtype=mx.int32), path, path.astype(mx.int32).sum(axis=1)
