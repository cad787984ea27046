"""/api/tags of models not loaded: what their files say without loading them."""

from __future__ import annotations

from api_helpers import post
from daemon_harness import ThreadDaemon
from mlxspec.store import Manifest, Store


def test_tags_say_gguf_for_a_gguf_model_never_loaded(tmp_path):
    """A stored model whose target is a .gguf file (a path or pypi:package/file) is listed with format
    gguf before it is loaded, as after (it was listed as safetensors until loaded)."""
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    store = Store(tmp_path / "home")
    store.save("g", Manifest(target=str(gguf)))
    store.save("p", Manifest(target="pypi:some_package/Model.Q4_0.gguf"))
    d = ThreadDaemon(store).start()
    try:
        status, body = post(d.url + "/api/tags", b"", method="GET")
    finally:
        d.stop()
    assert status == 200
    assert {m["name"]: m["details"]["format"] for m in body["models"]} == {"g:latest": "gguf", "p:latest": "gguf"}


def test_a_wrapped_model_s_facts_and_early_exit_come_from_its_text_config(tmp_path):
    """A multimodal wrapper (Gemma 3 here) keeps its sizes under text_config: read from there without loading
    (they were None), so /api/create refuses an early exit past its layers before saving it."""
    from mlx_lm_architectures import architecture_dir

    from mlxspec.server import facts

    path = architecture_dir(tmp_path / "gemma3", "gemma3")
    known = facts.from_disk(Manifest(target=str(path)), tokenizer=False)
    assert (known.architecture, known.num_layers, known.hidden_size, known.context_length) == ("gemma3", 2, 64, 1024)
    store = Store(tmp_path / "home")
    store.save("g3", Manifest(target=str(path)))
    d = ThreadDaemon(store).start()
    try:
        refused = post(d.url + "/api/create", {"model": "x", "from": "g3", "drafter": "early-exit:2", "stream": False})
        made = post(d.url + "/api/create", {"model": "y", "from": "g3", "drafter": "early-exit:1", "stream": False})
    finally:
        d.stop()
    assert refused[0] == 400 and "choose 1..1" in refused[1]["error"], refused
    assert made[0] == 200, made
