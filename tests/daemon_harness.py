"""Run the daemon for tests: in this process on a free port (a background thread), or as a
subprocess (`mlxspec serve`) with its own environment, e.g. HF_ENDPOINT pointing at a fake hub.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from aiohttp import web

from mlxspec.frontend.client import Client
from mlxspec.server import Settings, make_app
from mlxspec.server.state import STATE
from mlxspec.store import Store


def without_chat_template(model: Path, path: Path) -> Path:
    """A copy of a model directory without its chat template: a base model."""
    shutil.copytree(model, path)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BackgroundServer:
    """An aiohttp app on 127.0.0.1:<free port>, its event loop in a background thread."""

    def __init__(self, app: web.Application):
        self.app = app
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self):
        self._thread.start()
        self.runner = web.AppRunner(self.app, handler_cancellation=True)
        self.call(self.runner.setup())
        self.call(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        return self

    def call(self, coro, timeout: float = 60):
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.call(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


class ThreadDaemon(BackgroundServer):
    """The daemon in this process."""

    def __init__(self, store: Store, settings: Settings | None = None, registry=None):
        super().__init__(make_app(store, settings or Settings(), registry))

    @property
    def state(self):
        return self.app[STATE]


class ProcessDaemon:
    """`mlxspec serve` in a subprocess; `kill()` ends it the hard way (SIGKILL)."""

    def __init__(self, home: Path, env: dict | None = None):
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"
        self.home = home
        self.env = {**os.environ, **(env or {}), "MLXSPEC_HOME": str(home), "MLXSPEC_HOST": self.host}
        self.log = home / f"serve-{self.port}.log"

    def start(self, timeout: float = 60) -> "ProcessDaemon":
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mlxspec", "serve"],
                env=self.env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
            )
        client, deadline = Client(self.host), time.monotonic() + timeout
        while not client.is_running(timeout=1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not start:\n{self.log.read_text()}")
            time.sleep(0.1)
        return self

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
