"""Another server on the daemon's port answers 200 with text, or with JSON of another shape: every verb
that reads a reply says so in one line and exits 1, no traceback (the answers here are made up)."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from click.testing import CliRunner

from daemon_harness import BackgroundServer
from mlxspec.frontend.cli import cli

MODEL = {"name": "m:latest", "model": "m:latest", "digest": "0" * 64, "size": 1, "modified_at": "2026-01-01T00:00:00Z",
         "expires_at": "2026-01-01T00:00:00Z"}
# (what every route answers, as JSON unless a str) -> the words the one line must hold
REPLIES = {
    "text": ("<html>a web page</html>", "not a JSON object"),
    "list": ([1, 2], "not a JSON object"),
    "no-models": ({"status": "ok"}, "KeyError"),
    "models-not-a-list": ({"models": 5}, "TypeError"),
    "entry-not-an-object": ({"models": ["m"]}, "TypeError"),
    "size-as-text": ({"models": [{**MODEL, "size": "big"}]}, "TypeError"),
    "bad-dates": ({"models": [{**MODEL, "modified_at": "yesterday", "expires_at": "soon"}]}, "ValueError"),
}


def _foreign_app(reply) -> web.Application:
    """Answers every route, every method, with `reply`; streams it as NDJSON lines where the CLI streams."""
    async def answer(request):
        if isinstance(reply, str):
            return web.Response(text=reply, content_type="text/html")
        if request.path in ("/api/chat", "/api/generate", "/api/pull") and request.method == "POST":
            line = reply if isinstance(reply, dict) else {"response": reply}
            return web.Response(text=json.dumps(line) + "\n", content_type="application/x-ndjson")
        return web.json_response(reply)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    return app


@pytest.fixture(scope="module", params=list(REPLIES))
def foreign(request):
    reply, words = REPLIES[request.param]
    server = BackgroundServer(_foreign_app(reply)).start()
    yield server, words
    server.stop()


@pytest.mark.parametrize("args", [["list"], ["ps"], ["show", "m"], ["show", "m", "--template"], ["run", "m", "hi"]],
                         ids=lambda a: "-".join(a))
def test_a_foreign_reply_is_one_line_and_exit_1(foreign, args):
    server, words = foreign
    result = CliRunner().invoke(cli, args, env={"MLXSPEC_HOST": server.host})
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and not isinstance(result.exception, (TypeError, KeyError, AttributeError, ValueError)), \
        repr(result.exception)
    assert len(lines) == 1 and lines[0].startswith(f"Error: the server at {server.url} answered "), result.stderr
    assert "another server" in lines[0] and "Traceback" not in result.stderr
    if args[0] in ("list", "ps") or words == "not a JSON object":  # (show and run read other fields)
        assert words in lines[0], lines[0]


@pytest.mark.parametrize("args, line", [
    (["run", "m", "hi"], {"message": "hi", "done": True}),
    (["run", "m", "hi"], {"message": {"content": 5}, "done": True}),
    (["run", "m", "hi"], {"response": ["x"], "done": True}),
    (["run", "m", "hi", "--verbose"], {"response": "x", "done": True, "total_duration": "long"}),
    (["pull", "m"], {"status": "pulling x", "digest": "x", "total": "big", "completed": 1}),
])
def test_a_foreign_stream_is_one_line(args, line):
    """show looks right, the streamed lines do not: `run` and `pull` stop with one line, as for show."""
    async def show(request):
        return web.json_response({"mlxspec": {"chat": "message" in line}, "details": {}, "capabilities": []})

    async def answer(request):
        return web.Response(text=json.dumps(line) + "\n", content_type="application/x-ndjson")

    async def root(request):
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", root)
    app.router.add_post("/api/show", show)
    for path in ("/api/chat", "/api/generate", "/api/pull"):
        app.router.add_post(path, answer)
    server = BackgroundServer(app).start()
    try:
        result = CliRunner().invoke(cli, args, env={"MLXSPEC_HOST": server.host})
    finally:
        server.stop()
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and lines[-1].startswith(f"Error: the server at {server.url} answered POST /api/"), result.stderr
    assert "Traceback" not in result.stderr
