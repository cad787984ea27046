"""Ollama's blob upload (HEAD/POST /api/blobs/{digest}) and /api/create's `files`, with the official
`ollama` client: a GGUF file or a safetensors model directory imported over HTTP, as `ollama create`
does with a Modelfile's `FROM ./file`, answers exactly as the same model created `from` its path."""

from __future__ import annotations

import gzip
import hashlib
import http.client
import socket
from pathlib import Path

import ollama
import pytest

from api_helpers import post
from daemon_harness import ThreadDaemon, wait_until
from gguf_fixtures import write_tiny_llama_gguf
from mlxspec.server import Settings
from mlxspec.store import Store

GREEDY = {"temperature": 0, "num_predict": 6}
MAX_BODY = 1 << 16  # JSON bodies stay under this; uploads are streamed past it


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    path = write_tiny_llama_gguf(tmp_path_factory.mktemp("blob-gguf") / "tiny.gguf", "Q4_0")
    assert path.stat().st_size > MAX_BODY  # so its upload proves the body is streamed, not read whole
    return path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("blob-home"))
    settings = Settings(max_loaded=2, max_body=MAX_BODY, model_dirs=[tmp_path_factory.getbasetemp().resolve()])
    d = ThreadDaemon(store, settings).start()
    yield d
    d.stop()


@pytest.fixture
def client(daemon) -> ollama.Client:
    return ollama.Client(host=daemon.url)


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def head(daemon, digest: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
    try:
        conn.request("HEAD", f"/api/blobs/{digest}")
        response = conn.getresponse()
        assert response.read() == b""  # HEAD: headers only, errors too
        return response.status
    finally:
        conn.close()


def stored(daemon) -> set[str]:
    """Every file in the blob directory, temp files included."""
    root = daemon.state.store.blobs.root
    return {p.name for p in root.iterdir()} if root.is_dir() else set()


def answer(client, model: str, prompt: str = "Once upon a time") -> str:
    return client.generate(model=model, prompt=prompt, options=GREEDY).response


def test_a_gguf_uploaded_and_created_is_the_model_its_path_gives(daemon, client, gguf_file):
    digest = digest_of(gguf_file.read_bytes())
    assert head(daemon, digest) == 404
    assert client.create_blob(gguf_file) == digest
    assert head(daemon, digest) == 200
    assert head(daemon, digest.replace(":", "-").upper().replace("SHA256-", "sha256-")) == 200  # Ollama's other spelling

    client.create(model="uploaded", files={"tiny.gguf": digest}, system="Be brief.", parameters={"num_ctx": 128})
    client.create(model="by-path", from_=str(gguf_file), system="Be brief.", parameters={"num_ctx": 128})
    assert answer(client, "uploaded") == answer(client, "by-path") != ""
    status, shown = post(daemon.url + "/api/show", {"model": "uploaded"})
    assert status == 200 and shown["system"] == "Be brief." and shown["parameters"] == "num_ctx 128"
    assert shown["details"]["format"] == "gguf" and client.show("uploaded").details.family == "llama"

    target = Path(daemon.state.store.get("uploaded").target)  # a link to the blob in a folder of its own
    assert target.name == "tiny.gguf" and target.samefile(daemon.state.store.blobs.path(digest))
    assert target.parent.parent == daemon.state.store.blobs.imports


def test_a_safetensors_directory_uploaded_file_by_file(daemon, client, tiny_llama):
    files = {p.name: client.create_blob(p) for p in sorted(tiny_llama.iterdir()) if p.is_file()}
    assert {"config.json", "model.safetensors"} <= set(files)
    client.create(model="dir-uploaded", files=files)
    client.create(model="dir-by-path", from_=str(tiny_llama))
    assert answer(client, "dir-uploaded") == answer(client, "dir-by-path") != ""
    folder = Path(daemon.state.store.get("dir-uploaded").target)
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)


def test_draft_files_give_the_draft_model(daemon, client, gguf_file):
    digest = client.create_blob(gguf_file)
    client.create(model="self-drafted", files={"tiny.gguf": digest})  # the ollama client has no draft_files
    status, _ = post(daemon.url + "/api/create", {"model": "self-drafted", "files": {"tiny.gguf": digest},
                                                  "draft_files": {"draft.gguf": digest}, "stream": False})
    assert status == 200
    manifest = daemon.state.store.get("self-drafted")
    assert manifest.drafter_name == "draft-model" and Path(manifest.draft).name == "draft.gguf"
    status, reply = post(daemon.url + "/api/generate", {"model": "self-drafted", "prompt": "Once upon a time",
                                                        "options": GREEDY, "stream": False})
    plain = client.generate(model="self-drafted", prompt="Once upon a time", options={**GREEDY, "draft_num_predict": 0})
    assert status == 200 and reply["response"] == plain.response
    spec = reply["speculative"]  # the draft is the target itself: every draft accepted
    assert spec["drafter"] == "draft-model" and spec["drafted"] > 0 and spec["accepted"] == spec["drafted"]


def test_uploading_a_stored_blob_again_answers_200(daemon):
    data = b"the same bytes twice"
    assert post(daemon.url + f"/api/blobs/{digest_of(data)}", data)[0] == 201
    assert post(daemon.url + f"/api/blobs/{digest_of(data)}", data)[0] == 200


def test_a_digest_mismatch_is_a_400_and_keeps_nothing(daemon):
    before, claimed = stored(daemon), digest_of(b"what was promised")
    status, body = post(daemon.url + f"/api/blobs/{claimed}", b"what was sent")
    assert status == 400 and body["error"] == f'digest mismatch, expected "{claimed}", got "{digest_of(b"what was sent")}"'
    assert stored(daemon) == before and head(daemon, claimed) == 404


@pytest.mark.parametrize("digest", ["sha256:abc", "md5:" + "0" * 64, "sha256:" + "g" * 64, "sha256:" + "0" * 65, "nothing"])
def test_a_malformed_digest_is_a_400(daemon, digest):
    status, body = post(daemon.url + f"/api/blobs/{digest}", b"x")
    assert status == 400 and "invalid digest format" in body["error"]
    assert head(daemon, digest) == 400


def test_a_compressed_upload_is_stored_decoded(daemon):
    data = b"GGUF, but compressed on the way" * 100
    status, _ = post(daemon.url + f"/api/blobs/{digest_of(data)}", gzip.compress(data), {"Content-Encoding": "gzip"})
    assert status == 201 and daemon.state.store.blobs.path(digest_of(data)).read_bytes() == data
    status, body = post(daemon.url + f"/api/blobs/{digest_of(b'x')}", b"x", {"Content-Encoding": "compress"})
    assert status == 415 and "Content-Encoding" in body["error"] and head(daemon, digest_of(b"x")) == 404


@pytest.mark.parametrize("stored_already", [False, True])
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_body_that_does_not_decode_is_a_400_and_keeps_nothing(daemon, encoding, stored_already):
    """Content-Encoding: gzip on bytes that are not gzip was a 500 (the decoder's error, raised mid-read)."""
    data = b"bytes stored before " + encoding.encode()
    if stored_already:  # the body is still read (and must decode) when the blob is there already
        assert post(daemon.url + f"/api/blobs/{digest_of(data)}", data)[0] == 201
    before = stored(daemon)
    status, body = post(daemon.url + f"/api/blobs/{digest_of(data)}", b"not compressed at all", {"Content-Encoding": encoding})
    assert status == 400 and f"not valid {encoding} data" in body["error"], body
    assert stored(daemon) == before


def test_create_names_a_missing_blob(client):
    missing = "sha256:" + "ab" * 32
    with pytest.raises(ollama.ResponseError) as err:
        client.create(model="nope", files={"model.gguf": missing})
    assert err.value.status_code == 400 and missing in err.value.error and "model.gguf" in err.value.error


@pytest.mark.parametrize("name", ["../evil.gguf", "a/b.gguf", "..", "/etc/x.gguf", "a\\b.gguf"])
def test_file_names_that_are_paths_are_refused(client, gguf_file, name):
    digest = client.create_blob(gguf_file)
    with pytest.raises(ollama.ResponseError) as err:
        client.create(model="traversal", files={name: digest})
    assert err.value.status_code == 400 and "not a plain file name" in err.value.error


@pytest.mark.parametrize("body, words", [
    ({"from": "GGUF-PATH", "files": {"tiny.gguf": "GGUF"}}, "either from or files"),
    ({"files": {"model.gguf": "sha256:00"}}, "invalid digest format"),
    ({"files": {"notes.txt": "TEXT"}}, "no model weights"),
    ({"files": {"model.safetensors": "TEXT"}}, "needs its config.json"),
    ({"files": {"a.gguf": "GGUF", "b.safetensors": "TEXT"}}, "mix GGUF"),
    ({"files": {"a.gguf": "GGUF", "b.gguf": "GGUF"}}, "one .gguf file"),
    ({"files": {"tiny.gguf": "GGUF"}, "adapters": {"lora.gguf": "GGUF"}}, "ADAPTER (LoRA adapters) is not supported"),
    ({"from": "GGUF-PATH", "draft": "GGUF-PATH", "draft_files": {"d.gguf": "GGUF"}}, "either draft or draft_files"),
])
def test_files_that_make_no_model_are_refused(daemon, client, gguf_file, body, words):
    uploaded = {"GGUF": client.create_blob(gguf_file), "TEXT": _text_blob(client, gguf_file.parent)}
    body = {k: str(gguf_file) if v == "GGUF-PATH" else {n: uploaded.get(d, d) for n, d in v.items()}
            if isinstance(v, dict) else v for k, v in body.items()}
    status, got = post(daemon.url + "/api/create", {"model": "refused", "stream": False, **body})
    assert status == 400 and words in got["error"], got
    assert not daemon.state.store.exists("refused")


def _text_blob(client, folder: Path) -> str:
    path = folder / "notes.txt"
    path.write_text("not weights")
    return client.create_blob(path)


def test_an_upload_cut_off_leaves_nothing(daemon):
    daemon.state.store.blobs.root.mkdir(parents=True, exist_ok=True)
    before = stored(daemon)
    temps = lambda: [p for p in daemon.state.store.blobs.root.glob(".*.tmp") if p.stat().st_size > 0]  # noqa: E731
    with socket.create_connection(("127.0.0.1", daemon.port)) as sock:
        sock.sendall(f"POST /api/blobs/sha256:{'0' * 64} HTTP/1.1\r\nHost: {daemon.host}\r\n"
                     f"Content-Length: {50 << 20}\r\n\r\n".encode())
        sock.sendall(b"x" * (3 << 20))
        assert wait_until(lambda: temps())  # being written to disk as it arrives
    assert wait_until(lambda: stored(daemon) == before), stored(daemon) - before  # the client left: nothing stays


def test_deleting_the_last_model_made_of_uploads_removes_them(daemon, client, tmp_path):
    path = write_tiny_llama_gguf(tmp_path / "other.gguf", "Q8_0", seed=5)
    digest = client.create_blob(path)
    client.create(model="first", files={"other.gguf": digest})
    client.copy("first", "second")  # the same folder
    folder = Path(daemon.state.store.get("first").target).parent
    client.delete("first")
    assert folder.is_dir() and head(daemon, digest) == 200 and answer(client, "second")
    client.delete("second")
    assert not folder.exists() and head(daemon, digest) == 404  # as `ollama rm`: the model's unshared layers go
