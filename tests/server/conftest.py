"""Daemon fixtures: a daemon in this process with a store of tiny models (and stories260K when present)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api_helpers import FIM_TEMPLATE
from daemon_harness import ThreadDaemon, without_chat_template
from mlxspec.server import Settings
from mlxspec.store import Manifest, Store



@pytest.fixture(scope="session")
def base_model(tiny_llama, tmp_path_factory) -> Path:
    return without_chat_template(tiny_llama, tmp_path_factory.mktemp("tiny-base") / "model")


@pytest.fixture(scope="session")
def fim_model(tiny_llama, tmp_path_factory) -> Path:
    """tiny_llama's tokenizer plus Qwen-coder's fill-in-the-middle tokens, and weights to match."""
    from transformers import AutoTokenizer

    from model_factory import write_weights

    path = tmp_path_factory.mktemp("tiny-fim")
    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    tok.add_special_tokens({"additional_special_tokens": ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]})
    tok.save_pretrained(str(path))
    config = {**json.loads((tiny_llama / "config.json").read_text()), "vocab_size": len(tok)}
    (path / "config.json").write_text(json.dumps(config))
    write_weights(path, config, seed=3, scale=0.6)
    return path


def populate(store: Store, tiny_llama: Path, base_model: Path) -> None:
    """tiny: drafted by itself (every draft accepted); the others for special cases."""
    store.save("tiny", Manifest(target=str(tiny_llama), draft=str(tiny_llama)))
    store.save("tiny-plain", Manifest(target=str(tiny_llama)))
    store.save("base", Manifest(target=str(base_model)))
    store.save("fim", Manifest(target=str(tiny_llama), template=FIM_TEMPLATE))
    store.save("broken", Manifest(target=str(base_model.parent)))  # a directory, but not a model


@pytest.fixture(scope="session")
def daemon(tiny_llama, base_model, fim_model, tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("mlxspec-home"))
    populate(store, tiny_llama, base_model)
    store.save("coder", Manifest(target=str(fim_model), draft=str(fim_model)))
    # local paths over HTTP: allowed under the test's temporary directories only
    d = ThreadDaemon(store, Settings(max_loaded=3, model_dirs=[tmp_path_factory.getbasetemp().resolve()])).start()
    yield d
    d.stop()


@pytest.fixture
def stories_model(daemon, stories) -> str:
    """stories260K drafted by its own 4-bit group-32 quantization (a real pair that mostly agrees)."""
    daemon.state.store.save("stories", Manifest(target=str(stories), draft=str(stories), draft_quantize="q4g32"))
    return "stories:latest"
