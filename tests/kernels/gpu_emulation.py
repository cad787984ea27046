"""A GPU as far as exactness goes, on this CPU: the kernels' GPU wiring with row-invariant stand-ins,
and MLX's row-sensitive ops made to change with the row count.

On a GPU, MLX's matmul, quantized and gather matmuls, attention and convolution choose their arithmetic by the
number of rows (measured on an H100: benchmarks/results/gpu_h100.md), so a verify pass's row i need
not equal a one-row step. `emulate_gpu(monkeypatch)` makes those ops scale their result by
1 + 1% per row beyond the first (a one-row call is unchanged), and makes the registry serve
CUDA's kernel families as stand-ins that compute each row alone. A model whose decoding step still
reaches one of MLX's ops with several rows then fails RowInvariance here, as it would on the device:
on an H200 (2026-11-27) a Gemma 4 and a Qwen3.5 GGUF did, and llama-family models did not.
"""

from __future__ import annotations

import contextlib
import threading

import mlx.core as mx

from gpu_stand_ins import per_row_gather, per_row_qmm, serve
from mlxspec.kernels.build import KernelUnavailable

DRIFT = 0.01  # per row beyond the first: more than a bfloat16 rounding, so no varied result hides


_REFERENCE = threading.local()  # depth of mx.stream(...) blocks: the kernels' references run inside one


def _in_reference() -> bool:
    return getattr(_REFERENCE, "depth", 0) > 0


def _counting_stream(stream):
    @contextlib.contextmanager
    def counted(s):
        with stream(s):
            _REFERENCE.depth = getattr(_REFERENCE, "depth", 0) + 1
            try:
                yield
            finally:
                _REFERENCE.depth -= 1
    return counted


def _rows_of_matrix(a: mx.array) -> int:
    return a.size // a.shape[-1] if a.ndim >= 2 and a.shape[-1] else 1


def _drifting(op, rows_of):
    def wrapper(*args, **kwargs):
        y = op(*args, **kwargs)
        rows = rows_of(*args, **kwargs)
        if rows <= 1 or _in_reference() or not mx.issubdtype(y.dtype, mx.floating):
            return y
        return y * mx.array(1 + DRIFT * (rows - 1), y.dtype)
    return wrapper


def per_row_dense(calls: list):
    """A stand-in GPU dense matmul: x @ w.T one row at a time in float32 (row-invariant by construction)."""
    from mlxspec.kernels.reference import dense_reference

    def dense(x, w):
        calls.append(("dense", x.shape))
        rows = x.reshape(-1, x.shape[-1])
        y = mx.concatenate([dense_reference(rows[i : i + 1], w) for i in range(rows.shape[0])])
        return y.reshape(*x.shape[:-1], -1)

    return dense


def tree_sdpa(sdpa):
    """The CPU attention kernel taking draft trees as the GPU kernel does (a stand-in): row m as a one-row call
    over the keys before the tree's nodes and its path's (tree_mask.tree_rows), gathered with MLX's ops of
    fixed shapes, so it runs in a compiled pass's graph too (the tree and the keys that count are inputs)."""
    from mlxspec.kernels.tree_mask import TREE_ROW

    def attend(q, k, v, scale, causal, window=0, tree=None, length=None, **kw):
        if tree is None:
            return sdpa(q, k, v, scale, causal, window=window, **({"length": length} if length is not None else {}), **kw)
        start, j, rows = tree[0], mx.arange(k.shape[2]), []
        for m in range(q.shape[2]):
            n, path = tree[1 + m * TREE_ROW], tree[2 + m * TREE_ROW : (m + 1) * TREE_ROW + 1]
            node = start + mx.take(path, mx.clip(j - start, 0, TREE_ROW - 2))
            seen = mx.where(j < start, j, mx.where(j < start + n, node, 0))  # the row's keys, in order, first
            rows.append(sdpa(q[:, :, m : m + 1], mx.take(k, seen, axis=2), mx.take(v, seen, axis=2), scale, True,
                             length=(start + n).reshape(1), **kw))
        return mx.concatenate(rows, axis=2)

    for name in ("windows", "sinks", "lengths", "mixed", "softcaps", "isa"):
        if hasattr(sdpa, name):
            setattr(attend, name, getattr(sdpa, name))
    attend.trees = True
    return attend


def _unavailable():
    raise KernelUnavailable("no stand-in: MLX's op (as where this kernel fails on a device)")


def emulate_gpu(monkeypatch, backend: str = "cuda", without: tuple = ()) -> list:
    """The kernels see a `backend` GPU served by stand-ins, but for the families `without` names (unavailable, as
    where a kernel fails on a device); MLX's row-sensitive ops drift with the row count (outside the kernels'
    float32 references, which run in an mx.stream block). Returns the stand-ins' call log."""
    from mlxspec.kernels import accept, install, layers, registry, timing
    from mlxspec.kernels.cpu import cpu_sdpa_function

    calls: list = []
    sdpa = tree_sdpa(cpu_sdpa_function())  # the CPU attention kernel: row-invariant, with windows, lengths, sinks, trees
    families = {"qmm": lambda: per_row_qmm(calls), "gather-qmm": lambda: per_row_gather(calls),
                "dense": lambda: per_row_dense(calls), "sdpa": lambda: sdpa}
    if unknown := set(without) - set(families):
        raise ValueError(f"no stand-in to take away: {sorted(unknown)} (there are {', '.join(families)})")
    serve(monkeypatch, families | dict.fromkeys(without, _unavailable) | {"qmm-mma": _unavailable,
                                                                           "accept": _unavailable})
    monkeypatch.setenv("MLXSPEC_COMPILE", "1")  # decoding steps as compiled graphs, a GPU's default
    for module in (registry, layers, install, timing, accept):
        monkeypatch.setattr(module, "device_backend_name", lambda device=None: backend)
    monkeypatch.setattr(mx, "stream", _counting_stream(mx.stream))  # references (reference.on_cpu) stay exact
    matrix = lambda a, *rest, **kw: _rows_of_matrix(a)  # noqa: E731
    monkeypatch.setattr(mx, "quantized_matmul", _drifting(mx.quantized_matmul, matrix))
    monkeypatch.setattr(mx, "gather_qmm", _drifting(mx.gather_qmm, matrix))
    monkeypatch.setattr(mx, "gather_mm", _drifting(mx.gather_mm, matrix))
    monkeypatch.setattr(mx, "matmul", _drifting(mx.matmul, matrix))
    monkeypatch.setattr(mx.array, "__matmul__", _drifting(mx.array.__matmul__, matrix))
    monkeypatch.setattr(mx, "addmm", _drifting(mx.addmm, lambda c, a, *rest, **kw: _rows_of_matrix(a)))
    monkeypatch.setattr(mx, "conv1d", _drifting(mx.conv1d, lambda x, *rest, **kw: x.shape[1]))
    monkeypatch.setattr(mx, "conv_general", _drifting(mx.conv_general, lambda x, *rest, **kw: x.shape[1]))
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention",
                        _drifting(mx.fast.scaled_dot_product_attention, lambda q, *rest, **kw: q.shape[2]))
    return calls
