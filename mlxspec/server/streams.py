"""Writing responses: one JSON object, NDJSON lines (Ollama) or server-sent events (OpenAI).

A failure after the first byte cannot change the status any more: it becomes a last
`{"error": ...}` line (NDJSON) or event (SSE), as Ollama and OpenAI clients expect.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import AsyncIterator, Callable

from aiohttp import web

from ..errors import MlxspecError
from .requests import ApiError

log = logging.getLogger("mlxspec.server")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def ns(seconds: float) -> int:
    return int(seconds * 1e9)


def error_message(e: BaseException) -> str:
    """The message a caller sees; internal failures are logged with their traceback."""
    if isinstance(e, ApiError):
        return e.message
    if isinstance(e, MlxspecError):
        return str(e)
    log.error("request failed", exc_info=e)
    return f"internal error: {type(e).__name__}: {e}"


async def ndjson(request: web.Request, objects: AsyncIterator[dict]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    try:
        async for obj in objects:
            await resp.write(json.dumps(obj).encode() + b"\n")
    except (ConnectionResetError, ConnectionError):
        raise  # the client left: the handler cancels the work
    except Exception as e:
        await resp.write(json.dumps({"error": error_message(e)}).encode() + b"\n")
    await resp.write_eof()
    return resp


async def sse(
    request: web.Request, objects: AsyncIterator[dict], error: Callable[[str], dict], named: bool = False
) -> web.StreamResponse:
    """`data: {json}` per object, then `data: [DONE]`; `error(message)` shapes a failure. named: each
    object's `type` also as its `event:` line, and no [DONE] (the Responses API's stream)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)

    async def send(obj: dict) -> None:
        name = f"event: {obj.get('type')}\n".encode() if named else b""
        await resp.write(name + b"data: " + json.dumps(obj).encode() + b"\n\n")

    try:
        async for obj in objects:
            await send(obj)
    except (ConnectionResetError, ConnectionError):
        raise
    except Exception as e:
        await send(error(error_message(e)))
    if not named:
        await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def serve_reply(request: web.Request, scheduler, job, found, stream: bool, events_of: Callable,
                      whole_of: Callable, error: Callable[[str], dict]) -> web.StreamResponse:
    """Run a chat job (the Responses and Messages APIs): its reply as named SSE events
    (`events_of(pieces)`), or whole (`whole_of(content, calls, thinking, last event)` as JSON)."""
    from .tool_calls import collect, pieces

    async with scheduler.session(job):
        events = pieces(job.events(), found)
        if stream:
            return await sse(request, events_of(events), error, named=True)
        return web.json_response(whole_of(*await collect(events)))
