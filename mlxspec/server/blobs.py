"""Ollama's blob API: `HEAD /api/blobs/{digest}` (is it stored?) and `POST /api/blobs/{digest}` (store the
body), what `ollama create` and the client libraries send a model's files with before /api/create's `files`.

The body is streamed to disk (never held whole: aiohttp's body limit does not apply to request.content),
hashed as it arrives, and kept only when its sha256 is the digest; the blob store is mlxspec.blobs.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from ..blobs import Upload
from .requests import ApiError
from .state import STATE

routes = web.RouteTableDef()

WRITE_SIZE = 1 << 20  # bytes handed to the writing thread at a time
# What aiohttp decodes on the way in (or needs no decoding); anything else would be stored still encoded.
ENCODINGS = ("", "identity", "gzip", "x-gzip", "deflate")


@routes.head("/api/blobs/{digest}")
async def head_blob(request: web.Request) -> web.Response:
    blobs, digest = request.app[STATE].store.blobs, request.match_info["digest"]
    if not await asyncio.to_thread(blobs.exists, digest):  # InvalidDigestError: a 400
        raise ApiError(404, f'blob "{digest}" not found')
    return web.Response()


@routes.post("/api/blobs/{digest}")
async def upload_blob(request: web.Request) -> web.Response:
    """201 when stored, 200 when it already was (as Ollama); 400 for a malformed digest or a body of another."""
    blobs, digest = request.app[STATE].store.blobs, request.match_info["digest"]
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ENCODINGS:
        raise ApiError(415, f"unsupported Content-Encoding {encoding!r}: send gzip, deflate or none")
    if await asyncio.to_thread(blobs.exists, digest):
        async for _ in _chunks(request, encoding):  # read, not answered early: a client still sending would fail
            pass
        return web.Response(status=200)
    upload = await asyncio.to_thread(blobs.upload, digest)
    try:
        await _receive(request, upload, encoding)
        await asyncio.to_thread(upload.commit)
    except BaseException:  # a mismatch, a client gone (cancelled, connection reset), a full disk: no partial blob
        upload.discard()
        raise
    return web.Response(status=201)


async def _chunks(request: web.Request, encoding: str):
    """The body as it arrives; one that does not decode (Content-Encoding: gzip on bytes that are not) is a 400."""
    try:
        async for chunk in request.content.iter_any():
            yield chunk
    except (RequestPayloadError, HttpProcessingError) as e:
        raise ApiError(400, f"the body is not valid {encoding or 'plain'} data ({type(e).__name__})") from None


async def _receive(request: web.Request, upload: Upload, encoding: str) -> None:
    """The body into `upload`, written and hashed in a worker thread (the event loop never waits on the disk)."""
    pending, size = [], 0
    async for chunk in _chunks(request, encoding):
        pending.append(chunk)
        size += len(chunk)
        if size >= WRITE_SIZE:
            await asyncio.to_thread(upload.write, b"".join(pending))
            pending, size = [], 0
    if pending:
        await asyncio.to_thread(upload.write, b"".join(pending))
