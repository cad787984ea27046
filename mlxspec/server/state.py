"""What every route reads: the store, the loaded models, the per-model queues, the settings."""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from ..address import parse_host
from ..cache import KV_CACHE_TYPES
from ..kernels.cpu import ACTIVATION_SETTINGS
from ..drafters.ngram_memory import lookup_memory_setting
from ..engine import KERNEL_ENV
from ..errors import MlxspecError
from ..footprint import model_footprint
from ..home import LOCAL_KEY_HEADER
from ..ollama_store import default_root
from ..store import Manifest, Store
from .registry import Registry
from .requests import ApiError, parse_duration
from .scheduler import Scheduler

DEFAULT_KEEP_ALIVE = "5m"
DEFAULT_ORIGINS = [  # as Ollama: pages served from this machine and app webviews may call the API
    "http://localhost", "https://localhost", "http://localhost:*", "https://localhost:*",
    "http://127.0.0.1", "https://127.0.0.1", "http://127.0.0.1:*", "https://127.0.0.1:*",
    "http://0.0.0.0", "http://0.0.0.0:*", "app://*", "file://*", "tauri://*", "vscode-webview://*",
]


@dataclass
class Settings:
    keep_alive: float = 300.0  # seconds a model stays loaded after a request
    max_loaded: int = 3
    max_queue: int = 512  # requests that may wait per model
    max_body: int = 16 * 1024 * 1024  # bytes
    origins: list[str] = field(default_factory=lambda: list(DEFAULT_ORIGINS))
    api_key: str | None = None
    host: str = "127.0.0.1"  # the address the daemon binds (MLXSPEC_HOST)
    port: int = 11435
    allowed_hosts: list[str] = field(default_factory=list)  # Host header names beyond loopback (patterns)
    model_dirs: list[Path] = field(default_factory=list)  # where /api/create may take local paths from
    ollama_models: Path | None = None  # Ollama's store, read for `ollama:` names (None: not read)

    @classmethod
    def from_env(cls, env=os.environ) -> "Settings":
        """MLXSPEC_HOST, MLXSPEC_KEEP_ALIVE, MLXSPEC_MAX_LOADED_MODELS, MLXSPEC_MAX_QUEUE, MLXSPEC_MAX_BODY,
        MLXSPEC_ORIGINS, MLXSPEC_API_KEY, MLXSPEC_ALLOWED_HOSTS, MLXSPEC_MODEL_DIRS, OLLAMA_MODELS (README: Settings)."""
        try:
            _, host, port = parse_host(env.get("MLXSPEC_HOST", ""))
        except MlxspecError as e:
            raise ValueError(str(e)) from None
        try:
            keep_alive = parse_duration(env.get("MLXSPEC_KEEP_ALIVE", DEFAULT_KEEP_ALIVE), "MLXSPEC_KEEP_ALIVE")
        except ApiError as e:
            raise ValueError(e.message) from None
        extra = _list(env, "MLXSPEC_ORIGINS", ",")
        _check_engine_settings(env)
        return cls(
            keep_alive=keep_alive,
            max_loaded=_positive(env, "MLXSPEC_MAX_LOADED_MODELS", 3),
            max_queue=_positive(env, "MLXSPEC_MAX_QUEUE", 512),
            max_body=_positive(env, "MLXSPEC_MAX_BODY", 16 * 1024 * 1024),
            origins=DEFAULT_ORIGINS + extra,
            api_key=env.get("MLXSPEC_API_KEY") or None,
            host=host,
            port=port,
            allowed_hosts=[h.lower() for h in _list(env, "MLXSPEC_ALLOWED_HOSTS", ",")],
            model_dirs=[Path(d).expanduser().resolve() for d in _list(env, "MLXSPEC_MODEL_DIRS", os.pathsep)],
            ollama_models=default_root(env),
        )


def _check_engine_settings(env) -> None:
    """Engine settings are read where each Engine loads (Engine.load); a daemon checks them at start,
    so a typo stops `serve` with one line instead of failing every model load later."""
    for key, allowed in (("MLXSPEC_KV_CACHE_TYPE", KV_CACHE_TYPES), ("MLXSPEC_ACTIVATIONS", ACTIVATION_SETTINGS),
                         ("MLXSPEC_KERNELS", KERNEL_ENV)):
        value = env.get(key)
        if value and value not in allowed:
            raise ValueError(f"{key} must be one of {', '.join(allowed)}, not {value!r}")
    try:
        lookup_memory_setting(env)
    except MlxspecError as e:
        raise ValueError(str(e)) from None


def _list(env, key: str, sep: str) -> list[str]:
    return [item.strip() for item in env.get(key, "").split(sep) if item.strip()]


def _positive(env, key: str, default: int) -> int:
    value = env.get(key)
    if value is None or value == "":
        return default
    if not value.strip().isdigit() or int(value) < 1:
        raise ValueError(f"{key} must be a positive integer, not {value!r}")
    return int(value)


class State:
    def __init__(self, store: Store, settings: Settings, registry: Registry | None = None):
        self.store = store
        self.settings = settings
        self.registry = registry or Registry(settings.max_loaded, settings.keep_alive, loader=store.load_engine,
                                             footprint=lambda manifest: model_footprint(manifest, store.ollama))
        self.scheduler = Scheduler(self.registry, settings.max_queue)
        self.local_key = secrets.token_urlsafe(32)  # written to MLXSPEC_HOME/local.key at start-up

    def is_local_user(self, request: web.Request) -> bool:
        """The caller could read our local.key: the same user on this machine (see home.py)."""
        given = request.headers.get(LOCAL_KEY_HEADER, "")
        return hmac.compare_digest(given.encode(), self.local_key.encode())

    def manifest(self, name: str) -> tuple[str, Manifest]:
        """(canonical name, manifest) of a stored or Ollama model; 400 for a bad name, 404 for a missing one."""
        return self.store.named(name)

    async def close(self) -> None:
        await self.scheduler.close()
        await self.registry.close()


STATE = web.AppKey("state", State)
