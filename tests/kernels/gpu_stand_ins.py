"""Stand-ins for the GPU kernels on this CPU (no GPU here): the definition, one row at a time, so
row-invariant by construction; `serve` makes the registry load them (`pretend_cuda` in conftest.py: as CUDA's)."""

from __future__ import annotations

import mlx.core as mx

from mlxspec.kernels.reference import qmm_reference


def per_row_qmm(calls: list):
    """A stand-in GPU qmm: the definition (float32 MLX) one row at a time (row-invariant by construction)."""

    def qmm(x, w, scales, biases, group_size, bits, mode="affine"):
        calls.append(("qmm", mode))
        rows = x.reshape(-1, x.shape[-1])
        y = mx.concatenate([qmm_reference(rows[i : i + 1], w, scales, biases, group_size, bits, mode)
                            for i in range(rows.shape[0])])
        return y.reshape(*x.shape[:-1], -1)

    return qmm


def per_row_gather(calls: list, wrong: bool = False):
    """A stand-in GPU gather: row p times expert indices[p] (wrong=True: always expert 0)."""

    def gather(x, w, scales, biases, indices, group_size, bits, mode="affine"):
        calls.append(("gather", mode))
        out = []
        for p in range(indices.size):  # the expert as an array, never read back: a compiled step can trace it
            e = mx.array(0) if wrong else indices[p]
            out.append(qmm_reference(x[p : p + 1], w[e], scales[e], None if biases is None else biases[e],
                                     group_size, bits, mode))
        return mx.concatenate(out)

    return gather


def grouping_gather(calls: list, drift: float = 0.0):
    """A stand-in gather with the grouped path (groups_experts): records per_expert; drift != 0 makes
    the grouped path's rows differ from the gather's (as a kernel with another summation order would)."""
    inner = per_row_gather([])

    def gather(x, w, scales, biases, indices, group_size, bits, mode="affine", per_expert=1):
        calls.append(("per_expert", per_expert))
        y = inner(x, w, scales, biases, indices, group_size, bits, mode)
        return y * (1 + drift) if per_expert > 1 else y

    gather.groups_experts = True
    return gather


def serve(monkeypatch, families: dict) -> None:
    """The registry loads each family (name -> a factory of its stand-in, or (factory, detail)) from these,
    with fresh records; the detail defaults to "stand-in"."""
    from mlxspec.kernels import registry

    loaders = dict(registry._loaders)
    for family, make in families.items():
        make, detail = make if isinstance(make, tuple) else (make, "stand-in")
        loaders[family] = lambda backend, make=make, detail=detail: (make(), detail)
    monkeypatch.setattr(registry, "_loaders", loaders)
    registry.reset()
