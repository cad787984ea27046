"""The aiohttp application: routes, JSON errors, CORS, optional bearer key, body size limit."""

from __future__ import annotations

import asyncio
import fnmatch
import hmac
import logging

from aiohttp import web

from ..errors import MlxspecError
from ..home import write_local_key
from ..store import ModelNotFoundError, Store
from . import anthropic_routes, blobs, embed_routes, ollama_models, ollama_routes, openai_routes, openapi, responses_routes
from .hosts import host_allowed
from .registry import Registry
from .requests import ApiError
from .state import STATE, Settings, State
from .streams import error_message

log = logging.getLogger("mlxspec.server")
RETRY_AFTER_S = 2


def make_app(store: Store | None = None, settings: Settings | None = None, registry: Registry | None = None) -> web.Application:
    settings = settings or Settings.from_env()
    app = web.Application(
        middlewares=[errors_middleware, host_middleware, cors_middleware, auth_middleware], client_max_size=settings.max_body
    )
    app[STATE] = State(store or Store(ollama_models=settings.ollama_models), settings, registry)
    app.add_routes(ollama_routes.routes)
    app.add_routes(ollama_models.routes)
    app.add_routes(blobs.routes)
    app.add_routes(openai_routes.routes)
    app.add_routes(responses_routes.routes)
    app.add_routes(anthropic_routes.routes)
    app.add_routes(embed_routes.routes)
    app.add_routes(openapi.routes)
    app.on_response_prepare.append(_cors_headers)
    app.on_startup.append(_start)
    app.on_shutdown.append(_close)
    return app


async def _start(app: web.Application) -> None:
    state = app[STATE]
    try:
        for path in await asyncio.to_thread(state.store.clean_leftovers):
            log.info("removed %s, left by an interrupted create or pull", path)
    except OSError as e:
        log.warning("cannot clean %s: %s", state.store.home, e)
    try:
        write_local_key(state.store.home, state.local_key)
    except OSError as e:  # a read-only home: the CLI then needs MLXSPEC_MODEL_DIRS for local paths
        log.warning("cannot write %s/local.key: %s", state.store.home, e)


async def _close(app: web.Application) -> None:
    await app[STATE].close()


def serve(host: str, port: int, store: Store | None = None, settings: Settings | None = None, on_ready=None) -> None:
    """Run the daemon until interrupted; a client that leaves cancels its request handler.

    `on_ready()` is called once the address is bound.
    """
    web.run_app(
        make_app(store, settings), host=host, port=port, handler_cancellation=True, access_log=None,
        print=(lambda _banner: on_ready()) if on_ready else None,
    )


# -- errors ------------------------------------------------------------------------------------


# Anthropic's error types by status (503, our "busy", is their overloaded_error)
ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def _error_body(request: web.Request, status: int, message: str) -> dict:
    if request.path.startswith("/v1/messages"):  # Anthropic's shape: its clients read `type` and `error.type`
        kind = ANTHROPIC_ERRORS.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    if request.path.startswith("/v1/"):  # OpenAI's shape
        kind = {401: "authentication_error", 404: "not_found_error"}.get(status, "invalid_request_error")
        kind = "api_error" if status >= 500 else kind
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return {"error": message}


@web.middleware
async def errors_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as e:
        status, message = e.status, e.message
    except web.HTTPException as e:
        if e.status < 400:
            raise
        status, message = e.status, _http_message(request, e)
    except ModelNotFoundError as e:
        status, message = 404, str(e)
    except MlxspecError as e:  # the caller's mistakes (InvalidNameError, OptionsError, PromptError ...)
        status, message = 400, str(e)
    except (ConnectionError, TimeoutError):
        raise
    except Exception as e:
        status, message = 500, error_message(e)
    # 503 is "busy, come back": tell clients when (both Ollama's and OpenAI's retry on it)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    return web.json_response(_error_body(request, status, message), status=status, headers=headers)


def _http_message(request: web.Request, e: web.HTTPException) -> str:
    if e.status == 404:
        return f"unknown endpoint {request.method} {request.path}"
    if e.status == 405:
        return f"method {request.method} is not allowed on {request.path}"
    if e.status == 413:
        return f"request body too large (limit {request.app[STATE].settings.max_body} bytes, MLXSPEC_MAX_BODY)"
    return e.text or e.reason


# -- Host, CORS and auth -------------------------------------------------------------------------


@web.middleware
async def host_middleware(request: web.Request, handler):
    settings = request.app[STATE].settings
    host = request.headers.get("Host")
    if not host_allowed(host, settings.host, settings.allowed_hosts):
        raise ApiError(403, f"host {host!r} is not allowed: add its name to MLXSPEC_ALLOWED_HOSTS")
    return await handler(request)


def _origin_allowed(request: web.Request, origin: str) -> bool:
    return any(fnmatch.fnmatchcase(origin, pattern) for pattern in request.app[STATE].settings.origins)


@web.middleware
async def cors_middleware(request: web.Request, handler):
    origin = request.headers.get("Origin")
    if origin and not _origin_allowed(request, origin):
        raise ApiError(403, f"origin {origin} is not allowed: add it to MLXSPEC_ORIGINS")
    if origin and request.method == "OPTIONS":  # a preflight: answer it here
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Methods": "GET, HEAD, POST, PUT, DELETE, OPTIONS",
                "Access-Control-Allow-Headers": request.headers.get(
                    "Access-Control-Request-Headers", "Authorization, Content-Type"
                ),
                "Access-Control-Max-Age": "600",
            },
        )
    return await handler(request)


async def _cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    origin = request.headers.get("Origin")
    if origin and _origin_allowed(request, origin):
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Vary"] = "Origin"


@web.middleware
async def auth_middleware(request: web.Request, handler):
    key = request.app[STATE].settings.api_key
    if key and not (request.method == "HEAD" and request.path == "/"):
        scheme, _, given = request.headers.get("Authorization", "").strip().partition(" ")
        # the scheme is case-insensitive (RFC 9110): 'bearer' and 'BEARER' are 'Bearer'; Anthropic's clients
        # (its SDK, Claude Code) send the key as x-api-key instead
        if scheme.lower() != "bearer":
            given = request.headers.get("x-api-key", "")
        if not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise ApiError(401, "missing or wrong API key: send Authorization: Bearer <MLXSPEC_API_KEY>")
    return await handler(request)
