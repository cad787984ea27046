"""`mlxspec daemon install|uninstall|status`: the launchd agent (macOS) or systemd user unit (Linux).

The files in the repo's daemon/ directory are the templates; installing writes a copy with the
real path of the `mlxspec` command, then asks launchd or systemd to start it.
"""

from __future__ import annotations

import os
import plistlib
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from ..errors import MlxspecError

DAEMON_DIR = Path(__file__).resolve().parents[2] / "daemon"
LABEL = "com.mlxspec.serve"
UNIT = "mlxspec.service"

Runner = Callable[[list[str]], "subprocess.CompletedProcess"]


def serve_command() -> list[str]:
    """How to start the daemon from a service manager: the installed script, else this Python."""
    exe = shutil.which("mlxspec")
    return [exe, "serve"] if exe else [sys.executable, "-m", "mlxspec", "serve"]


def _template(name: str) -> bytes:
    path = DAEMON_DIR / name
    if not path.is_file():
        raise MlxspecError(f"service template {path} not found: install mlxspec from a source checkout (pip install -e .)")
    return path.read_bytes()


def render_plist(command: list[str], log: Path) -> bytes:
    data = plistlib.loads(_template(f"{LABEL}.plist"))
    data["ProgramArguments"] = command
    data["StandardOutPath"] = data["StandardErrorPath"] = str(log)
    return plistlib.dumps(data)


def render_unit(command: list[str]) -> str:
    text = _template(UNIT).decode()
    return re.sub(r"^ExecStart=.*$", lambda _: "ExecStart=" + shlex.join(command), text, count=1, flags=re.M)


def _paths(home: Path) -> tuple[str, Path]:
    if sys.platform == "darwin":
        return "launchd", home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    if sys.platform.startswith("linux"):
        return "systemd", home / ".config" / "systemd" / "user" / UNIT
    raise MlxspecError(f"no service manager support for {sys.platform}: run `mlxspec serve` yourself")


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise MlxspecError(f"{cmd[0]} not found: is this system running {cmd[0].replace('ctl', '')}?") from None


def _check(result: subprocess.CompletedProcess) -> None:
    if result.returncode != 0:
        detail = (result.stderr or result.stdout or "").strip().splitlines()
        raise MlxspecError(f"{' '.join(result.args)} failed: {detail[0] if detail else 'exit ' + str(result.returncode)}")


def install(home: Path | None = None, run: Runner = _run) -> str:
    home = home or Path.home()
    manager, path = _paths(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    if manager == "launchd":
        log = home / "Library" / "Logs" / "mlxspec.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(render_plist(serve_command(), log))
        run(["launchctl", "bootout", f"gui/{os.getuid()}/{LABEL}"])  # an older copy may be loaded
        _check(run(["launchctl", "bootstrap", f"gui/{os.getuid()}", str(path)]))
    else:
        path.write_text(render_unit(serve_command()))
        _check(run(["systemctl", "--user", "daemon-reload"]))
        _check(run(["systemctl", "--user", "enable", "--now", UNIT]))
    return f"installed {path} ({manager}); the daemon starts now and at every login"


def uninstall(home: Path | None = None, run: Runner = _run) -> str:
    manager, path = _paths(home or Path.home())
    if not path.exists():
        return f"not installed ({path} does not exist)"
    if manager == "launchd":
        run(["launchctl", "bootout", f"gui/{os.getuid()}/{LABEL}"])
    else:
        run(["systemctl", "--user", "disable", "--now", UNIT])
    path.unlink()
    if manager == "systemd":
        run(["systemctl", "--user", "daemon-reload"])
    return f"removed {path}"


def status(home: Path | None = None) -> str:
    manager, path = _paths(home or Path.home())
    return f"{manager}: {'installed at ' + str(path) if path.exists() else 'not installed'}"
