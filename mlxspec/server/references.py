"""What `from`, `draft` and drafters' sources may name in /api/create over HTTP.

Store names, shipped names, `ollama:` names (Ollama's store), Hugging Face repo ids and hf.co/ORG/REPO[:QUANT]
GGUF references always work.
A local path reads the daemon's disk on the caller's behalf, so it must be absolute, lie under
MLXSPEC_MODEL_DIRS (or come from the CLI of the same user, which proves it by sending the key in
MLXSPEC_HOME/local.key), and be a model: a .gguf file or a directory with config.json and weights,
never /etc/passwd or /proc/...
"""

from __future__ import annotations

from pathlib import Path

from .. import loading
from ..errors import ModelLoadError
from ..hub_gguf import is_reference as is_hub_gguf
from ..ollama_store import is_reference as is_ollama
from ..store import Manifest, Store, is_name
from .requests import ApiError

WEIGHTS = ("*.safetensors", "*.gguf")


def resolve_for_http(store: Store, ref: str, what: str, model_dirs: list[Path], trusted: bool) -> Manifest:
    """The manifest `ref` stands for, or a 4xx ApiError saying why it may not be used."""
    if not ref.strip():
        raise ApiError(400, f"{what} must not be empty")
    if is_ollama(ref):  # a name in Ollama's store: its parts cannot leave the store's directory
        return store.resolve(ref)[1]
    if is_name(ref) and (store.exists(ref) or store.shipped(ref) is not None):
        return store.resolve(ref)[1]
    if ref.startswith("pypi:"):
        _check_package_model(ref, what)
        return Manifest(target=ref)
    if not ref.startswith(("/", "~")):  # over HTTP a relative path means nothing: the daemon's cwd
        if loading.REPO_ID.match(ref) or is_hub_gguf(ref):
            return Manifest(target=ref.strip())
        raise ApiError(404, f"{what} {_short(ref)} not found: not a stored model, an absolute path nor a repo id")
    return Manifest(target=str(_local_model(ref, what, model_dirs, trusted)))


def _local_model(ref: str, what: str, model_dirs: list[Path], trusted: bool) -> Path:
    path = _local_path(ref, what, model_dirs, trusted, is_model)
    if path is None:
        raise ApiError(400, f"{what} {_short(ref)} is not a model: a .gguf file or a directory with config.json and weights")
    return path


def head_file_for_http(ref: str, what: str, model_dirs: list[Path], trusted: bool) -> str:
    """A learned head (eagle:, medusa:) named by a path: held to the rules of `from` (absolute, under
    MLXSPEC_MODEL_DIRS or the local user's), and a .safetensors file; a name (MLXSPEC_HOME/drafters/NAME)
    as it is."""
    if "/" not in ref and not ref.startswith("~") and not ref.endswith(".safetensors"):
        return ref
    if not ref.startswith(("/", "~")):
        raise ApiError(400, f"{what} {_short(ref)}: a path over HTTP must be absolute")
    path = _local_path(ref, what, model_dirs, trusted, lambda p: p.is_file() and p.suffix == ".safetensors")
    if path is None:
        raise ApiError(400, f"{what} {_short(ref)} is not a drafter file (.safetensors)")
    return str(path)


def _local_path(ref: str, what: str, model_dirs: list[Path], trusted: bool, kind) -> Path | None:
    """`ref` resolved, if the caller may read it and `kind(path)` holds; None where it does not hold."""
    try:
        path = Path(ref).expanduser().resolve()  # symlinks followed: a link may not lead outside
        allowed = trusted or any(path.is_relative_to(d) for d in model_dirs)
        if not allowed:
            raise ApiError(403, f"{what}: local paths over HTTP must be under MLXSPEC_MODEL_DIRS ({_short(ref)} is not)")
        if not path.exists():
            raise ApiError(404, f"{what} {_short(ref)} not found")
        return path if kind(path) else None
    except (OSError, ValueError) as e:  # a name too long, a NUL byte, no permission
        raise ApiError(400, f"{what} {_short(ref)} cannot be read: {getattr(e, 'strerror', None) or e}") from None


def _check_package_model(ref: str, what: str) -> None:
    """A pypi: file must stay inside its package ('pypi:pkg/../../etc/passwd' does not) and be a model."""
    try:
        path = loading.resolve(ref).resolve()
        package = loading.package_dir(ref).resolve()
    except ModelLoadError as e:
        raise ApiError(404, str(e)) from None
    except (OSError, ValueError) as e:
        raise ApiError(400, f"{what} {_short(ref)} cannot be read: {e}") from None
    if not path.is_relative_to(package) or not is_model(path):
        raise ApiError(400, f"{what} {_short(ref)} is not a model file inside its package")


def is_model(path: Path) -> bool:
    if path.is_file():
        return path.suffix.lower() == ".gguf"
    return path.is_dir() and (path / "config.json").is_file() and any(any(path.glob(w)) for w in WEIGHTS)


def _short(ref: str) -> str:
    return repr(ref if len(ref) <= 80 else ref[:77] + "...")
