"""The kernel registry's records: what a family's first use cost (loading, self-checks), for doctor."""

from __future__ import annotations

import time

from mlxspec.kernels import registry


def test_a_record_says_what_its_first_use_cost(monkeypatch):
    def loader(backend):
        time.sleep(0.02)  # a build, a GPU program's source
        return (lambda: None), "stand-in"

    monkeypatch.setitem(registry._loaders, "slow", loader)
    registry.reset()
    try:
        rec = registry.kernel("slow", "cpu")
        assert rec.check(("a",), lambda: time.sleep(0.03)) is None  # a first call that compiles
        assert rec.check(("a",), lambda: 1 / 0) is None  # checked once per process: not run again
        assert rec.check(("b",), lambda: 1 / 0) == "ZeroDivisionError: division by zero"
        seconds = rec.status()["seconds"]
        assert set(seconds) == {"load", "checks"} and seconds["load"] >= 0.02 and seconds["checks"] >= 0.03
    finally:
        registry.reset()
