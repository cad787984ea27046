"""Kernel tests need the CPU extension; it is built once per machine (about 20 s here) and cached.

Tests of the CPU kernels run on the CPU device whatever MLX's default is (on a GPU machine too):
`cpu_ext` pins mx.cpu as the default device for each test that uses it. `pretend_cuda` serves the
GPU families as stand-ins (gpu_stand_ins.py) to test their wiring here.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from gpu_stand_ins import per_row_gather, per_row_qmm, serve
from mlxspec.kernels import layers, registry
from mlxspec.kernels.build import KernelUnavailable, load_cpu_extension


@pytest.fixture(scope="session")
def cpu_ext_module():
    try:
        return load_cpu_extension()
    except KernelUnavailable as e:  # no compiler / cmake / nanobind: the fallback tests still run
        pytest.skip(f"CPU kernel not buildable here: {e}")


@pytest.fixture
def cpu_ext(cpu_ext_module):
    default = mx.default_device()
    mx.set_default_device(mx.cpu)
    yield cpu_ext_module
    mx.set_default_device(default)


@pytest.fixture
def pretend_cuda(monkeypatch):
    """registry + layers see a CUDA backend whose qmm and gather families are the stand-ins."""
    calls = []
    serve(monkeypatch, {"qmm": lambda: per_row_qmm(calls), "gather-qmm": lambda: per_row_gather(calls)})
    monkeypatch.setattr(registry, "device_backend_name", lambda device=None: "cuda")
    monkeypatch.setattr(layers, "device_backend_name", lambda device=None: "cuda")
    yield calls
    registry.reset()
