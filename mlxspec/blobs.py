"""Blobs uploaded with Ollama's `POST /api/blobs/{digest}`, and the model folders /api/create makes of them.

Layout, Ollama's (manifest/paths.go): MLXSPEC_HOME/blobs/sha256-<hex>, each file named by the sha256 of
its bytes. Ollama's own store is only ever read (ollama_store.py), so uploads land in mlxspec's home.
An upload is written to a temp file beside the blobs (`.<random>.tmp`), hashed as it is written, and
renamed into place only when its digest matched; a failed or cut upload removes it, and what a kill -9
leaves, Store.clean_leftovers removes at the next start.

/api/create's `files` ({name: digest}) become MLXSPEC_HOME/imports/<id>/: each name a hard link to
its blob (a copy where the filesystem has none), so the folder is the model directory, or holds the
.gguf file, that the loaders take, and it outlives the blobs. <id> hashes the names and digests: the
same files make the same folder, shared by every model made of them. Store.delete removes a folder no
model uses any more, and the blobs only it linked (as `ollama rm` removes a model's unshared layers).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

from .errors import MlxspecError
from .ollama_store import DIGEST

GGUF_MAGIC = b"GGUF"
# A file name of a model folder: one plain name, never a path ('/', '\\'), '.' or '..', nor a NUL
_FILE_NAME = re.compile(r"^(?!\.\.?$)[^/\\\x00]{1,255}$")


class InvalidDigestError(MlxspecError):
    """A digest that is not sha256:<64 hex digits> (HTTP 400, Ollama's `invalid digest format`)."""


class DigestMismatchError(MlxspecError):
    """An upload whose bytes hash to another digest than the one it was sent under (HTTP 400)."""


class BlobFilesError(MlxspecError):
    """A create's `files` that make no model: bad names, blobs not uploaded, no or mixed weights (HTTP 400)."""


def parse_digest(digest: object) -> str:
    """'sha256:<hex>' or 'sha256-<hex>' (Ollama takes both) -> the hex, lower-cased."""
    m = DIGEST.fullmatch(digest) if isinstance(digest, str) else None  # no "\n" after
    if m is None:
        raise InvalidDigestError(f"invalid digest format {str(digest)[:80]!r}: expected sha256:<64 hex digits>")
    return m["hex"].lower()


class Upload:
    """One blob being received: hashed as it is written, renamed into place when its digest matches.
    `write` runs in a worker thread; the lock keeps a `discard` from the event loop off a write in flight."""

    def __init__(self, root: Path, digest: str):
        self.digest, self.hex = digest, parse_digest(digest)
        self.target = root / f"sha256-{self.hex}"
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".", suffix=".tmp")  # clean_leftovers' pattern
        self.tmp, self.file, self.hash = Path(tmp), os.fdopen(fd, "wb"), hashlib.sha256()
        self.lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self.lock:
            if not self.file.closed:  # closed: discarded while this waited (its request was cancelled)
                self.file.write(data)
                self.hash.update(data)

    def commit(self) -> Path:
        """Move the blob into place; DigestMismatchError (the temp file left for `discard`) when it is another."""
        with self.lock:
            if self.file.closed:
                raise MlxspecError("the upload was abandoned")  # discarded while this waited
            got = self.hash.hexdigest()
            if got != self.hex:  # Ollama's words
                raise DigestMismatchError(f'digest mismatch, expected "{self.digest}", got "sha256:{got}"')
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.tmp, self.target)
        return self.target

    def discard(self) -> None:
        with self.lock:
            self.file.close()
            self.tmp.unlink(missing_ok=True)


class BlobStore:
    def __init__(self, home: Path):
        home = Path(home).expanduser().absolute()  # manifests name import folders by absolute path
        self.root = home / "blobs"
        self.imports = home / "imports"

    def path(self, digest: str) -> Path:
        return self.root / f"sha256-{parse_digest(digest)}"

    def exists(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def upload(self, digest: str) -> Upload:
        return Upload(self.root, digest)

    # -- model folders of uploaded files --------------------------------------------------------

    def model_from_files(self, files: dict, what: str = "files") -> Path:
        """The model that {name: digest} names: its .gguf file, or a safetensors model directory."""
        blobs = {name: self._blob(name, digest, what) for name, digest in sorted(files.items())}
        if not blobs:
            raise BlobFilesError(f"{what} is empty: name the uploaded model files")
        gguf = [name for name, blob in blobs.items() if _is_gguf(name, blob)]
        safetensors = [name for name in blobs if name.lower().endswith(".safetensors")]
        if gguf and safetensors:
            raise BlobFilesError(f"{what} mix GGUF ({gguf[0]}) and safetensors ({safetensors[0]}) weights: give one model's files")
        if gguf:
            if len(blobs) != 1:
                raise BlobFilesError(f"{what}: a GGUF model is one .gguf file (split GGUFs and extra files are not "
                                     f"supported), not {len(blobs)} files")
            name = gguf[0] if gguf[0].lower().endswith(".gguf") else gguf[0] + ".gguf"  # the loader goes by suffix
            return self._folder({name: blobs[gguf[0]]}) / name
        if not safetensors:
            raise BlobFilesError(f"{what} hold no model weights: a .gguf file, or *.safetensors with config.json")
        if "config.json" not in blobs:
            raise BlobFilesError(f"{what}: a safetensors model needs its config.json among the files")
        return self._folder(blobs)

    def _blob(self, name: object, digest: object, what: str) -> Path:
        if not isinstance(name, str) or not _FILE_NAME.match(name):
            raise BlobFilesError(f"{what}: {str(name)[:80]!r} is not a plain file name (no '/', '\\', '..' nor NUL)")
        path = self.root / f"sha256-{parse_digest(digest)}"
        if not path.is_file():
            raise BlobFilesError(f"{what}: blob {digest} ({name}) is not uploaded: POST the file to /api/blobs/{digest} first")
        return path

    def _folder(self, blobs: dict[str, Path]) -> Path:
        """imports/<id>: the names linked to their blobs, built under a temp name and renamed whole."""
        key = "".join(f"{name}\0{blob.name}\n" for name, blob in sorted(blobs.items()))
        final = self.imports / hashlib.sha256(key.encode()).hexdigest()[:32]
        if final.is_dir():
            os.utime(final)  # in use again: clean_leftovers leaves folders touched lately
            return final
        self.imports.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.imports, prefix=".", suffix=".tmp"))
        try:
            for name, blob in blobs.items():
                _link(blob, tmp / name, name)
            os.rename(tmp, final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if final.is_dir():  # another create of the same files won the race
                return final
            raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    # -- what models use ---------------------------------------------------------------------------

    def folder_of(self, reference: object) -> Path | None:
        """The import folder a manifest's target or draft lies in (imports/<id> or a file in it), else None."""
        if not isinstance(reference, str) or not reference.startswith(str(self.imports) + os.sep):
            return None
        parts = Path(reference).relative_to(self.imports).parts
        return self.imports / parts[0] if parts and not parts[0].startswith(".") else None

    def folders(self) -> list[Path]:
        """Every finished import folder (temp ones start with '.')."""
        try:
            return [p for p in self.imports.iterdir() if p.is_dir() and not p.name.startswith(".")]
        except OSError:
            return []

    def remove_folder(self, folder: Path, with_blobs: bool) -> list[Path]:
        """Remove an import folder and, `with_blobs`, the blobs that no other folder links; returns what went."""
        inodes = set()
        for file in folder.iterdir() if folder.is_dir() else ():
            try:
                stat = file.stat()
                inodes.add((stat.st_dev, stat.st_ino))
            except OSError:
                continue
        shutil.rmtree(folder, ignore_errors=True)
        removed = [folder]
        for blob in self.root.glob("sha256-*") if with_blobs and inodes else ():
            try:
                stat = blob.stat()
                if (stat.st_dev, stat.st_ino) in inodes and stat.st_nlink == 1:  # linked by this folder alone
                    blob.unlink()
                    removed.append(blob)
            except OSError:
                continue
        return removed


def _is_gguf(name: str, blob: Path) -> bool:
    """A .gguf name, or a name without a weights suffix whose bytes start as GGUF (Ollama checks likewise)."""
    lower = name.lower()
    if lower.endswith(".gguf"):
        return True
    if lower.endswith((".safetensors", ".json")):
        return False
    with open(blob, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def _link(blob: Path, path: Path, name: str) -> None:
    """A hard link (no second copy of the bytes); a copy where the filesystem refuses links."""
    try:
        os.link(blob, path)
    except FileNotFoundError:
        raise BlobFilesError(f"blob {blob.name} ({name}) was removed meanwhile: upload it again") from None
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        shutil.copyfile(blob, path)
