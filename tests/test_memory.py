"""Issue 14: load/unload cycles must not grow the process (RSS comes back after an unload).

A model of many thin layers makes a per-load leak large enough to stand out of RSS noise: without
loading._settle_random_state each load kept MLX's chain of lazy PRNG keys (one per initial weight
draw), and 15 cycles of this model grew RSS by ~12 MB; with it, by 0. benchmarks/memory.py
measures SmolLM2 through the daemon's registry over 200 cycles.
"""

from __future__ import annotations

import gc

import mlx.core as mx
import pytest

from model_factory import make_model_dir
from mlxspec import loading
from mlxspec.server.registry import _free_memory

WARMUP, CYCLES = 3, 15


def rss() -> int:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except OSError:
        pytest.skip("RSS from /proc/self/status: Linux only")


@pytest.fixture(scope="module")
def many_layers(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("many-layers"), "llama", hidden=32, layers=96, heads=2,
                          kv_heads=1, intermediate=32, seed=5)


def test_load_unload_cycles_do_not_grow_memory(many_layers):
    def cycle():  # load, then what the registry does at an unload
        model = loading.load(str(many_layers))
        del model
        _free_memory()

    for _ in range(WARMUP):
        cycle()
    gc.collect()
    before, active = rss(), mx.get_active_memory()
    for _ in range(CYCLES):
        cycle()
    grown = rss() - before
    assert mx.get_active_memory() <= active  # nothing MLX holds survives an unload
    assert grown < 3 * 2**20, f"RSS grew {grown / 2**20:.1f} MB over {CYCLES} load/unload cycles"
