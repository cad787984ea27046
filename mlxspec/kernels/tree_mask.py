"""The mask of a draft tree's verify pass, as the kernels take it (tree.py builds the passes).

Row m of a tree pass is node m of the tree: its parent row is parents[m] (-1 for the root, row 0; every
other parent an earlier row). It sits at position offset + depth(m) and sees the cache, its ancestors and
itself. The fused CPU block reads `parents`; the GPU attention kernel reads `tree_rows`: each row's path as
node indices, so it can give the row exactly a one-row call over the cache and its path, in order.

    mask = TreeMask((-1, 0, 0, 1))           # an eager pass
    rows = tree_rows(mask.parents, start)    # the GPU kernel's input; start: the first node's key
    mask = TreeMask((), rows)                # a compiled pass: the structure is an input of its graph
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import mlx.core as mx

TREE_NODES = 64  # a tree pass's rows at most (tree.MAX_TREE_NODES drafts + the root)
TREE_ROW = 1 + TREE_NODES  # a row's entry in tree_rows: its path's length, then the path (node indices, root first)


@dataclass(frozen=True)
class TreeMask:
    """The mask of a verify pass over a draft tree: row m's parent row (-1 for row 0, else < m); `rows`: the
    same tree as tree_rows, where the pass is a compiled graph's (its parents are not known when it runs)."""

    parents: tuple[int, ...]
    rows: mx.array | None = field(default=None, compare=False, hash=False)

    def path(self, node: int) -> list[int]:
        """The rows from the root (0) down to `node`."""
        path = [node]
        while self.parents[path[-1]] >= 0:
            path.append(self.parents[path[-1]])
        return path[::-1]


def tree_shape_ok(parents, rows: int) -> bool:
    """A tree the kernels take: one node a row, the root first, every parent an earlier row, at most TREE_NODES."""
    return (len(parents) == rows <= TREE_NODES and parents[0] == -1
            and all(0 <= p < i for i, p in enumerate(parents) if i))


@functools.lru_cache(maxsize=64)
def tree_rows(parents: tuple[int, ...], start: int) -> mx.array:
    """The GPU attention kernel's `tree` input (int32, 1 + len(parents) * TREE_ROW): [start, then per row its
    path's length and the path's nodes, root first, padded]; start: the key of the first node (its row in the
    cache). Made once per tree pass, for all its layers."""
    if not tree_shape_ok(parents, len(parents)):
        raise ValueError(f"not a draft tree the kernels take: parents {parents}")
    out, tree = [start], TreeMask(parents)
    for node in range(len(parents)):
        path = tree.path(node)
        out += [len(path)] + path + [0] * (TREE_ROW - 1 - len(path))
    rows = mx.array(out, mx.int32)
    mx.eval(rows)
    return rows
