"""OpenAI-compatible API: /v1/chat/completions, /v1/completions, /v1/models (embeddings: embed_routes.py).

Errors on these paths take OpenAI's shape (see app.py). As in Ollama, `temperature` defaults to
1.0 here, and an Ollama `options` object (e.g. {"draft_num_predict": 0}) may ride along.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time

from aiohttp import web

from ..options import GenerateOptions
from ..ollama_store import is_reference as is_ollama
from ..store import Manifest, parse_name
from . import logprobs as logprob_fields
from .prompts import GeneratePrompt, chat_build, check_messages, fitted_generate_ids
from .requests import ApiError, check_tools, field, format_field, read_json
from .scheduler import Job
from .state import STATE
from .streams import sse
from .tool_calls import Found, ToolCall, collect, pieces

routes = web.RouteTableDef()
FINISH = {"stop": "stop", "length": "length", "cancelled": "stop"}


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    state, body = request.app[STATE], await read_json(request)
    name, manifest = state.manifest(field(body, "model", str, required=True))
    messages = check_messages(field(body, "messages", list, required=True), openai=True)
    if not messages:
        raise ApiError(400, "messages must not be empty")
    tools, think, found = tools_field(body), think_field(body), Found()

    opts = options(body, manifest, logprob_fields.requested(body))
    build = chat_build(manifest, name, messages, tools, think, found, opts.num_ctx)  # reasoning: message.reasoning
    job = Job(name, manifest, build, opts, format=response_format(body))
    return await _respond(request, job, body, "chatcmpl", "chat.completion", _chat_choice, found)


def tools_field(body: dict) -> list | None:
    """`tools`; `tool_choice` "none" drops them (the model is not told), other choices cannot be forced."""
    tools = field(body, "tools", list)
    choice = body.get("tool_choice")
    if choice == "none":
        return None
    if choice not in (None, "auto"):
        raise ApiError(400, "tool_choice: only \"auto\" and \"none\" are supported (a call cannot be forced)")
    return check_tools(tools)


def think_field(body: dict) -> bool | str | None:
    """OpenAI's reasoning_effort, or Ollama's `think` riding along, as the template's thinking switch."""
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in ("none", "minimal", "low", "medium", "high"):
            raise ApiError(400, "reasoning_effort must be one of none, minimal, low, medium, high")
        return False if effort == "none" else effort
    think = body.get("think")
    if think is None or isinstance(think, bool):
        return think
    raise ApiError(400, "think must be a boolean")


@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.StreamResponse:
    state, body = request.app[STATE], await read_json(request)
    name, manifest = state.manifest(field(body, "model", str, required=True))
    prompt = field(body, "prompt", (str, list), required=True)
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise ApiError(400, "prompt must be a string (or a list of exactly one string)")
        prompt = prompt[0]
    if field(body, "echo", bool, False):
        raise ApiError(400, "echo is not supported")
    req = GeneratePrompt(prompt, suffix=field(body, "suffix", str) or None)
    opts = options(body, manifest, logprob_fields.requested_count(body))
    build = lambda engine: fitted_generate_ids(engine, manifest, req, opts)  # noqa: E731
    job = Job(name, manifest, build, opts, format=response_format(body))
    return await _respond(request, job, body, "cmpl", "text_completion", _text_choice)


@routes.get("/v1/models")
async def models(request: web.Request) -> web.Response:
    entries = request.app[STATE].store.list()
    return web.json_response({"object": "list", "data": [_model(e.name, e.modified_at.timestamp()) for e in entries]})


@routes.get("/v1/models/{model:.+}")
async def model(request: web.Request) -> web.Response:
    store = request.app[STATE].store
    entry = store.entry(request.match_info["model"])
    return web.json_response(_model(entry.name, entry.modified_at.timestamp()))


def _model(name: str, created: float) -> dict:
    owner = "ollama" if is_ollama(name) else parse_name(name)[0]
    return {"id": name, "object": "model", "created": int(created), "owned_by": owner}


def response_format(body: dict) -> str | dict | None:
    """OpenAI's response_format -> the engine's format: json_object -> "json", json_schema -> its schema."""
    fmt = field(body, "response_format", dict)
    kind = fmt.get("type") if fmt else "text"
    if kind == "text":
        return None
    if kind == "json_object":
        return format_field("json")
    if kind == "json_schema":
        return format_field(json_schema(fmt.get("json_schema"), "response_format.json_schema"))
    raise ApiError(400, "response_format.type must be text, json_object or json_schema")


def json_schema(spec, where: str) -> dict:
    """The schema a json_schema format names. Missing, it is a 400 naming the field, as OpenAI answers
    (guessing "any object" would hand the client JSON of a shape it never asked for)."""
    if spec is None:
        raise ApiError(400, f"Missing required parameter: '{where}'.")
    if not isinstance(spec, dict):
        raise ApiError(400, f"{where} must be an object")
    if spec.get("schema") is None:
        raise ApiError(400, f"Missing required parameter: '{where}.schema'.")
    if not isinstance(spec["schema"], dict):
        raise ApiError(400, f"{where}.schema is not a JSON schema object")
    return spec["schema"] or {"type": "object"}  # an empty schema: any JSON object


def options(body: dict, manifest: Manifest, logprobs: int | None = None) -> GenerateOptions:
    """OpenAI sampling fields -> GenerateOptions; what we cannot honour is a 400, not ignored.
    `logprobs`: alternatives per token where the request asks for logprobs (their field differs per API)."""
    if field(body, "n", int, 1) != 1:
        raise ApiError(400, "n must be 1")
    for key in ("frequency_penalty", "presence_penalty"):
        if field(body, key, float, 0) != 0:
            raise ApiError(400, f"{key} is not supported; use options.repeat_penalty")
    opts = field(body, "options", dict, {})
    max_tokens = field(body, "max_completion_tokens", int)
    max_tokens = field(body, "max_tokens", int) if max_tokens is None else max_tokens
    if max_tokens is not None and max_tokens < 1:  # as OpenAI (0 was an empty answer, -1 no limit at all)
        raise ApiError(400, f"Invalid 'max_tokens': integer below minimum value. Expected a value >= 1, got {max_tokens}.")
    for key, value in (
        ("num_predict", max_tokens),
        ("temperature", field(body, "temperature", float)),
        ("top_p", field(body, "top_p", float)),
        ("seed", field(body, "seed", int)),
        ("stop", field(body, "stop", (str, list))),
    ):
        if value is not None:
            opts[key] = value
    opts = manifest.options(opts, defaults={"num_predict": -1, "temperature": 1.0})
    return opts if logprobs is None else dataclasses.replace(opts, logprobs=logprobs)


def _chat_choice(text: str, delta: bool, calls: list[ToolCall] = (), thinking: str = "") -> dict:
    message = {"role": "assistant", "content": text if text or not calls else None,
               **({"reasoning": thinking} if thinking else {})}
    if calls:
        message["tool_calls"] = [
            {**({"index": i} if delta else {}), "id": f"call_{secrets.token_hex(8)}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for i, c in enumerate(calls)
        ]
    return {"delta" if delta else "message": message}


def _text_choice(text: str, delta: bool, calls=(), thinking: str = "") -> dict:
    return {"text": text, "logprobs": None}


def _logprob_shape(job: Job, kind: str):
    """list[TokenLogprob] -> a choice's `logprobs` (chat: {"content": [...]}, completions: parallel lists
    with each token's offset in the completion's text), or None where the request did not ask."""
    if job.options.logprobs is None:
        return None
    if kind.startswith("chat"):
        return lambda lps: logprob_fields.openai_chat(lps, job.token_bytes)
    offsets = logprob_fields.TextOffsets()  # the text the earlier chunks' tokens spelled
    return lambda lps: logprob_fields.openai_completion(lps, job.token_bytes, offsets)


async def _respond(request: web.Request, job: Job, body: dict, prefix: str, kind: str, choice,
                   found: Found | None = None) -> web.StreamResponse:
    state = request.app[STATE]
    stream_options = field(body, "stream_options", dict, {})
    head = {"id": f"{prefix}-{secrets.token_hex(6)}", "created": int(time.time()), "model": job.name,
            "system_fingerprint": "fp_mlxspec"}
    shape = _logprob_shape(job, kind)
    async with state.scheduler.session(job):
        events = pieces(job.events(), found)
        if field(body, "stream", bool, False):
            chunks = _chunks(events, head, kind + ("" if kind == "text_completion" else ".chunk"), choice,
                             bool(stream_options.get("include_usage")), shape)
            return await sse(request, chunks, _error)
        logprobs: list = []
        text, calls, thoughts, last = await collect(_noting_logprobs(events, logprobs))
        reason = "tool_calls" if calls else FINISH[last.finish_reason]
        answer = {"index": 0, **choice(text, False, calls, thoughts), "finish_reason": reason}
        if shape is not None:
            answer["logprobs"] = shape(logprobs)
        return web.json_response(
            {**head, "object": kind, "choices": [answer], "usage": _usage(last.stats), "speculative": last.stats.to_dict()}
        )


async def _noting_logprobs(events, logprobs: list):
    async for item in events:
        logprobs += item[2].text_logprobs
        yield item


async def _chunks(events, head: dict, kind: str, choice, include_usage: bool, shape=None):
    """`shape`: a chunk's logprobs (those of the tokens since the last chunk), or None."""
    pending: list = []

    def piece(content: str, calls, thinking: str, reason: str | None) -> dict:
        nonlocal pending
        answer = {"index": 0, **choice(content, True, calls, thinking), "finish_reason": reason}
        if shape is not None:
            answer["logprobs"], pending = shape(pending), []
        return {**head, "object": kind, "choices": [answer]}

    async for content, calls, event, thinking in events:
        pending += event.text_logprobs
        if calls:  # the calls in a chunk of their own, then the finish chunk says "tool_calls"
            yield piece(content, calls, thinking, None)
            content = thinking = ""
        if content or thinking or event.done:
            reason = ("tool_calls" if calls else FINISH[event.finish_reason]) if event.done else None
            chunk = piece(content, (), thinking, reason)
            if event.done:
                chunk["speculative"] = event.stats.to_dict()
            yield chunk
        if event.done and include_usage:
            yield {**head, "object": kind, "choices": [], "usage": _usage(event.stats)}


def _usage(stats) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
    }


def _error(message: str) -> dict:
    return {"error": {"message": message, "type": "api_error", "param": None, "code": None}}
