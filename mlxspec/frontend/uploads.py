"""A local model sent to a daemon that cannot read it (on another machine), as Ollama's CLI does it:
each file's sha256, `HEAD /api/blobs/{digest}`, a `POST` of each file the daemon lacks, streamed from
disk; /api/create then names the files in `files` ({name: digest}) instead of a path in `from`.

    files = upload_model(client, Path("./model.gguf"), "from")   # {"model.gguf": "sha256:..."}
"""

from __future__ import annotations

import fnmatch
import hashlib
import sys
from pathlib import Path
from typing import Iterator

import click

from ..errors import MlxspecError
from .client import ApiError, Client
from .display import human_size

# What the loader reads of a model directory: mlxspec.loading.HUB_PATTERNS (mlx-lm's list without code),
# written out so the CLI needs no MLX; tests/frontend/test_create_upload.py keeps the two the same.
MODEL_FILES = ("*.json", "model*.safetensors", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja")
WEIGHTS = "model*.safetensors"  # what mlx-lm loads a directory's weights from
GGUF_MAGIC = b"GGUF"
CHUNK = 1 << 20  # bytes read, hashed and sent at a time: a file is never held whole


class UploadError(MlxspecError):
    """A local model that cannot be uploaded: not a model, unreadable, or changed while it was read."""


def upload_model(client: Client, path: Path, what: str) -> dict[str, str]:
    """Upload the files of the model at `path` (a .gguf file or a model directory) that the daemon lacks;
    returns the {file name: digest} that /api/create's `files` (or `draft_files`) takes."""
    files = model_files(path, what)
    digests = hash_files(files, path)
    stored: dict[str, bool] = {}  # digest -> the daemon had it: each asked (and sent) once
    for name, digest in digests.items():
        if digest not in stored:
            stored[digest] = client.has_blob(digest)
            if not stored[digest]:
                send_file(client, files[name], digest, name)
    if kept := sum(stored.values()):
        click.echo(f"{kept} of {len(stored)} files of {path.name} were on the daemon already", err=True)
    return digests


def model_files(path: Path, what: str) -> dict[str, Path]:
    """{name: file} of a model: a GGUF file alone, or what the loader reads of a model directory."""
    if path.is_dir():
        return _directory_files(path, what)
    try:
        with open(path, "rb") as f:
            is_gguf = f.read(4) == GGUF_MAGIC
    except OSError as e:
        raise UploadError(f"{what} {path}: cannot read it ({e.strerror or e})") from None
    if not is_gguf:
        raise UploadError(f"{what} {path} is not a model: a GGUF file, or a directory with config.json and {WEIGHTS}")
    return {path.name: path}


def _directory_files(path: Path, what: str) -> dict[str, Path]:
    """The directory's files that MODEL_FILES match (top level, as the loader reads it; no hidden files)."""
    try:
        files = {p.name: p for p in sorted(path.iterdir())
                 if not p.name.startswith(".") and any(fnmatch.fnmatchcase(p.name, m) for m in MODEL_FILES) and p.is_file()}
    except OSError as e:
        raise UploadError(f"{what} {path}: cannot read it ({e.strerror or e})") from None
    if "config.json" not in files or not any(fnmatch.fnmatchcase(name, WEIGHTS) for name in files):
        raise UploadError(f"{what} {path} is not a model directory: it needs config.json and {WEIGHTS}")
    return files


def hash_files(files: dict[str, Path], path: Path) -> dict[str, str]:
    """{name: 'sha256:<hex>'}, each file read once in chunks, under one progress bar for all of them."""
    sizes = {name: _size(file) for name, file in files.items()}
    digests = {}
    with click.progressbar(length=max(sum(sizes.values()), 1), label=f"hashing {path.name}", file=sys.stderr) as bar:
        for name, file in files.items():
            sha = hashlib.sha256()
            for chunk in read_chunks(file, sizes[name]):
                sha.update(chunk)
                bar.update(len(chunk))
            digests[name] = f"sha256:{sha.hexdigest()}"
    return digests


def send_file(client: Client, file: Path, digest: str, name: str) -> None:
    """POST one file as the blob `digest`, with a progress bar; the daemon's refusal names the file."""
    size = _size(file)
    with click.progressbar(length=max(size, 1), label=f"copying {name} ({human_size(size)})", file=sys.stderr) as bar:
        def chunks() -> Iterator[bytes]:
            for chunk in read_chunks(file, size):
                bar.update(len(chunk))
                yield chunk

        try:
            client.upload_blob(digest, chunks(), size)
        except ApiError as e:
            why = ": did the file change after it was hashed?" if "mismatch" in str(e) else ""
            raise ApiError(f"uploading {file}: {e}{why}", e.status) from None


def read_chunks(file: Path, size: int) -> Iterator[bytes]:
    """The first `size` bytes of `file`, CHUNK at a time. A read error is an UploadError, never an OSError:
    raised inside an upload, an OSError would read as the connection failing."""
    try:
        with open(file, "rb") as f:
            left = size
            while left > 0:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    raise UploadError(f"{file} got shorter while it was read: is something writing it?")
                left -= len(chunk)
                yield chunk
    except OSError as e:
        raise UploadError(f"{file}: cannot read it ({e.strerror or e})") from None


def _size(file: Path) -> int:
    try:
        return file.stat().st_size
    except OSError as e:
        raise UploadError(f"{file}: cannot read it ({e.strerror or e})") from None
