"""Ollama's model store read in place (mlxspec.ollama_store, Store and loading): names, listing, layers,
parameters, the Python API, bad references, and the store left byte-identical after everything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fake_ollama import GO_TEMPLATE, IMAGE, add_model, blob_of, snapshot
from gguf_fixtures import write_tiny_llama_gguf
from mlxspec import loading
from mlxspec.engine import Engine
from mlxspec.errors import MlxspecError, ModelLoadError, ModelNotFoundError
from mlxspec.ollama_store import OllamaName, OllamaNameError, OllamaStore, default_root, split_parameters
from mlxspec.options import GenerateOptions
from mlxspec.store import InvalidNameError, Manifest, ReadOnlyError, Store

SYSTEM = "You answer in one word."
PARAMS = {"stop": ["<|im_end|>"], "num_predict": 5, "temperature": 0, "mirostat": 2, "num_gpu": 1}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "Q4_0")


@pytest.fixture
def root(tmp_path, gguf_file) -> Path:
    """A fake store: tiny (all layers), tiny:bare (weights only), a namespaced and a hosted model."""
    root = tmp_path / "ollama"
    add_model(root, "tiny", gguf_file, system=SYSTEM, params=PARAMS, license="MIT, for tests")
    add_model(root, "tiny", gguf_file, "bare", template=None)
    add_model(root, "other", gguf_file, "v1", namespace="someone")
    add_model(root, "Tiny-GGUF", gguf_file, "Q4_0", namespace="org", host="hf.co")
    return root


@pytest.fixture
def store(tmp_path, root) -> Store:
    return Store(tmp_path / "home", ollama_models=root)


def test_names_follow_ollamas_grammar():
    assert OllamaName.parse("ollama:llama3.2").parts == ("registry.ollama.ai", "library", "llama3.2", "latest")
    assert OllamaName.parse("ollama:someone/m:v1").display == "someone/m:v1"
    full = OllamaName.parse("ollama:registry.ollama.ai/library/qwen3:0.6b")
    assert full.display == "qwen3:0.6b" and full.reference == "ollama:qwen3:0.6b"
    hosted = OllamaName.parse("OLLAMA:hf.co/org/Tiny-GGUF:Q4_K_M")
    assert hosted.parts == ("hf.co", "org", "Tiny-GGUF", "Q4_K_M") and hosted.reference == "ollama:hf.co/org/Tiny-GGUF:Q4_K_M"
    assert OllamaName.parse("ollama:localhost:5000/ns/m:t").host == "localhost:5000"
    for bad in ("ollama:", "ollama:../../etc/passwd", "ollama:a b", "ollama:m:", "ollama:x/.hidden", "ollama:a/b/c/d/e"):
        with pytest.raises(OllamaNameError):
            OllamaName.parse(bad)


def test_default_root_per_os(tmp_path, monkeypatch):
    assert default_root({"OLLAMA_MODELS": f" '{tmp_path}' "}) == tmp_path  # quotes and spaces trimmed, as Ollama
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_root({}, "darwin") == tmp_path / ".ollama" / "models"
    service = tmp_path / "usr-share-ollama"
    service.mkdir()
    monkeypatch.setattr("mlxspec.ollama_store.SYSTEM_SERVICE_ROOT", service)
    assert default_root({}, "linux") == service  # the system service's store, when the user has none
    assert default_root({}, "darwin") == tmp_path / ".ollama" / "models"
    (tmp_path / ".ollama" / "models").mkdir(parents=True)
    assert default_root({}, "linux") == tmp_path / ".ollama" / "models"  # a user install comes first


def test_list_marks_ollama_models_and_keeps_mlxspec_names_apart(store, root, gguf_file):
    store.save("tiny", Manifest(target=str(gguf_file)))  # the same name in mlxspec's store
    entries = {e.name: e for e in store.list()}
    assert set(entries) == {"tiny:latest", "ollama:tiny:latest", "ollama:tiny:bare", "ollama:someone/other:v1",
                            "ollama:hf.co/org/Tiny-GGUF:Q4_0"}
    ours, theirs = entries["tiny:latest"], entries["ollama:tiny:latest"]
    assert ours.source == "mlxspec" and theirs.source == "ollama"
    manifest_bytes = (root / "manifests/registry.ollama.ai/library/tiny/latest").read_bytes()
    assert theirs.digest == "sha256:" + __import__("hashlib").sha256(manifest_bytes).hexdigest()  # as Ollama's ID
    assert theirs.size == sum(x["size"] for x in [*json.loads(manifest_bytes)["layers"], json.loads(manifest_bytes)["config"]])
    assert theirs.details["quantization_level"] == "Q4_0" and theirs.details["family"] == "llama"
    # the explicit prefix decides which store a name means; a bare name never falls through to Ollama's
    assert store.resolve("tiny")[1].target == str(gguf_file)
    assert store.resolve("ollama:tiny")[1].target == "ollama:tiny:latest"
    with pytest.raises(ModelNotFoundError, match="Ollama's store has it: use ollama:someone/other:v1"):
        store.get("someone/other:v1")
    with pytest.raises(ModelNotFoundError, match="Ollama's store has it: use ollama:tiny:bare"):
        store.pull_manifest("tiny:bare")


def test_layers_become_the_manifest(store):
    name, manifest = store.named("ollama:registry.ollama.ai/library/tiny:latest")
    assert name == "ollama:tiny:latest" and manifest.target == name
    assert manifest.system == SYSTEM and manifest.template == GO_TEMPLATE  # translated where it renders
    assert manifest.parameters == {"stop": ["<|im_end|>"], "num_predict": 5, "temperature": 0}
    assert manifest.options().max_tokens == 5 and manifest.options({"num_predict": 2}).max_tokens == 2
    contents = store.ollama_contents("ollama:tiny")
    assert contents.template.startswith("{{- range .Messages }}") and contents.license == ["MIT, for tests"]
    assert store.named("ollama:tiny:bare")[1] == Manifest(target="ollama:tiny:bare")
    assert store.named("ollama:HF.CO/org/tiny-gguf:q4_0")[0] == "ollama:hf.co/org/Tiny-GGUF:Q4_0"  # case as on disk


def test_a_template_outside_the_translated_subset_leaves_the_ggufs(tmp_path, gguf_file):
    from mlxspec.ollama_store import template_note

    root = tmp_path / "ollama"
    add_model(root, "tools", gguf_file, template="{{ range .Tools }}{{ .Function.Name }}{{ end }}{{ .Prompt }}")
    manifest = Store(tmp_path / "home", ollama_models=root).named("ollama:tools")[1]
    assert manifest.template is None  # the GGUF's own chat template stays in force
    assert "not translated" in template_note("{{ range .Tools }}{{ end }}")
    assert "translated to Jinja" in template_note(GO_TEMPLATE)


def test_parameters_split_into_options_and_the_rest():
    applied, ignored = split_parameters({"stop": ["x"], "top_k": 20, "num_ctx": 64, "mirostat": 2, "num_gpu": 9, "top_p": 7})
    assert applied == {"stop": ["x"], "top_k": 20, "num_ctx": 64}
    assert set(ignored) == {"mirostat", "num_gpu", "top_p"} and "top_p" in ignored["top_p"]
    GenerateOptions.from_dict(applied)  # what is applied is valid


def test_the_python_api_loads_ollama_references(store, root, gguf_file, monkeypatch):
    want = Engine.load(str(gguf_file), kernels=False)
    ids = want.chat_prompt([{"role": "user", "content": "hello"}])
    expected = [t for e in want.generate(ids, GenerateOptions(max_tokens=6)) for t in e.tokens]

    engine = store.load_engine(store.get("ollama:tiny"))
    assert engine.target.reference == "ollama:tiny:latest" and engine.target.path.name.startswith("sha256-")
    assert [t for e in engine.generate(ids, GenerateOptions(max_tokens=6)) for t in e.tokens] == expected
    # no store given: OLLAMA_MODELS is read where the Python API is entered (loading.load)
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    monkeypatch.setenv("MLXSPEC_HOME", str(root.parent / "home2"))
    assert loading.load("ollama:someone/other:v1").path == engine.target.path
    assert Engine.load("ollama:tiny", draft="ollama:tiny:bare", kernels=False).info["drafter"] == "draft-model"
    assert not (root / "ollama-verified.json").exists() and (root.parent / "home2" / "ollama-verified.json").exists()


def test_the_weights_are_hashed_once_and_checked_after(store, root, tmp_path, monkeypatch):
    import mlxspec.ollama_store as module

    calls = []
    real = module._sha256_file
    monkeypatch.setattr(module, "_sha256_file", lambda p: calls.append(p) or real(p))
    assert store.ollama.model_blob("ollama:tiny") == Store(tmp_path / "home", ollama_models=root).ollama.model_blob("ollama:tiny")
    assert len(calls) == 1  # remembered in MLXSPEC_HOME, across Store instances
    blob = blob_of(root, root / "manifests/registry.ollama.ai/library/tiny/latest", IMAGE + "model")
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes (a new mtime too)
    blob.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="does not match the manifest"):
        store.ollama.model_blob("ollama:tiny")


@pytest.mark.parametrize("damage, words", [
    ("missing tag", ["ollama:tiny:7b not found", "tiny has tag(s) bare, latest"]),
    ("missing model", ["ollama:nothing:latest not found", "ollama pull nothing:latest"]),
    ("missing blob", ["is missing from", "ollama pull tiny:latest"]),
    ("model digest", ["does not match the manifest", "sha256 differs"]),
    ("model size", ["does not match the manifest", "the manifest says"]),
    ("system digest", ["does not match the manifest", "vnd.ollama.image.system"]),
    ("broken manifest", ["not valid JSON"]),
])
def test_bad_references_are_clear_errors(store, root, damage, words):
    manifest = root / "manifests/registry.ollama.ai/library/tiny/latest"
    name = {"missing tag": "ollama:tiny:7b", "missing model": "ollama:nothing"}.get(damage, "ollama:tiny")
    if damage == "missing blob":
        blob_of(root, manifest, IMAGE + "model").unlink()
    elif damage in ("model digest", "system digest"):
        blob = blob_of(root, manifest, IMAGE + ("model" if damage == "model digest" else "system"))
        blob.write_bytes(blob.read_bytes()[:-1] + b"!")
    elif damage == "model size":
        with open(blob_of(root, manifest, IMAGE + "model"), "ab") as f:
            f.write(b"\0")
    elif damage == "broken manifest":
        manifest.write_text("{not json")
    with pytest.raises(MlxspecError) as err:
        store.load_engine(store.named(name)[1])
    assert all(w in str(err.value) for w in words), str(err.value)
    assert isinstance(err.value, ModelNotFoundError) == (damage in ("missing tag", "missing model"))  # 404 vs 400
    assert "ollama:tiny:latest" in {e.name for e in store.list()} or damage == "broken manifest"


@pytest.mark.parametrize("kind, words", [
    ("projector", "vision projector"), ("adapter", "LoRA adapter"), ("messages", "MESSAGE history"),
])
def test_layers_mlxspec_cannot_honour_are_refused_by_name(root, store, gguf_file, kind, words):
    add_model(root, "vision", gguf_file, extra=[(IMAGE + kind, b"\0" * 64)])
    with pytest.raises(ModelLoadError, match=words):
        store.named("ollama:vision")


def test_unsupported_gguf_types_keep_the_loaders_error(root, store, tmp_path):
    iq = write_tiny_llama_gguf(tmp_path / "iq.gguf", "Q4_0", type_overrides={"blk.0.ffn_down.weight": "IQ2_XXS"})
    add_model(root, "iq", iq)
    with pytest.raises(ModelLoadError) as err:
        store.load_engine(store.get("ollama:iq"))
    assert str(err.value).startswith("ollama:iq:latest: ") and "IQ2_XXS" in str(err.value)


def test_the_snapshot_sees_any_change(root):
    import os
    import time

    before = snapshot(root)
    manifest = root / "manifests/registry.ollama.ai/library/tiny/latest"
    os.utime(manifest, ns=(0, manifest.stat().st_mtime_ns + 1))  # same bytes, rewritten
    assert snapshot(root) != before
    before = snapshot(root)
    time.sleep(0.05)  # past the file system's timestamp tick
    (root / "blobs" / ".tmp").write_bytes(b"")
    (root / "blobs" / ".tmp").unlink()  # created and removed: the directory's mtime tells
    assert snapshot(root) != before


def test_mlxspec_never_writes_into_ollamas_store(store, root, gguf_file):
    before = snapshot(root)
    with pytest.raises(ReadOnlyError, match="ollama rm tiny:latest"):
        store.delete("ollama:tiny")
    for name in ("ollama:tiny", "ollama:new", "ollama"):
        with pytest.raises(InvalidNameError, match="only reads"):
            store.save(name, Manifest(target=str(gguf_file)))
    assert store.pull("ollama:tiny") == "ollama:tiny:latest"  # nothing to fetch, nothing written
    with pytest.raises(ModelNotFoundError, match="ollama pull"):
        store.pull("ollama:absent")
    assert store.copy("ollama:tiny", "mine") == "mine:latest"  # a copy lands in mlxspec's store
    assert store.get("mine") == store.get("ollama:tiny")
    store.delete("mine")
    store.list(), store.entry("ollama:tiny"), store.exists("ollama:tiny:bare")
    store.load_engine(store.get("ollama:tiny"))
    store.clean_leftovers(min_age=0)
    assert snapshot(root) == before
    assert not store.exists("ollama:absent") and Store(store.home).list() == []  # no Ollama store: none listed
    with pytest.raises(ModelNotFoundError, match="OLLAMA_MODELS"):
        Store(store.home).get("ollama:tiny")
