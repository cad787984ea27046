"""Which passes the row-invariant kernels take on a GPU: decoding passes, not prompt chunks.

A decoding pass (a one-row step, a chain's k+1 rows, a tree's nodes) must compute each row as a
one-row step does, so it takes the kernels. A prompt chunk need not: plain and speculative decoding
feed a prompt in the same chunks (cache.prefill), so any op gives both the same bits. On GPUs MLX's
own ops (tensor-core GEMMs, flash attention) are far faster at hundreds of rows: an 8B-shape llama's
512-row chunk took 334 ms with them and 1266 ms with the kernels on an H100 (bench_gpu.py forward,
benchmarks/results/gpu_h100.md). So there a pass of more rows than any decoding pass has runs MLX's
ops, and so does every forward inside `prompt_pass` (cache.prefill: a short prompt, a chat's next turn),
whose routes would otherwise go row by row or token by token where a decoding pass must (MLA, recurrences).
The CPU kernels keep every pass (on the CPU they are the faster ones). MoE experts see (token, expert)
pairs, sorted by expert in larger passes, so they count tokens by the model's top-k.
"""

from __future__ import annotations

import contextlib
import contextvars

import mlx.core as mx

DECODE_ROWS = 64  # the most rows a decoding pass has: a tree's 63 drafts and its root (tree.MAX_TREE_NODES)

_PROMPT = contextvars.ContextVar("mlxspec_prompt_pass", default=False)


@contextlib.contextmanager
def prompt_pass():
    """The forwards inside read a prompt (cache.prefill): prompt chunks whatever their rows, so a short prompt
    (a chat's next turn) takes MLX's ops on a GPU as a long one does, not the decoding passes' routes."""
    token = _PROMPT.set(True)
    try:
        yield
    finally:
        _PROMPT.reset(token)


def prompt_tokens(tokens: int) -> bool:
    """Is a call of this many tokens (one sequence) a prompt chunk: inside prompt_pass, or more than any decoding
    pass has?"""
    return _PROMPT.get() or tokens > DECODE_ROWS


def prompt_chunk(x: mx.array) -> bool:
    """Is x (..., K) a prompt chunk's activations (prompt_tokens, its rows counted)?"""
    return prompt_tokens(x.size // x.shape[-1] if x.shape[-1] else 0)


def prompt_queries(queries: mx.array) -> bool:
    """The same for attention's queries (B, heads, rows, dim)."""
    return prompt_tokens(queries.shape[0] * queries.shape[2])


def prompt_pairs(indices: mx.array, top_k: int) -> bool:
    """The same for MoE experts' (token, expert) pairs, each token choosing top_k experts (0: unknown, no)."""
    return _PROMPT.get() or (top_k > 0 and indices.size > DECODE_ROWS * top_k)
