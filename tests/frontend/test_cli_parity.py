"""Command-line details users carry over from Ollama's CLI (-v, list/ps PREFIX, show's one part), and the
errors that must stay one line: an OS error, Ctrl-C (exit 130)."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from click.testing import CliRunner

from aiohttp import web

from daemon_harness import BackgroundServer, ThreadDaemon, free_port
from mlxspec.frontend import cli as cli_module
from mlxspec.frontend.cli import cli
from mlxspec.server import Settings
from mlxspec.store import Manifest, Store


@pytest.fixture(scope="module")
def daemon(tiny_llama, tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("parity-home"))
    for name in ("alpha", "alpine", "beta"):
        store.save(name, Manifest(target=str(tiny_llama), parameters={"num_predict": 2}))
    d = ThreadDaemon(store, Settings()).start()
    yield d
    d.stop()


def invoke(args, host=None, **env):
    return CliRunner().invoke(cli, args, env={"MLXSPEC_HOST": host or f"127.0.0.1:{free_port()}", **env})


def one_line_error(result, words: str) -> bool:
    lines = result.stderr.strip().splitlines()
    return result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: ") and words in lines[0]


def test_short_version_flag():
    result = invoke(["-v"])
    assert result.exit_code == 0 and version("mlxspec") in result.stdout


def test_list_and_ps_take_a_name_prefix(daemon):
    names = [line.split()[0] for line in invoke(["list", "alp"], daemon.host).stdout.splitlines()]
    assert names[0] == "NAME" and sorted(names[1:]) == ["alpha:latest", "alpine:latest"]
    for name in ("alpha", "beta"):
        assert invoke(["run", name, "hi", "--keepalive", "5m"], daemon.host).exit_code == 0
    running = [line.split()[0] for line in invoke(["ps", "be"], daemon.host).stdout.splitlines()]
    assert running == ["NAME", "beta:latest"]


def test_show_takes_one_part(daemon):
    result = invoke(["show", "alpha", "--parameters", "--template"], daemon.host)
    assert one_line_error(result, "only one of"), result.output


def test_an_os_error_is_one_line(tmp_path):
    home = tmp_path / "a-file"
    home.write_text("")  # MLXSPEC_HOME names a file: the store cannot be made there
    result = invoke(["serve"], MLXSPEC_HOME=str(home))
    assert one_line_error(result, str(home)), result.stderr


def test_ctrl_c_exits_130(monkeypatch, tiny_llama):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_module, "Client", lambda: pytest.fail("no daemon is asked"))
    from mlxspec.frontend import generate

    monkeypatch.setattr(generate, "generate_in_process", interrupted)
    result = invoke(["generate", str(tiny_llama), "hi"])
    assert result.exit_code == 130 and "Aborted" not in result.stderr, result.stderr


def test_run_with_an_empty_prompt_loads_the_model(daemon):
    """Ollama's FAQ preloads a model with `ollama run MODEL ""`: loaded, nothing asked, exit 0."""
    assert "gamma" not in invoke(["ps"], daemon.host).stdout
    daemon.state.store.save("gamma", daemon.state.store.get("alpha"))
    result = invoke(["run", "gamma", "", "--keepalive", "5m"], daemon.host)
    assert result.exit_code == 0 and result.stdout.strip() == "", result.output
    assert "gamma:latest" in invoke(["ps"], daemon.host).stdout


def test_an_error_page_is_one_line():
    """A daemon's 500 page (aiohttp's has blank lines), or another server's HTML: still one line."""
    async def broken(request):
        return web.Response(status=500, text="500 Internal Server Error\n\nServer got itself in trouble")

    app = web.Application()
    app.router.add_get("/api/tags", broken)
    server = BackgroundServer(app).start()
    try:
        result = invoke(["list"], server.host)
    finally:
        server.stop()
    assert one_line_error(result, "HTTP 500: 500 Internal Server Error Server got itself in trouble"), result.stderr
