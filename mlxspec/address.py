"""Where the daemon listens: MLXSPEC_HOST parsed once, shared by the server and the HTTP client."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from .errors import MlxspecError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 11435
LOOPBACK = ("127.0.0.1", "localhost", "::1")

def parse_host(value: str | None = None) -> tuple[str, str, int]:
    """'host:port', ':port', 'http://host' (MLXSPEC_HOST) -> (scheme, host, port)."""
    value = (value if value is not None else os.environ.get("MLXSPEC_HOST", "")).strip()
    if not value:
        return "http", DEFAULT_HOST, DEFAULT_PORT
    parts = urlsplit(value if "://" in value else f"http://{value}")
    if parts.scheme not in ("http", "https"):
        raise MlxspecError(f"invalid MLXSPEC_HOST {value!r}: use host:port, e.g. 127.0.0.1:11435")
    try:
        port = parts.port
        if port == 0:  # ':0' would bind a random port, and the CLI could not find the daemon there
            raise ValueError
    except ValueError:  # not a number, or out of range
        raise MlxspecError(f"invalid MLXSPEC_HOST {value!r}: the port must be a number from 1 to 65535") from None
    default_port = {"http": 80, "https": 443}[parts.scheme] if "://" in value else DEFAULT_PORT
    return parts.scheme, parts.hostname or DEFAULT_HOST, port or default_port
