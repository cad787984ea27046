"""Ollama's generation API: /, /api/version, /api/generate, /api/chat (embeddings: embed_routes.py)."""

from __future__ import annotations

import dataclasses
import secrets
import string
import time
from importlib.metadata import version as package_version
from typing import Callable

from aiohttp import web

from ..options import GenerateOptions
from ..store import Manifest
from . import logprobs as logprob_fields
from .prompts import GeneratePrompt, chat_build, check_messages, fitted_generate_ids, reply_splitter
from .requests import ApiError, check_tools, field, format_field, model_field, parse_duration, read_json
from .scheduler import Job
from .state import STATE, State
from .streams import ndjson, now_iso, ns
from .tool_calls import Found, ToolCall, pieces

OLLAMA_VERSION = "0.6.4"  # the Ollama API level we follow; clients such as VS Code check >= 0.6.4

CALL_ID_LETTERS = string.ascii_lowercase + string.digits
routes = web.RouteTableDef()


@routes.get("/")  # aiohttp answers HEAD on GET routes
async def root(request: web.Request) -> web.Response:
    # Ollama's exact words: clients and editors probe for this string to find a daemon
    return web.Response(text="Ollama is running")


@routes.get("/api/version")
async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": OLLAMA_VERSION, "mlxspec_version": package_version("mlxspec")})


@routes.post("/api/generate")
async def generate(request: web.Request) -> web.StreamResponse:
    state, body = request.app[STATE], await read_json(request)
    name, manifest = state.manifest(model_field(body))
    keep_alive = keep_alive_field(body)
    refuse_unsupported(body)
    prompt, suffix = field(body, "prompt", str, ""), field(body, "suffix", str, "")
    if not prompt and not suffix:
        return await load_or_unload(state, name, manifest, keep_alive, {"response": ""})
    req = GeneratePrompt(
        prompt,
        system=field(body, "system", str),
        template=field(body, "template", str),
        suffix=suffix or None,
        raw=field(body, "raw", bool, False),
        context=context_field(body),
    )
    found, opts, truncate = Found(), options(body, manifest), field(body, "truncate", bool, True)

    def build(engine):
        ids = fitted_generate_ids(engine, manifest, req, opts, truncate)
        if not req.raw:  # a harmony reply (gpt-oss): its reasoning goes to `thinking`, as Ollama's
            found.thinking = reply_splitter(engine, manifest, ids, None, req.template)
        return ids

    job = Job(name, manifest, build, opts, keep_alive, format=format_field(body.get("format")))
    return await respond(request, state, job, field(body, "stream", bool, True), _response, not req.raw, found)


def _response(text: str, _calls: list, thinking: str = "") -> dict:
    return {"response": text, **({"thinking": thinking} if thinking else {})}


@routes.post("/api/chat")
async def chat(request: web.Request) -> web.StreamResponse:
    state, body = request.app[STATE], await read_json(request)
    name, manifest = state.manifest(model_field(body))
    keep_alive = keep_alive_field(body)
    refuse_unsupported(body, chat=True)
    messages = check_messages(field(body, "messages", list, []))
    if not messages:
        return await load_or_unload(state, name, manifest, keep_alive, _message("", []))
    tools, think, found = check_tools(field(body, "tools", list)), think_field(body), Found()

    opts = options(body, manifest)
    build = chat_build(manifest, name, messages, tools, think, found,  # the reasoning goes to message.thinking
                       opts.num_ctx, field(body, "truncate", bool, True))
    job = Job(name, manifest, build, opts, keep_alive, format=format_field(body.get("format")))
    return await respond(request, state, job, field(body, "stream", bool, True), _message, found=found)


# -- request pieces ----------------------------------------------------------------------------


def keep_alive_field(body: dict) -> float | None:
    value = body.get("keep_alive")
    return None if value is None else parse_duration(value)


def context_field(body: dict) -> list[int]:
    context = field(body, "context", list, [])
    context = [int(t) if isinstance(t, float) and t.is_integer() else t for t in context]  # 4.0 is 4 in JSON
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in context):
        raise ApiError(400, "context must be a list of token ids")
    return context


def options(body: dict, manifest: Manifest) -> GenerateOptions:
    """Request options over the model's parameters; Ollama's default num_predict is -1 (to EOS);
    `logprobs` / `top_logprobs` are request fields, not options."""
    opts = manifest.options(field(body, "options", dict, {}), defaults={"num_predict": -1})
    top = logprob_fields.requested(body)
    return opts if top is None else dataclasses.replace(opts, logprobs=top)


def think_field(body: dict) -> bool | str | None:
    """`think`: a boolean, or an effort level as Ollama accepts for gpt-oss."""
    think = body.get("think")
    if think is None or isinstance(think, bool) or think in ("low", "medium", "high", "max"):
        return think
    raise ApiError(400, "think must be a boolean or one of low, medium, high, max")


def refuse_unsupported(body: dict, chat: bool = False) -> None:
    if body.get("images"):
        raise ApiError(400, "this model does not support images")
    if not chat and body.get("think") not in (None, False):  # chat passes it to the template
        raise ApiError(400, "think: thinking is only supported on /api/chat")


def _message(text: str, calls: list[ToolCall], thinking: str = "") -> dict:
    message = {"role": "assistant", "content": text, **({"thinking": thinking} if thinking else {})}
    if calls:
        message["tool_calls"] = [_tool_call(c, i) for i, c in enumerate(calls)]
    return {"message": message}


def _tool_call(call: ToolCall, index: int) -> dict:
    """As Ollama's api.ToolCall: an `id` (its toolCallId: call_ and 8 of [a-z0-9]) that a tool message's
    tool_call_id answers, and `function.index`, the call's place in the reply (a reply's calls come in one chunk)."""
    return {"id": "call_" + "".join(secrets.choice(CALL_ID_LETTERS) for _ in range(8)),
            "function": {"index": index, "name": call.name, "arguments": call.arguments}}


# -- responses ---------------------------------------------------------------------------------


async def load_or_unload(state: State, name: str, manifest: Manifest, keep_alive: float | None, piece: dict):
    """An empty prompt loads the model (done_reason 'load'); with keep_alive 0 it unloads it."""
    start = time.perf_counter()
    load = 0.0
    if keep_alive == 0:
        await state.registry.unload(name)
        reason = "unload"
    else:
        entry, load = await state.registry.acquire(name, manifest)
        state.registry.release(entry, keep_alive)
        reason = "load"
    return web.json_response(
        {
            "model": name, "created_at": now_iso(), **piece, "done": True, "done_reason": reason,
            "total_duration": ns(time.perf_counter() - start), "load_duration": ns(load),
        }
    )


async def respond(
    request: web.Request, state: State, job: Job, stream: bool, piece: Callable[[str, list], dict],
    context: bool = False, found: Found | None = None,
) -> web.StreamResponse:
    """Run the job; NDJSON chunks then a final object, or one object when not streaming.
    `found` holds the tool-call format, known once the prompt is built (after `session` starts)."""
    async with state.scheduler.session(job):
        events = pieces(job.events(), found)
        if stream:
            return await ndjson(request, _chunks(job, events, piece, context))
        text, calls, tokens, thoughts, lps, last = [], [], [], [], [], None
        async for content, new_calls, event, thinking in events:
            text.append(content)
            thoughts.append(thinking)
            calls += new_calls
            tokens += event.tokens
            lps += event.text_logprobs
            last = event
        whole = {**piece("".join(text), calls, "".join(thoughts)), **_logprobs(job, lps)}
        return web.json_response(final(job, last, whole, tokens if context else None))


async def _chunks(job: Job, events, piece: Callable[..., dict], context: bool):
    tokens: list[int] = []
    pending: list = []  # logprobs of tokens whose text was held back: they go with the next chunk
    async for content, calls, event, thinking in events:
        tokens += event.tokens
        pending += event.text_logprobs
        if calls:  # Ollama sends the calls in a chunk of their own, before the final one
            yield {"model": job.name, "created_at": now_iso(), **piece(content, calls, thinking),
                   **_logprobs(job, pending), "done": False}
            content, thinking, pending = "", "", []
        if event.done:
            yield final(job, event, {**piece(content, [], thinking), **_logprobs(job, pending)}, tokens if context else None)
        elif content or thinking:
            yield {"model": job.name, "created_at": now_iso(), **piece(content, [], thinking),
                   **_logprobs(job, pending), "done": False}
            pending = []


def _logprobs(job: Job, logprobs: list) -> dict:
    """{"logprobs": [...]} where the request asked for them (the final chunk's may be empty)."""
    if job.options.logprobs is None:
        return {}
    return {"logprobs": logprob_fields.ollama(logprobs, job.token_bytes, job.options.logprobs > 0)}


def final(job: Job, event, piece: dict, tokens: list[int] | None) -> dict:
    """The last object: Ollama's counts and nanosecond durations, and the speculation statistics."""
    stats = event.stats
    out = {"model": job.name, "created_at": now_iso(), **piece, "done": True, "done_reason": event.finish_reason}
    if tokens is not None:
        out["context"] = job.prompt_ids + tokens
    out.update(
        total_duration=ns(time.perf_counter() - job.received),
        load_duration=ns(job.load_seconds),
        prompt_eval_count=stats.prompt_tokens,
        prompt_eval_duration=ns(stats.prompt_time),
        eval_count=stats.generated_tokens,
        eval_duration=ns(stats.decode_time),
        speculative=stats.to_dict(),
    )
    return out
