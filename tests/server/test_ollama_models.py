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
