"""MLXSPEC_HOME (manifests, logs, the daemon's pid) and the local key file in it.

The daemon writes a fresh random key to MLXSPEC_HOME/local.key (mode 0600) at start-up; a CLI
that can read it runs as the same user on the same machine, so the daemon may read local paths
it names (see server/references.py). Remote callers cannot read it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

HOME_ENV = "MLXSPEC_HOME"
LOCAL_KEY_FILE = "local.key"
LOCAL_KEY_HEADER = "X-Mlxspec-Local-Key"


def default_home(env=os.environ) -> Path:
    return Path(env.get(HOME_ENV) or "~/.mlxspec").expanduser()


def write_local_key(home: Path, key: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=home, prefix=".", suffix=".tmp")  # created 0600
    with os.fdopen(fd, "w") as f:
        f.write(key)
    os.replace(tmp, home / LOCAL_KEY_FILE)


def read_local_key(home: Path | None = None) -> str | None:
    try:
        return ((home or default_home()) / LOCAL_KEY_FILE).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None
