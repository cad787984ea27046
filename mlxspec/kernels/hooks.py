"""Per-model routing of the module-level functions mlx-lm's layers call (attention, swiglu).

mlx-lm's Attention and MLP modules call `scaled_dot_product_attention(...)` and `swiglu(...)`, names
their model file imported at module level. Rebinding those names would change every model in the
process, mlx-lm's own included. Instead each module instance of *this* model that calls one gets a
subclass of its own class (made once per class and routing) whose methods see our function under
that name; nothing in mlx-lm changes and other models are untouched.

    route_functions(model, {"swiglu": (mlx_lm_swiglu, kernel_swiglu)})   # -> number of modules routed
    unroute_functions(model, ["swiglu"])                                  # their own classes again
"""

from __future__ import annotations

import inspect
import types
from typing import Callable

import mlx.nn as nn

_ORIGIN = "_mlxspec_routed_from"  # class attribute: the class a routed subclass was made from
_ROUTES = "_mlxspec_routes"  # class attribute: {name: replacement} the subclass applies
_classes: dict[tuple, type] = {}


def route_functions(model: nn.Module, routes: dict[str, tuple[Callable, Callable]]) -> int:
    """For every module of `model` whose methods call a global `name` bound to `original`, route
    that name to `replacement`: routes = {name: (original, replacement)}. Returns modules routed."""
    count = 0
    for _, module in model.named_modules():
        base = getattr(type(module), _ORIGIN, type(module))
        current = dict(getattr(type(module), _ROUTES, {}))
        wanted = dict(current)
        for name, (original, replacement) in routes.items():
            if _calls(base, name, original):
                wanted[name] = replacement
        if wanted != current:
            module.__class__ = _routed_class(base, wanted)
            count += 1
    return count


def unroute_functions(model: nn.Module, names: list[str]) -> None:
    """Undo route_functions for these names (modules keep any other routes)."""
    for _, module in model.named_modules():
        base = getattr(type(module), _ORIGIN, None)
        if base is None:
            continue
        kept = {n: f for n, f in getattr(type(module), _ROUTES).items() if n not in names}
        module.__class__ = _routed_class(base, kept) if kept else base


def swap_classes(model: nn.Module, classes: dict[type, type]) -> int:
    """Give each module of `model` whose class is a key of `classes` that key's value (a subclass: same parameters,
    same names); returns how many. This model's instances only."""
    swapped = 0
    for _, m in model.named_modules():
        if type(m) in classes:
            m.__class__ = classes[type(m)]
            swapped += 1
    return swapped


def routed(module: nn.Module, name: str) -> Callable | None:
    """The function `name` is routed to in this module (None: the class's own)."""
    return getattr(type(module), _ROUTES, {}).get(name)


def _ancestors(cls: type):
    """The class and its bases below nn.Module, most derived first."""
    for klass in cls.__mro__:
        if klass in (nn.Module, dict, object):
            break
        yield klass


def _own_methods(klass: type):
    return [(attr, f) for attr, f in vars(klass).items() if inspect.isfunction(f)]


def _calls(cls: type, name: str, original: Callable) -> bool:
    return any(name in f.__code__.co_names and f.__globals__.get(name) is original
               for klass in _ancestors(cls) for _, f in _own_methods(klass))


def _routed_class(base: type, routes: dict[str, Callable]) -> type:
    """A subclass of `base` whose methods, and those of every ancestor it reaches through super(),
    see `routes`: each ancestor that calls a routed name gets a routed twin placed right after it
    in the MRO (C, routed B, B, routed A, A), so `super()` inside a method lands on a routed twin."""
    key = (base, tuple(sorted((n, id(f)) for n, f in routes.items())))
    if key not in _classes:
        twins = tuple(_twin(klass, routes) for klass in list(_ancestors(base))[1:] if _rebinds(klass, routes))
        body = {_ORIGIN: base, _ROUTES: dict(routes), "__module__": base.__module__,
                **{attr: _rebound(f, routes) for attr, f in _own_methods(base) if _uses(f, routes)}}
        _classes[key] = type(base.__name__, (base, *twins), body)
    return _classes[key]


def _twin(klass: type, routes: dict[str, Callable]) -> type:
    body = {"__module__": klass.__module__,
            **{attr: _rebound(f, routes) for attr, f in _own_methods(klass) if _uses(f, routes)}}
    return type(klass.__name__, (klass,), body)


def _uses(f, routes) -> bool:
    return any(n in f.__code__.co_names for n in routes)


def _rebinds(klass: type, routes) -> bool:
    return any(_uses(f, routes) for _, f in _own_methods(klass))
def _rebound(f: types.FunctionType, routes: dict[str, Callable]) -> types.FunctionType:
    """The same code and closure (so super() still works) over a copy of its globals with our names."""
    g = dict(f.__globals__)
    g.update(routes)
    new = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, f.__closure__)
    new.__kwdefaults__, new.__qualname__, new.__doc__ = f.__kwdefaults__, f.__qualname__, f.__doc__
    return new
