"""The blob store (mlxspec/blobs.py) and the store's care of it: uploads kept only whole and matching, model
folders of uploaded files shared and removed with their last model, and what a kill -9 leaves cleaned."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from mlxspec.blobs import BlobFilesError, DigestMismatchError, InvalidDigestError, parse_digest
from mlxspec.store import Manifest, Store


def upload(store: Store, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blob = store.blobs.upload(digest)
    blob.write(data[:3])
    blob.write(data[3:])
    blob.commit()
    return digest


def aged(path, seconds: float = 600) -> None:
    os.utime(path, (time.time() - seconds, time.time() - seconds))


def test_digests_as_ollama_takes_them():
    hexes = "AB" * 32
    assert parse_digest("sha256:" + hexes) == parse_digest("sha256-" + hexes) == hexes.lower()
    for bad in ("sha256:" + "ab" * 31, "sha512:" + hexes, "sha256:" + hexes + "\n", "", None, "../../etc/passwd"):
        with pytest.raises(InvalidDigestError, match="invalid digest format"):
            parse_digest(bad)


def test_an_upload_is_kept_only_when_its_digest_matches(tmp_path):
    store = Store(tmp_path)
    digest = upload(store, b"GGUF and more")
    assert store.blobs.path(digest).read_bytes() == b"GGUF and more"
    blob = store.blobs.upload("sha256:" + "0" * 64)
    blob.write(b"something else")
    with pytest.raises(DigestMismatchError, match='digest mismatch, expected "sha256:0000'):
        blob.commit()
    blob.discard()
    assert sorted(p.name for p in store.blobs.root.iterdir()) == [store.blobs.path(digest).name]


def test_a_gguf_without_its_suffix_is_found_by_its_bytes(tmp_path):
    store = Store(tmp_path)
    target = store.blobs.model_from_files({"model": upload(store, b"GGUF\x03\x00\x00\x00")})
    assert target.name == "model.gguf" and target.read_bytes().startswith(b"GGUF")
    with pytest.raises(BlobFilesError, match="no model weights"):
        store.blobs.model_from_files({"model": upload(store, b"not a gguf")})


def test_folders_are_shared_and_go_with_their_last_model(tmp_path):
    store = Store(tmp_path)
    files = {"config.json": upload(store, b"{}"), "model.safetensors": upload(store, b"weights")}
    folder = store.blobs.model_from_files(files)
    assert store.blobs.model_from_files(dict(reversed(files.items()))) == folder  # the same files, the same folder
    store.save("a", Manifest(target=str(folder)))
    store.copy("a", "b")
    store.delete("a")
    assert folder.is_dir()
    store.save("b", Manifest(target=str(folder), system="still the same folder"))
    assert folder.is_dir()
    store.save("b", Manifest(target=str(tmp_path)))  # replaced by another model: the folder and its blobs go
    assert not folder.exists() and not any(store.blobs.exists(d) for d in files.values())


def test_a_blob_another_folder_links_stays(tmp_path):
    store = Store(tmp_path)
    shared = upload(store, b"GGUF shared")
    one = store.blobs.model_from_files({"one.gguf": shared})
    two = store.blobs.model_from_files({"two.gguf": shared})
    store.save("one", Manifest(target=str(one)))
    store.save("two", Manifest(target=str(two)))
    store.delete("one")
    assert not one.parent.exists() and store.blobs.exists(shared) and two.read_bytes() == b"GGUF shared"


def test_clean_leftovers_takes_what_a_kill_leaves(tmp_path):
    store = Store(tmp_path)
    digest = upload(store, b"GGUF kept")
    used = store.blobs.model_from_files({"used.gguf": digest})
    store.save("used", Manifest(target=str(used)))
    orphan = store.blobs.model_from_files({"orphan.gguf": digest}).parent  # a create killed before its manifest
    half_upload = store.blobs.upload("sha256:" + "1" * 64).tmp  # a kill -9 mid-upload
    half_folder = store.blobs.imports / ".k9x.tmp"
    half_folder.mkdir()
    fresh = store.blobs.upload("sha256:" + "2" * 64).tmp  # another process's upload, now
    for path in (used.parent, orphan, half_upload, half_folder):
        aged(path)
    removed = set(store.clean_leftovers())
    assert removed == {orphan, half_upload, half_folder}
    assert used.is_file() and fresh.exists() and store.blobs.exists(digest)  # blobs stay: a create may come
