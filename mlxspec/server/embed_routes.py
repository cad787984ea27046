"""Embeddings: Ollama's /api/embed and /api/embeddings, OpenAI's /v1/embeddings (mlxspec/embed.py).

The vectors are computed on the MLX thread between other requests' steps (no KV cache is shared:
each input runs through a fresh one), with the model acquired and released like a generation.
"""

from __future__ import annotations

import base64
import time

import numpy as np
from aiohttp import web

from ..embed import embed as embed_inputs
from ..errors import PromptError
from .ollama_routes import keep_alive_field
from .requests import ApiError, field, model_field, read_json
from .state import STATE, State
from .streams import ns

routes = web.RouteTableDef()


async def run(state: State, name: str, manifest, inputs: list, truncate: bool, dimensions, keep_alive):
    """(vectors, tokens embedded, load seconds) for `inputs` on model `name`."""
    entry, load = await state.registry.acquire(name, manifest)
    try:
        if not inputs:
            return [], 0, load
        try:
            vectors, count = await state.registry.run(embed_inputs, entry.engine, inputs, truncate, dimensions)
        except PromptError as e:  # empty input, too long with truncate false, ids outside the vocabulary
            raise ApiError(400, str(e)) from None
        return vectors, count, load
    finally:
        state.registry.release(entry, keep_alive)


def _dimensions(body: dict) -> int | None:
    value = field(body, "dimensions", int)
    if value is not None and value < 1:
        raise ApiError(400, "dimensions must be a positive integer")
    return value


@routes.post("/api/embed")
async def embed(request: web.Request) -> web.Response:
    state, body = request.app[STATE], await read_json(request)
    name, manifest = state.manifest(model_field(body))
    raw = body.get("input", [])
    inputs = ([raw] if raw else []) if isinstance(raw, str) else raw  # "": no input (it loads the model), as Ollama
    if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
        raise ApiError(400, "input must be a string or a list of strings")
    start = time.perf_counter()
    vectors, count, load = await run(state, name, manifest, inputs, field(body, "truncate", bool, True),
                                     _dimensions(body), keep_alive_field(body))
    return web.json_response({"model": name, "embeddings": vectors, "total_duration": ns(time.perf_counter() - start),
                              "load_duration": ns(load), "prompt_eval_count": count})


@routes.post("/api/embeddings")
async def embeddings_legacy(request: web.Request) -> web.Response:
    """The older form: one `prompt`, one `embedding` (empty for an empty prompt, as Ollama answers)."""
    state, body = request.app[STATE], await read_json(request)
    name, manifest = state.manifest(model_field(body))
    prompt = field(body, "prompt", str, "")
    vectors, _, _ = await run(state, name, manifest, [prompt] if prompt else [], True, None, keep_alive_field(body))
    return web.json_response({"embedding": vectors[0] if vectors else []})


def _ids(value) -> list[int] | None:
    """A list of token ids (JSON has one number type: 4.0 is 4), else None."""
    if not isinstance(value, list) or not value:
        return None
    ids = [int(t) if isinstance(t, float) and t.is_integer() else t for t in value]
    return ids if all(isinstance(t, int) and not isinstance(t, bool) for t in ids) else None


def _openai_inputs(raw) -> list:
    """OpenAI's input: a string, a list of strings, a list of token ids, or a list of such lists."""
    if isinstance(raw, str):
        return [raw]
    if _ids(raw) is not None:
        return [_ids(raw)]
    if isinstance(raw, list) and raw:
        items = [x if isinstance(x, str) else _ids(x) for x in raw]
        if all(item is not None for item in items):
            return items
    raise ApiError(400, "input must be a string, a list of strings, a list of token ids or a list of such lists")


@routes.post("/v1/embeddings")
async def embeddings(request: web.Request) -> web.Response:
    state, body = request.app[STATE], await read_json(request)
    name, manifest = state.manifest(field(body, "model", str, required=True))
    inputs = _openai_inputs(body.get("input"))
    encoding = field(body, "encoding_format", str, "float")
    if encoding not in ("float", "base64"):
        raise ApiError(400, "encoding_format must be 'float' or 'base64'")
    vectors, count, _ = await run(state, name, manifest, inputs, True, _dimensions(body), None)

    def encoded(v):  # base64 of little-endian float32, as OpenAI's clients decode it
        return base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode() if encoding == "base64" else v

    data = [{"object": "embedding", "index": i, "embedding": encoded(v)} for i, v in enumerate(vectors)]
    return web.json_response({"object": "list", "data": data, "model": name,
                              "usage": {"prompt_tokens": count, "total_tokens": count}})
