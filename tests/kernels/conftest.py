"""Kernel tests need the CPU extension; it is built once per machine (about 20 s here) and cached."""

from __future__ import annotations

import pytest

from mlxspec.kernels.build import KernelUnavailable, load_cpu_extension


@pytest.fixture(scope="session")
def cpu_ext():
    try:
        return load_cpu_extension()
    except KernelUnavailable as e:  # no compiler / cmake / nanobind: the fallback tests still run
        pytest.skip(f"CPU kernel not buildable here: {e}")
