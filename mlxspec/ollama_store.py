"""Ollama's model store, read in place and never written: `ollama:NAME[:TAG]` -> its manifest's layers.

Layout (Ollama's manifest/paths.go and types/model/name.go): ROOT/manifests/HOST/NAMESPACE/MODEL/TAG
is a JSON manifest whose layers ({mediaType, digest, size}) are the files ROOT/blobs/sha256-<hex>.
ROOT is OLLAMA_MODELS, else ~/.ollama/models (macOS, a Linux user install), else on Linux the system
service's /usr/share/ollama/.ollama/models. Every file here is opened for reading only; the one file
written (digests already checked) lives in MLXSPEC_HOME.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import renderers
from .errors import MlxspecError, ModelLoadError, ModelNotFoundError
from .home import default_home
from .options import GenerateOptions, OptionsError

PREFIX = "ollama:"
DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
SYSTEM_SERVICE_ROOT = Path("/usr/share/ollama/.ollama/models")  # the Linux service runs as user `ollama`
VERIFIED_FILE = "ollama-verified.json"

_IMAGE = "application/vnd.ollama.image."
MODEL, TEMPLATE, PROMPT = _IMAGE + "model", _IMAGE + "template", _IMAGE + "prompt"  # prompt: template's old name
SYSTEM, PARAMS, LICENSE = _IMAGE + "system", _IMAGE + "params", _IMAGE + "license"
# Layers that change what the model is or reads: refused by name rather than silently dropped.
REFUSED = {
    _IMAGE + "projector": "a vision projector (images); mlxspec serves text-only models",
    _IMAGE + "adapter": "a LoRA adapter; mlxspec does not apply adapters",
    _IMAGE + "messages": "a MESSAGE history; mlxspec does not prepend stored conversations",
    _IMAGE + "tensor": "safetensors tensors (Ollama's non-GGUF format); only GGUF model layers load",
}
SMALL_LAYER_LIMIT = 16 * 1024 * 1024  # template/system/params/license are text: larger is a broken store

_HOST = r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}"
_NAMESPACE = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,79}"
_MODEL = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}"  # also the tag's pattern
# Ollama's digest (manifest/paths.go): sha256, then ':' or '-', then 64 hex digits
DIGEST = re.compile(r"^sha256[:-](?P<hex>[0-9a-fA-F]{64})$")


class OllamaNameError(MlxspecError):
    """An `ollama:` reference that is not [host/][namespace/]name[:tag] (HTTP 400)."""


def is_reference(text: object) -> bool:
    return isinstance(text, str) and text.strip().lower().startswith(PREFIX)


@dataclass(frozen=True)
class OllamaName:
    host: str
    namespace: str
    model: str
    tag: str

    @classmethod
    def parse(cls, reference: str) -> "OllamaName":
        """'ollama:llama3.2', 'ollama:user/m:tag', 'ollama:hf.co/org/m:Q4_K_M' (Ollama's own grammar)."""
        text = reference.strip()
        text = text[len(PREFIX):] if text.lower().startswith(PREFIX) else text
        rest, tag = text, DEFAULT_TAG
        if ":" in text and text.rfind(":") > text.rfind("/"):  # '/' cannot be in a tag: a ':' after it is
            rest, tag = text.rsplit(":", 1)
        parts = rest.split("/")
        if len(parts) > 3:
            parts = ["/".join(parts[:-2])] + parts[-2:]  # more slashes: only the host could hold them
        host, namespace, model = [DEFAULT_HOST, DEFAULT_NAMESPACE][: 3 - len(parts)] + parts
        checks = ((host, _HOST), (namespace, _NAMESPACE), (model, _MODEL), (tag, _MODEL))
        if not all(re.fullmatch(pattern, part) for part, pattern in checks):
            raise OllamaNameError(
                f"invalid Ollama model name {reference!r}: use ollama:[host/][namespace/]name[:tag] "
                "with letters, digits, '_', '-' and '.'"
            )
        return cls(host, namespace, model, tag)

    @property
    def display(self) -> str:
        """Ollama's shortest form: 'llama3.2:latest', 'user/m:tag', 'hf.co/org/m:Q4_K_M'."""
        if self.host.lower() != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"

    @property
    def reference(self) -> str:
        return PREFIX + self.display

    @property
    def parts(self) -> tuple[str, str, str, str]:
        return self.host, self.namespace, self.model, self.tag


@dataclass(frozen=True)
class Layer:
    media_type: str
    digest: str
    size: int

    @property
    def kind(self) -> str:
        """The media type without parameters ('...template; name=x' -> '...template')."""
        return self.media_type.split(";", 1)[0].strip()


@dataclass
class OllamaModel:
    """One manifest of Ollama's store, as listed: no blob is read."""

    name: OllamaName  # spelled as on disk
    path: Path
    digest: str  # sha256 of the manifest file, as Ollama's /api/tags reports it
    modified: float
    layers: list[Layer]
    config: Layer | None = None

    @property
    def size(self) -> int:
        return sum(layer.size for layer in self.layers) + (self.config.size if self.config else 0)

    def of_kind(self, *kinds: str) -> list[Layer]:
        return [layer for layer in self.layers if layer.kind in kinds]


@dataclass
class Contents:
    """What an Ollama model's layers say, besides the weights."""

    model: OllamaModel
    weights: Layer
    template: str | None = None  # an Ollama (Go text/template) template, or a renderer's (renderers.py: Jinja)
    renderer: str | None = None  # the built-in renderer the config names, as Ollama resolves it ("gemma4-large")
    system: str | None = None
    params: dict = field(default_factory=dict)  # as stored: Ollama's option names
    license: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)  # the config blob: model_format, model_family, file_type ...
    unused: list[str] = field(default_factory=list)  # media types present but not applied


def default_root(env=os.environ, platform: str = sys.platform) -> Path:
    """OLLAMA_MODELS, else where Ollama keeps models by default on this OS."""
    given = env.get("OLLAMA_MODELS", "").strip().strip("'\"")  # Ollama trims quotes and spaces too
    if given:
        return Path(given).expanduser()
    user = Path("~/.ollama/models").expanduser()
    if platform.startswith("linux") and not user.is_dir() and SYSTEM_SERVICE_ROOT.is_dir():
        return SYSTEM_SERVICE_ROOT
    return user


def _readable(method):
    """OSErrors reading the store (no permission on the service's files, a vanished blob) are the
    caller's to fix: a ModelLoadError naming the file, not a crash."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except OSError as e:
            raise ModelLoadError(f"cannot read Ollama's store at {self.root}: {e.strerror or e} ({e.filename or ''})") from None

    return wrapper


class OllamaStore:
    def __init__(self, root: str | Path, verified_file: Path | None = None):
        self.root = Path(root).expanduser()
        self._verified = _VerifiedDigests(verified_file)

    @classmethod
    def from_env(cls, env=os.environ) -> "OllamaStore":
        """For the Python API's entry points: OLLAMA_MODELS (or the OS default) and MLXSPEC_HOME."""
        return cls(default_root(env), default_home(env) / VERIFIED_FILE)

    # -- manifests -----------------------------------------------------------------------------

    def list(self) -> list[OllamaModel]:
        """Every readable manifest, newest first; broken ones are left out (`find` reports them)."""
        models = []
        for path in (self.root / "manifests").glob("*/*/*/*"):
            try:
                name = OllamaName.parse("/".join(path.relative_to(self.root / "manifests").parts[:3]) + ":" + path.name)
                if path.is_file():
                    models.append(self._read_manifest(name, path))
            except (MlxspecError, OSError):
                continue
        return sorted(models, key=lambda m: m.modified, reverse=True)

    @_readable
    def find(self, reference: str) -> OllamaModel:
        name = OllamaName.parse(reference)
        path = self._manifest_path(name)
        if path is None:
            raise ModelNotFoundError(self._not_found(name))
        return self._read_manifest(self._name_on_disk(path), path)

    def _manifest_path(self, name: OllamaName) -> Path | None:
        """The manifest file, matching each part's case exactly or else ignoring it (as Ollama compares)."""
        path = self.root / "manifests"
        for part in name.parts:
            exact = path / part
            if exact.exists():
                path = exact
                continue
            try:
                path = next(p for p in sorted(path.iterdir()) if p.name.lower() == part.lower())
            except (OSError, StopIteration):
                return None
        return path if path.is_file() else None

    def _name_on_disk(self, path: Path) -> OllamaName:
        host, namespace, model, tag = path.relative_to(self.root / "manifests").parts
        return OllamaName(host, namespace, model, tag)

    def _not_found(self, name: OllamaName) -> str:
        where = f"Ollama's store at {self.root}"
        tags = sorted(m.name.tag for m in self.list() if m.name.parts[:3] == name.parts[:3])
        if tags:
            return f"{name.reference} not found in {where}: {name.model} has tag(s) {', '.join(tags)}"
        return f"{name.reference} not found in {where} (get it with `ollama pull {name.display}`, or set OLLAMA_MODELS)"

    def _read_manifest(self, name: OllamaName, path: Path) -> OllamaModel:
        try:
            data = path.read_bytes()
            modified = path.stat().st_mtime
            manifest = json.loads(data)
        except OSError as e:
            raise ModelLoadError(f"{name.reference}: cannot read its manifest {path}: {e.strerror or e}") from None
        except ValueError as e:
            raise ModelLoadError(f"{name.reference}: its manifest {path} is not valid JSON ({e})") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("layers"), list):
            raise ModelLoadError(f"{name.reference}: its manifest {path} has no list of layers")
        layers = [_layer(item, name) for item in manifest["layers"]]
        config = _layer(manifest["config"], name) if isinstance(manifest.get("config"), dict) else None
        return OllamaModel(name, path, hashlib.sha256(data).hexdigest(), modified, layers, config)

    # -- layers --------------------------------------------------------------------------------

    def blob_path(self, layer: Layer) -> Path:
        return self.root / "blobs" / ("sha256-" + DIGEST.match(layer.digest)["hex"])

    @_readable
    def contents(self, model: OllamaModel) -> Contents:
        """Template, system prompt, parameters, license and config, each checked against its digest;
        refuses what mlxspec cannot honour (projector, adapter, ...) and models without one GGUF."""
        for layer in model.layers:
            if layer.kind in REFUSED:
                raise ModelLoadError(f"{model.name.reference} has {REFUSED[layer.kind]} ({layer.kind})")
        weights = model.of_kind(MODEL)
        if len(weights) != 1:
            raise ModelLoadError(f"{model.name.reference}: its manifest has {len(weights)} model layers; mlxspec loads exactly one GGUF")
        out = Contents(model, weights[0])
        if model.config is not None:
            out.config = _json_object(self.read_small(model, model.config), model, "config")
            if out.config.get("model_format", "gguf") != "gguf":
                raise ModelLoadError(f"{model.name.reference} is in {out.config['model_format']!r} format; only GGUF model layers load")
        for layer in model.layers:
            if layer.kind in (TEMPLATE, PROMPT):
                out.template = self.read_small(model, layer).decode("utf-8", "replace")
            elif layer.kind == SYSTEM:
                out.system = self.read_small(model, layer).decode("utf-8", "replace")
            elif layer.kind == PARAMS:
                out.params = _json_object(self.read_small(model, layer), model, "params")
            elif layer.kind == LICENSE:
                out.license.append(self.read_small(model, layer).decode("utf-8", "replace"))
            elif layer.kind != MODEL:
                out.unused.append(layer.kind)  # e.g. a draft, deprecated embeddings, unknown kinds
        _apply_renderer(out)
        return out

    def read_small(self, model: OllamaModel, layer: Layer) -> bytes:
        """A text layer's bytes, refused when missing, of another size or digest."""
        if layer.size > SMALL_LAYER_LIMIT:
            raise ModelLoadError(f"{model.name.reference}: layer {layer.kind} claims {layer.size} bytes; that is no text layer")
        path = self._existing_blob(model, layer)
        data = path.read_bytes()
        if len(data) != layer.size or hashlib.sha256(data).hexdigest() != _hex(layer):
            raise ModelLoadError(_mismatch(model, layer, path))
        return data

    @_readable
    def weights_path(self, model: OllamaModel, layer: Layer) -> Path:
        """The GGUF blob, its size and sha256 checked (the hash once per file: remembered by
        size, mtime and inode in MLXSPEC_HOME, never in Ollama's store)."""
        path = self._existing_blob(model, layer)
        stat = path.stat()
        if stat.st_size != layer.size:
            raise ModelLoadError(_mismatch(model, layer, path, f"{stat.st_size} bytes, the manifest says {layer.size}"))
        if self._verified.holds(path, stat, _hex(layer)):
            return path
        if _sha256_file(path) != _hex(layer):
            raise ModelLoadError(_mismatch(model, layer, path))
        self._verified.add(path, stat, _hex(layer))
        return path

    def model_blob(self, reference: str) -> Path:
        """`ollama:NAME[:TAG]` -> its verified GGUF blob (after the checks of `contents`)."""
        contents = self.contents(self.find(reference))
        return self.weights_path(contents.model, contents.weights)

    def _existing_blob(self, model: OllamaModel, layer: Layer) -> Path:
        path = self.blob_path(layer)
        if not path.is_file():
            raise ModelLoadError(
                f"{model.name.reference}: blob {layer.digest} ({layer.kind}) is missing from {self.root / 'blobs'}; "
                f"re-pull it with `ollama pull {model.name.display}`"
            )
        return path


# -- parameters and descriptions ---------------------------------------------------------------------


def split_parameters(params: dict) -> tuple[dict, dict]:
    """Ollama's params -> (mlxspec options to use as defaults, {name: why not} for the rest)."""
    applied, ignored = {}, {}
    for key, value in params.items():
        if key in GenerateOptions.IGNORED:
            ignored[key] = "not applied (a llama.cpp runner setting, or one Ollama no longer reads)"
            continue
        try:
            GenerateOptions.from_dict({key: value})
        except OptionsError as e:
            ignored[key] = str(e)
            continue
        applied[key] = value
    return applied, ignored


def details(model: OllamaModel, config: dict) -> dict:
    """Ollama's `details` of /api/tags from the config blob (no weights read)."""
    family = config.get("model_family") or ""
    return {
        "parent_model": "",
        "format": config.get("model_format") or "gguf",
        "family": family,
        "families": config.get("model_families") or ([family] if family else []),
        "parameter_size": config.get("model_type") or "",
        "quantization_level": config.get("file_type") or "",
    }


def _apply_renderer(out: Contents) -> None:
    """A config naming a built-in renderer ("renderer": "gemma4", as Ollama's newer library models ship
    instead of a TEMPLATE layer): its equivalent chat template where mlxspec has one. It replaces a
    template layer too, as in Ollama, where the renderer formats the prompt whenever one is named."""
    named = out.config.get("renderer")
    if not isinstance(named, str) or not named:
        return
    name = out.model.name
    full = f"{name.host}/{name.namespace}/{name.model}:{name.tag}"  # Ollama's Model.Name, after ShortName
    model_type = out.config.get("model_type") if isinstance(out.config.get("model_type"), str) else ""
    out.renderer, template = renderers.template_for(named, (name.display, full), model_type)
    if template is not None:
        out.template = template


def template_problem(template: str | None) -> str | None:
    """None when Ollama's Go template translates to the Jinja mlxspec renders (or is a renderer's own
    Jinja, renderers.py), else why not."""
    from .go_jinja import to_jinja
    from .go_template import GoTemplateError

    if renderers.renderer_of(template):
        return None
    try:
        to_jinja(template or "")
    except GoTemplateError as e:
        return str(e)
    return None


def template_note(template: str | None, renderer: str | None = None) -> str:
    if known := renderers.renderer_of(template):
        return (f"Ollama's built-in renderer {known!r} (its config names it), as a Jinja "
                "chat template (mlxspec/renderers.py): chat renders as Ollama renders it, tools and thinking too")
    unknown = f"Ollama's built-in renderer {renderer!r} (its config names it) is not one mlxspec renders; " if renderer else ""
    if not template:
        return unknown + ("chat uses the GGUF's own chat template, or Ollama's default {{ .Prompt }}" if unknown else "")
    problem = template_problem(template)
    if problem is None:
        return unknown + "Ollama's Go template, translated to Jinja: chat renders as Ollama renders it"
    return (unknown + f"Ollama's Go template is not translated ({problem}): chat uses the GGUF's own chat template "
            "(tokenizer.chat_template), or Ollama's default {{ .Prompt }} when the GGUF has none")


def describe(store: OllamaStore, contents: Contents) -> dict:
    """What `show` adds for an Ollama model: where it is, its layers, and what was not applied."""
    model = contents.model
    _, ignored = split_parameters(contents.params)
    return {
        "name": model.name.display,
        "store": str(store.root),
        "manifest": str(model.path),
        "read_only": True,
        "layers": [{"mediaType": x.media_type, "digest": x.digest, "size": x.size} for x in model.layers],
        "template": contents.template or "",
        "template_note": template_note(contents.template, contents.renderer),
        "renderer": contents.renderer or "",
        "parameters": contents.params,
        "parameters_not_applied": ignored,
        "layers_not_applied": contents.unused,
    }


def read_config(store: OllamaStore, model: OllamaModel) -> dict:
    """The config blob for listings: {} when absent or unreadable (listing never fails on it)."""
    if model.config is None:
        return {}
    try:
        return _json_object(store.read_small(model, model.config), model, "config")
    except (MlxspecError, OSError):
        return {}


# -- helpers -------------------------------------------------------------------------------------------


def _layer(item: object, name: OllamaName) -> Layer:
    if not isinstance(item, dict):
        raise ModelLoadError(f"{name.reference}: a manifest layer is not an object")
    media, digest, size = item.get("mediaType"), item.get("digest"), item.get("size")
    if not isinstance(media, str) or not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise ModelLoadError(f"{name.reference}: manifest layer {digest!r} has no valid mediaType and sha256 digest")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ModelLoadError(f"{name.reference}: manifest layer {digest} has no valid size")
    return Layer(media, digest, size)


def _hex(layer: Layer) -> str:
    return DIGEST.match(layer.digest)["hex"].lower()


def _mismatch(model: OllamaModel, layer: Layer, path: Path, what: str = "its sha256 differs from its digest") -> str:
    return (f"{model.name.reference}: blob {path.name} ({layer.kind}) does not match the manifest: {what}; "
            f"the file is damaged or was changed: re-pull it with `ollama pull {model.name.display}`")


def _json_object(data: bytes, model: OllamaModel, what: str) -> dict:
    try:
        value = json.loads(data)
    except ValueError as e:
        raise ModelLoadError(f"{model.name.reference}: its {what} layer is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ModelLoadError(f"{model.name.reference}: its {what} layer is not a JSON object")
    return value


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


class _VerifiedDigests:
    """Blobs whose sha256 was checked, by (size, mtime, inode): a GGUF of gigabytes is hashed once.
    Kept in memory and, given a file (in MLXSPEC_HOME), there too; a lost write only means hashing again."""

    def __init__(self, path: Path | None):
        self.path = path
        self.memory: dict = {}

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text()) if self.path else {}
        except (OSError, ValueError):
            data = {}
        return {**(data if isinstance(data, dict) else {}), **self.memory}

    @staticmethod
    def _key(stat: os.stat_result, digest: str) -> list:
        return [stat.st_size, stat.st_mtime_ns, stat.st_ino, digest]

    def holds(self, blob: Path, stat: os.stat_result, digest: str) -> bool:
        return self._read().get(str(blob)) == self._key(stat, digest)

    def add(self, blob: Path, stat: os.stat_result, digest: str) -> None:
        self.memory[str(blob)] = self._key(stat, digest)
        if self.path is None:
            return
        data = {**self._read(), str(blob): self._key(stat, digest)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # a read-only home: verify again next time
