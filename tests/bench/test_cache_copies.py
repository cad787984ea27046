"""benchmarks/cache_copies.py, run small on this CPU before device minutes go to it: the engine's
plain steps write the KV cache in place here, and a step that copies it shows."""

from __future__ import annotations

import pytest

from benchmark_scripts import load
from mlxspec.engine import Engine


@pytest.fixture(scope="module")
def script():
    return load("cache_copies")


def test_plain_steps_write_the_cache_in_place(script, tiny_llama):
    """Synchronous steps. (Pipelined ones of a model this small race the step before them, which may
    still hold the buffer: sometimes a copy. SmolLM2 at 3,000 positions copied nothing either way.)"""
    engine = Engine.load(str(tiny_llama), quantize="q4g32")
    report = script.run(engine, context=600, steps=4, pipelined=False)
    assert report["cache_mb"] > 0
    assert report["copies"] is False and report["peak_above_start_mb"] < report["layer_mb"], report
    assert script.run(engine, context=600, steps=4, pipelined=True)["pipelined"] is True


def test_a_step_that_copies_the_cache_shows(script, tiny_llama, monkeypatch):
    engine = Engine.load(str(tiny_llama), quantize="q4g32")
    forward = engine.steps

    held = []

    def copying(x, cache):  # every step's buffers held elsewhere: MLX's update copies them (a failed donation)
        held.extend(a for c in cache for a in (c.keys, c.values))
        return forward(x, cache)

    monkeypatch.setattr(engine, "steps", copying)
    assert script.run(engine, context=600, steps=4, pipelined=False)["copies"] is True
