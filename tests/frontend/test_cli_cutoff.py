"""A stream the daemon cuts off (it was killed) is an error for the CLI: one line, exit 1."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from click.testing import CliRunner

from daemon_harness import BackgroundServer
from mlxspec.frontend.cli import cli


def _cut_stream_app(abort: bool) -> web.Application:
    """A daemon that answers show, then streams a few objects of generate/pull and dies."""

    async def show(request):
        return web.json_response({"mlxspec": {"chat": False}, "details": {}, "model_info": {}})

    async def root(request):
        return web.Response(text="ok")

    async def cut(request):
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        for line in ({"response": "Once upon", "done": False}, {"status": "pulling x", "digest": "x", "total": 9, "completed": 1}):
            await resp.write(json.dumps(line).encode() + b"\n")
        if abort:  # as kill -9: the socket closes mid-response, no last chunk
            request.transport.abort()
        else:  # a clean end of the body, but no final object
            await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/", root)
    app.router.add_post("/api/show", show)
    app.router.add_post("/api/generate", cut)
    app.router.add_post("/api/pull", cut)
    return app


@pytest.mark.parametrize("abort", [True, False])
@pytest.mark.parametrize("args", [["run", "tiny", "hello"], ["pull", "tiny"]])
def test_a_cut_off_stream_is_an_error(args, abort):
    server = BackgroundServer(_cut_stream_app(abort)).start()
    try:
        result = CliRunner().invoke(cli, args, env={"MLXSPEC_HOST": server.host})
    finally:
        server.stop()
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: ") and "daemon" in lines[-1] and "Traceback" not in result.stderr, result.stderr
