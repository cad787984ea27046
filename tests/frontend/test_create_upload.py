"""`mlxspec create` against a daemon that cannot read our files (on another machine): the local model's
files are hashed, HEADed and POSTed to /api/blobs as Ollama's CLI does, and /api/create names them in
`files` / `draft_files`. A daemon on 127.0.0.2 stands for another machine (loopback to the kernel, not to
the CLI), also on 127.0.0.1 for a CLI on its own machine; the CLI's home differs from the daemon's, so it holds no local key: the daemon trusts no path of it.
"""

from __future__ import annotations

import hashlib
import shutil
import socket
import threading
import tracemalloc
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner

from daemon_harness import BackgroundServer, ThreadDaemon
from gguf_fixtures import write_tiny_llama_gguf
from mlxspec import loading
from mlxspec.frontend import uploads
from mlxspec.frontend.cli import cli
from mlxspec.server import Settings
from mlxspec.store import Store

PARAMS = "PARAMETER temperature 0\nPARAMETER num_predict 6\n"
PROMPT = "Once upon a time"
ELSEWHERE = "127.0.0.2"


class ElsewhereDaemon(ThreadDaemon):
    """The daemon in this process on 127.0.0.2 (and on 127.0.0.1, for a CLI on its machine), recording each
    request's method and path."""

    def __init__(self, store: Store):
        super().__init__(store, Settings(max_loaded=4, max_body=1 << 16))  # uploads stream past the body limit
        self.requests: list[tuple[str, str]] = []
        self.app.middlewares.append(self._record)
        self.host, self.url = f"{ELSEWHERE}:{self.port}", f"http://{ELSEWHERE}:{self.port}"

    @web.middleware
    async def _record(self, request, handler):
        self.requests.append((request.method, request.path))
        return await handler(request)

    def start(self):
        self._thread.start()
        self.runner = web.AppRunner(self.app, handler_cancellation=True)
        self.call(self.runner.setup())
        for address in (ELSEWHERE, "127.0.0.1"):
            self.call(web.TCPSite(self.runner, address, self.port).start())
        return self

    def blob_posts(self) -> int:
        return len(self.posted())

    def posted(self) -> list[str]:
        return [path for method, path in self.requests if method == "POST" and path.startswith("/api/blobs/")]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = ElsewhereDaemon(Store(tmp_path_factory.mktemp("upload-daemon-home")))
    try:
        d.start()
    except OSError as e:  # macOS has no 127.0.0.2 unless an alias is added
        d.stop()
        pytest.skip(f"cannot listen on {ELSEWHERE}: {e}")
    yield d
    d.stop()


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("upload-gguf") / "tiny.gguf", "Q4_0")


@pytest.fixture
def client_home(tmp_path) -> Path:
    return tmp_path / "client-home"


def invoke(host: str, home: Path, args: list[str]):
    return CliRunner().invoke(cli, args, env={"MLXSPEC_HOST": host, "MLXSPEC_HOME": str(home)})


def by_path(daemon, name: str, modelfile: Path):
    """The same Modelfile created from the path by a CLI on the daemon's machine (its home: the local key)."""
    made = invoke(f"127.0.0.1:{daemon.port}", daemon.state.store.home, ["create", name, "-f", str(modelfile)])
    assert made.exit_code == 0, made.output
    assert Path(daemon.state.store.get(name).target).parent.parent != daemon.state.store.blobs.imports
    return made


def answer(daemon, home: Path, name: str) -> str:
    ran = invoke(daemon.host, home, ["run", name, PROMPT])
    assert ran.exit_code == 0, ran.output
    return ran.stdout


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and lines and lines[-1].startswith("Error: "), result.output
    return lines[-1]


def test_the_files_the_cli_sends_are_those_the_loader_reads():
    assert list(uploads.MODEL_FILES) == loading.HUB_PATTERNS


def test_a_gguf_is_uploaded_once_and_answers_as_its_path_does(daemon, client_home, tmp_path):
    gguf_file = write_tiny_llama_gguf(tmp_path / "tiny.gguf", "Q4_0", seed=5)  # bytes no other test uploads
    (tmp_path / "Modelfile").write_text(f"FROM ./tiny.gguf\n{PARAMS}")
    daemon.requests.clear()
    made = invoke(daemon.host, client_home, ["create", "up-gguf", "-f", str(tmp_path / "Modelfile")])
    assert made.exit_code == 0, made.output
    assert "copying tiny.gguf" in made.stderr and "success" in made.stderr
    assert daemon.blob_posts() == 1
    target = Path(daemon.state.store.get("up-gguf").target)  # the uploaded blob, linked in an import folder
    assert target.name == "tiny.gguf" and target.parent.parent == daemon.state.store.blobs.imports
    assert target.read_bytes() == gguf_file.read_bytes()

    by_path(daemon, "path-gguf", tmp_path / "Modelfile")
    assert answer(daemon, client_home, "up-gguf") == answer(daemon, client_home, "path-gguf") != ""

    daemon.requests.clear()  # again: the daemon has the blob, HEAD says so, nothing is sent
    again = invoke(daemon.host, client_home, ["create", "up-gguf-2", "-f", str(tmp_path / "Modelfile")])
    assert again.exit_code == 0, again.output
    assert "copying" not in again.stderr and "1 of 1 files of tiny.gguf were on the daemon already" in again.stderr
    assert daemon.blob_posts() == 0 and ("HEAD", f"/api/blobs/{_digest(gguf_file)}") in daemon.requests
    assert daemon.state.store.get("up-gguf-2").target == str(target)


def test_a_directory_uploads_only_the_files_a_model_is_loaded_from(daemon, tiny_llama, client_home, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_llama, model)
    wanted = sorted(p.name for p in model.iterdir())
    for junk in ("README.md", ".hidden.json", "optimizer.pt", "consolidated.safetensors", "train.py"):
        (model / junk).write_bytes(b"not a model file")
    (model / "checkpoint-1").mkdir()
    (model / "checkpoint-1" / "config.json").write_text("{}")
    (tmp_path / "Modelfile").write_text(f"FROM ./model\nDRAFT ./model\n{PARAMS}")

    daemon.requests.clear()
    made = invoke(daemon.host, client_home, ["create", "up-dir", "-f", str(tmp_path / "Modelfile")])
    assert made.exit_code == 0, made.output
    manifest = daemon.state.store.get("up-dir")
    assert sorted(p.name for p in Path(manifest.target).iterdir()) == wanted
    assert manifest.draft == manifest.target and manifest.drafter_name == "draft-model"  # draft_files: the same blobs
    assert sorted(daemon.posted()) == sorted(f"/api/blobs/{_digest(model / name)}" for name in wanted)  # each once
    assert not any(junk in made.stderr for junk in ("README", "optimizer", "consolidated", "train.py"))

    by_path(daemon, "path-dir", tmp_path / "Modelfile")
    assert answer(daemon, client_home, "up-dir") == answer(daemon, client_home, "path-dir") != ""


def test_a_large_file_is_streamed_not_read_whole(daemon, client_home, tmp_path):
    big = tmp_path / "big.gguf"  # created, never loaded: bytes of any kind after the magic
    with open(big, "wb") as f:
        f.write(b"GGUF")
        for _ in range(32):
            f.write(bytes(range(256)) * 4096)  # 1 MiB
    tracemalloc.start()
    try:
        made = invoke(daemon.host, client_home, ["create", "big", "--from", str(big)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert made.exit_code == 0, made.output
    assert Path(daemon.state.store.get("big").target).stat().st_size == big.stat().st_size
    assert peak < big.stat().st_size / 3, peak  # the CLI and the daemon (this process) hold a few chunks at most


def test_upload_and_no_upload_choose_against_the_default(daemon, gguf_file, client_home, tmp_path):
    local = f"127.0.0.1:{daemon.port}"
    daemon.requests.clear()  # --upload on the daemon's own machine: files, no path
    forced = invoke(local, daemon.state.store.home, ["create", "forced", "--from", str(gguf_file), "--upload"])
    assert forced.exit_code == 0, forced.output
    assert Path(daemon.state.store.get("forced").target).parent.parent == daemon.state.store.blobs.imports
    assert any(path.startswith("/api/blobs/") for _, path in daemon.requests)

    # --no-upload elsewhere: the path is sent, and this daemon may not read it (no local key); say what helps
    refused = invoke(daemon.host, client_home, ["create", "refused", "--from", str(gguf_file), "--no-upload"])
    line = one_error_line(refused)
    assert "MLXSPEC_MODEL_DIRS" in line and "--upload" in line


def test_a_file_changed_after_hashing_is_a_digest_mismatch(daemon, client_home, tmp_path, monkeypatch):
    model = tmp_path / "changing.gguf"
    model.write_bytes(b"GGUF" + bytes(100_000))
    hash_files = uploads.hash_files

    def then_change(files, path):  # another program writes the file between hashing and sending
        digests = hash_files(files, path)
        model.write_bytes(b"GGUF" + bytes(99_999) + b"!")
        return digests

    monkeypatch.setattr(uploads, "hash_files", then_change)
    result = invoke(daemon.host, client_home, ["create", "changing", "--from", str(model)])
    line = one_error_line(result)
    assert "uploading" in line and "digest mismatch" in line and "did the file change" in line
    assert not daemon.state.store.exists("changing")
    assert not [p for p in daemon.state.store.blobs.root.iterdir() if p.name.endswith(".tmp")]  # nothing half-stored


@pytest.mark.parametrize("make, args, words", [
    (None, ["--from", "./nowhere.gguf"], "from ./nowhere.gguf: no such file or directory"),
    ("FROM ./nowhere.gguf\n", [], "Modelfile line 1: FROM ./nowhere.gguf: no such file or directory"),
    ("FROM {model}\nDRAFT ./nothing\n", [], "Modelfile line 2: DRAFT ./nothing: no such file or directory"),
    ("FROM ./notes.txt\n", [], "is not a model: a GGUF file, or a directory with config.json"),
    ("FROM ./folder\n", [], "is not a model directory: it needs config.json and model*.safetensors"),
])
def test_local_mistakes_are_one_line_before_anything_is_sent(daemon, gguf_file, client_home, tmp_path, make, args, words):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "config.json").write_text("{}")
    if make:
        (tmp_path / "Modelfile").write_text(make.format(model=gguf_file))
        args = ["-f", str(tmp_path / "Modelfile")]
    daemon.requests.clear()
    line = one_error_line(invoke(daemon.host, client_home, ["create", "mistake", *args]))
    assert words in line and len(line) < 300, line
    assert not any(path.startswith(("/api/blobs", "/api/create")) for _, path in daemon.requests)


def test_a_daemon_that_refuses_uploads_is_one_line(gguf_file, client_home):
    async def no_blobs(request):  # a server without the blob API: refuses at once, reading no body
        return web.Response(status=404, text="404: Not Found")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", no_blobs)
    server = BackgroundServer(app).start()
    try:
        line = one_error_line(invoke(server.host, client_home, ["create", "x", "--from", str(gguf_file), "--upload"]))
    finally:
        server.stop()
    assert line == f"Error: uploading {gguf_file}: HTTP 404: 404: Not Found"


def test_a_daemon_that_refuses_an_upload_midway_is_heard(client_home, tmp_path):
    """It answers before reading the body, then closes: the send fails, and its answer is still read."""
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_refuse_uploads, args=(listener,), daemon=True).start()
    big = tmp_path / "big.gguf"
    big.write_bytes(b"GGUF" + bytes(16 << 20))
    try:
        host = f"127.0.0.1:{listener.getsockname()[1]}"
        line = one_error_line(invoke(host, client_home, ["create", "x", "--from", str(big), "--upload"]))
    finally:
        listener.close()
    assert line == f"Error: uploading {big}: no room for it"


def _refuse_uploads(listener: socket.socket) -> None:
    """HEAD: 404 (no such blob); anything else: 507 with an Ollama-style error, at once; then close."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # the test closed the listener
            return
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            body = b"" if head.startswith(b"HEAD") else b'{"error": "no room for it"}'
            status = b"404 Not Found" if head.startswith(b"HEAD") else b"507 Insufficient Storage"
            conn.sendall(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (status, len(body), body))
            conn.shutdown(socket.SHUT_WR)


def test_a_daemon_that_wants_a_key_says_so(tmp_path, gguf_file, client_home):
    d = ThreadDaemon(Store(tmp_path / "keyed"), Settings(api_key="secret")).start()
    try:
        line = one_error_line(invoke(d.host, client_home, ["create", "x", "--from", str(gguf_file), "--upload"]))
    finally:
        d.stop()
    assert "HTTP 401 (Unauthorized)" in line and "MLXSPEC_API_KEY" in line


def _digest(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
