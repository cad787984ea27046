"""A fake Ollama model store on disk, in Ollama's exact layout, and a snapshot to prove it unchanged.

ROOT/manifests/HOST/NAMESPACE/MODEL/TAG is the manifest (Docker v2 schema, as Ollama writes it);
each layer and the config are ROOT/blobs/sha256-<hex>, named by the sha256 of their bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

IMAGE = "application/vnd.ollama.image."
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"

# An Ollama (Go text/template) ChatML template, as Ollama's library ships for Qwen-style models.
GO_TEMPLATE = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
)


def write_blob(root: Path, data: bytes) -> str:
    """Store bytes as a blob; returns the digest as manifests spell it ('sha256:<hex>')."""
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    return f"sha256:{digest}"


def layer(root: Path, media_type: str, data: bytes) -> dict:
    return {"mediaType": media_type, "digest": write_blob(root, data), "size": len(data)}


def add_model(
    root: Path,
    name: str,
    gguf: Path | None,
    tag: str = "latest",
    *,
    namespace: str = "library",
    host: str = "registry.ollama.ai",
    template: str | None = GO_TEMPLATE,
    system: str | None = None,
    params: dict | None = None,
    license: str | None = None,
    extra: list[tuple[str, bytes]] = (),
    config: dict | None = None,
) -> Path:
    """Write one model (its GGUF as the model layer, then template/system/params/license layers as
    given, then `extra` (media type, bytes) layers); returns the manifest's path."""
    layers = [layer(root, IMAGE + "model", gguf.read_bytes())] if gguf else []
    for kind, value in (("template", template), ("system", system), ("license", license)):
        if value is not None:
            layers.append(layer(root, IMAGE + kind, value.encode()))
    if params is not None:
        layers.append(layer(root, IMAGE + "params", json.dumps(params).encode()))
    layers += [layer(root, kind, data) for kind, data in extra]
    cfg = config if config is not None else {
        "model_format": "gguf", "model_family": "llama", "model_families": ["llama"],
        "model_type": "1M", "file_type": "Q4_0", "architecture": "amd64", "os": "linux",
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": layer(root, CONFIG_TYPE, json.dumps(cfg).encode()),
        "layers": layers,
    }
    path = root / "manifests" / host / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


def blob_of(root: Path, manifest: Path, media_type: str) -> Path:
    """The blob file of a manifest's first layer of `media_type`."""
    layers = json.loads(manifest.read_text())["layers"]
    digest = next(x["digest"] for x in layers if x["mediaType"] == media_type)
    return root / "blobs" / digest.replace(":", "-")


def snapshot(root: Path) -> dict:
    """Every file's bytes (hashed), mode and mtime, and every directory's mode and mtime (a
    directory's mtime changes when an entry is added, removed or renamed in it)."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            content = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
            state[str(path.relative_to(root))] = (content, st.st_mode, st.st_mtime_ns)
    st = root.lstat()
    state["."] = ("dir", st.st_mode, st.st_mtime_ns)
    return state
