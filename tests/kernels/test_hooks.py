"""Per-model routing of module-level functions: one model's modules change, nothing else does."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from mlxspec.kernels.hooks import route_functions, routed, unroute_functions


def scale(x):
    return x * 2


def other_scale(x):
    return x * 3


class Block(nn.Module):
    def __call__(self, x):
        return scale(x)


class Derived(Block):
    def __call__(self, x):
        return super().__call__(x) + 1  # super() needs the method's closure kept


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [Block(), Derived()]


def test_routes_one_model_only_and_undoes():
    x = mx.array([1.0])
    ours, theirs = Outer(), Outer()
    assert route_functions(ours, {"scale": (scale, other_scale)}) == 2
    assert [m(x).item() for m in ours.layers] == [3.0, 4.0]
    assert [m(x).item() for m in theirs.layers] == [2.0, 3.0]  # the other model: untouched
    assert Block()(x).item() == 2.0 and globals()["scale"] is scale  # the module's name: untouched
    assert routed(ours.layers[0], "scale") is other_scale and isinstance(ours.layers[1], Derived)
    assert route_functions(ours, {"scale": (scale, other_scale)}) == 0  # twice changes nothing
    unroute_functions(ours, ["scale"])
    assert [type(m) for m in ours.layers] == [Block, Derived] and [m(x).item() for m in ours.layers] == [2.0, 3.0]


def test_only_modules_calling_the_original_are_routed():
    outer = Outer()
    assert route_functions(outer, {"scale": (other_scale, scale)}) == 0  # they call `scale`, not other_scale
    assert route_functions(outer, {"absent": (scale, other_scale)}) == 0
    assert all(routed(m, "scale") is None for m in outer.layers)
