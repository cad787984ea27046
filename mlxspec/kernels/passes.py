"""Which passes the row-invariant kernels take on a GPU: decoding passes, not prompt chunks.

A decoding pass (a one-row step, a chain's k+1 rows, a tree's nodes) must compute each row as a
one-row step does, so it takes the kernels. A prompt chunk need not: plain and speculative decoding
feed a prompt in the same chunks (cache.prefill), so any op gives both the same bits. On GPUs MLX's
own ops (tensor-core GEMMs, flash attention) are far faster at hundreds of rows: an 8B-shape llama's
512-row chunk took 334 ms with them and 1266 ms with the kernels on an H100 (bench_gpu.py forward,
benchmarks/results/gpu_h100.md). So there a pass of more rows than any decoding pass has runs MLX's
ops. The CPU kernels keep every pass (on the CPU they are the faster ones). MoE experts see
(token, expert) pairs, sorted by expert in larger passes, so they count tokens by the model's top-k.
"""

from __future__ import annotations

import mlx.core as mx

DECODE_ROWS = 64  # the most rows a decoding pass has: a tree's 63 drafts and its root (tree.MAX_TREE_NODES)


def prompt_chunk(x: mx.array) -> bool:
    """Is x (..., K) a prompt chunk's activations: more rows than any decoding pass has?"""
    return x.size > DECODE_ROWS * x.shape[-1]


def prompt_queries(queries: mx.array) -> bool:
    """The same for attention's queries (B, heads, rows, dim)."""
    return queries.shape[0] * queries.shape[2] > DECODE_ROWS


def prompt_pairs(indices: mx.array, top_k: int) -> bool:
    """The same for MoE experts' (token, expert) pairs, each token choosing top_k experts (0: unknown, no)."""
    return top_k > 0 and indices.size > DECODE_ROWS * top_k
