"""Anthropic's Messages API: POST /v1/messages (Claude Code and other Anthropic clients), over the
chat machinery, as Ollama serves it, and POST /v1/messages/count_tokens (the prompt's size, exact).

`system` and `messages` (text, `tool_use` and `tool_result` blocks) become chat messages; `tools`
({name, description, input_schema}) are offered as function tools. The answer's `content` holds a
`thinking` block (where the model thinks and `thinking` is enabled, or always for harmony), a
`text` block and `tool_use` blocks; `stop_reason` is end_turn, max_tokens, stop_sequence (with
`stop_sequence` naming it) or tool_use. Streaming
sends message_start, content_block_start/delta/stop per block, message_delta and message_stop.
Errors take Anthropic's shape ({"type": "error", "error": {"type", "message"}}: app.py's _error_body), and
the API key may come as x-api-key, as Anthropic's clients send it.
"""

from __future__ import annotations

import asyncio
import json
import secrets

from aiohttp import web

from .openai_routes import options
from .prompts import chat_build, check_messages
from .requests import ApiError, field, read_json
from .scheduler import Job
from .state import STATE
from .streams import serve_reply
from .tool_calls import Found, ToolCall

routes = web.RouteTableDef()
STOP = {"stop": "end_turn", "length": "max_tokens", "cancelled": "end_turn"}


@routes.post("/v1/messages")
async def messages(request: web.Request) -> web.StreamResponse:
    state, body = request.app[STATE], await read_json(request)
    job, found = _job(state, body)
    head = {"id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant", "model": job.name}

    def whole(text: str, calls: list[ToolCall], thoughts: str, last) -> dict:
        return {**head, "content": _blocks(thoughts, text, calls), **_stop(last, calls),
                "usage": _usage(last.stats, True), "speculative": last.stats.to_dict()}

    return await serve_reply(request, state.scheduler, job, found, field(body, "stream", bool, False),
                             lambda events: _stream(events, head, len(job.prompt_ids)), whole, _error)


@routes.post("/v1/messages/count_tokens")
async def count_tokens(request: web.Request) -> web.Response:
    """The `input_tokens` /v1/messages would report for this body (no max_tokens): its prompt, built
    as that route builds it (template, tools, thinking switch, truncation to the window), not run."""
    state, body = request.app[STATE], await read_json(request)
    job, _ = _job(state, body, counting=True)
    entry, _ = await state.registry.acquire(job.name, job.manifest)  # the tokenizer comes with the model
    try:  # on a worker thread, as the scheduler renders templates (time-limited, off the MLX thread)
        ids = await asyncio.get_running_loop().run_in_executor(None, job.build_prompt, entry.engine)
    finally:
        state.registry.release(entry, None)
    return web.json_response({"input_tokens": len(ids)})


def _job(state, body: dict, counting: bool = False) -> tuple[Job, Found]:
    """The body checked and made a chat Job (and the Found its reply's calls go to): shared by
    /v1/messages and count_tokens (`counting`: no max_tokens), so both refuse alike and count one prompt."""
    name, manifest = state.manifest(field(body, "model", str, required=True))
    max_tokens = None if counting else field(body, "max_tokens", int, required=True)
    if max_tokens is not None and max_tokens < 1:  # Anthropic's minimum; -1 would mean no limit to the options
        raise ApiError(400, "max_tokens must be at least 1")
    chat = check_messages(chat_messages(body), openai=True)
    tools, found = _tools(body), Found()
    thinking = field(body, "thinking", dict, {}) or {}
    if thinking.get("type") not in (None, "enabled", "disabled"):
        raise ApiError(400, "thinking.type must be enabled or disabled")
    think = {"enabled": True, "disabled": False}.get(thinking.get("type"))

    extra = {"top_k": field(body, "top_k", int)} if body.get("top_k") is not None else {}
    sampling = {"max_tokens": max_tokens, "temperature": field(body, "temperature", float),
                "top_p": field(body, "top_p", float), "stop": field(body, "stop_sequences", list),
                "options": {**field(body, "options", dict, {}), **extra}}
    opts = options({k: v for k, v in sampling.items() if v is not None}, manifest)
    return Job(name, manifest, chat_build(manifest, name, chat, tools, think, found, opts.num_ctx), opts), found


def chat_messages(body: dict) -> list[dict]:
    """`system` and Anthropic `messages` as chat messages (OpenAI chat shapes, for check_messages)."""
    system = body.get("system")
    if isinstance(system, list):
        system = "".join(_text(b, "system") for b in system)
    out = [{"role": "system", "content": system}] if system else []
    items = field(body, "messages", list, required=True)
    if not items:
        raise ApiError(400, "messages must not be empty")
    for i, m in enumerate(items):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise ApiError(400, f"messages[{i}] must be an object with role user or assistant")
        content = m.get("content")
        if not isinstance(content, list):
            out.append({"role": m["role"], "content": content})
            continue
        texts, calls, results = [], [], 0
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                texts.append(_text(block, f"messages[{i}]"))
            elif kind == "tool_use" and m["role"] == "assistant":
                calls.append({"id": block.get("id"), "type": "function",
                              "function": {"name": block.get("name"), "arguments": block.get("input") or {}}})
            elif kind == "tool_result" and m["role"] == "user":
                result = block.get("content")
                result = "".join(_text(b, f"messages[{i}]") for b in result) if isinstance(result, list) else result
                out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": result or ""})
                results += 1
            elif kind in ("thinking", "redacted_thinking"):
                continue  # earlier reasoning is not shown to the model again
            else:
                what = "this model does not support images" if kind in ("image", "document") else f"content block {kind!r} is not supported here"
                raise ApiError(400, f"messages[{i}].content: {what}")
        if texts or calls or not results:  # (an empty block list is an empty message, not none)
            out.append({"role": m["role"], "content": "".join(texts), **({"tool_calls": calls} if calls else {})})
    last = out[-1]
    if items[-1].get("role") == "assistant" and isinstance(last.get("content"), str) and last["content"] != last["content"].rstrip():
        # a prefill the model continues: Anthropic refuses trailing whitespace (it would end mid-token)
        raise ApiError(400, "messages: final assistant content cannot end with trailing whitespace")
    return out


def _text(block, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise ApiError(400, f"{where}: only text blocks are supported there")
    return block["text"]


def _tools(body: dict) -> list | None:
    choice = field(body, "tool_choice", dict, {}) or {}
    if choice.get("type") == "none":
        return None
    if choice.get("type") not in (None, "auto"):
        raise ApiError(400, "tool_choice: only auto and none are supported (a call cannot be forced)")
    out = []
    for i, tool in enumerate(field(body, "tools", list) or []):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or tool.get("type") not in (None, "custom"):
            raise ApiError(400, f"tools[{i}]: only client tools ({{\"name\", \"description\", \"input_schema\"}}) are supported")
        out.append({"type": "function", "function": {"name": tool["name"], "description": tool.get("description", ""),
                                                      "parameters": tool.get("input_schema") or {"type": "object"}}})
    return out or None


def _tool_use(call: ToolCall) -> dict:
    return {"type": "tool_use", "id": f"toolu_{secrets.token_hex(12)}", "name": call.name, "input": call.arguments}


def _blocks(thinking: str, text: str, calls: list[ToolCall]) -> list[dict]:
    return ([{"type": "thinking", "thinking": thinking, "signature": ""}] if thinking else []) + \
        ([{"type": "text", "text": text}] if text or not calls else []) + [_tool_use(c) for c in calls]


def _stop(last, calls) -> dict:
    """stop_reason, and the stop sequence that ended the text (Anthropic: "stop_sequence" and its string)."""
    if calls:
        return {"stop_reason": "tool_use", "stop_sequence": None}
    matched = getattr(last, "stop_string", None)
    if matched is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": matched}
    return {"stop_reason": STOP[last.finish_reason], "stop_sequence": None}


def _usage(stats, final: bool) -> dict:
    return {"input_tokens": stats.prompt_tokens, "output_tokens": stats.generated_tokens if final else 0}


async def _stream(events, head: dict, input_tokens: int):
    """message_start (with the prompt's size, known once the job started), then each block's start,
    deltas and stop (thinking, text, tool uses), then the end."""
    index, kind = -1, None  # the open block

    def start(new: str):
        nonlocal index, kind
        index, kind = index + 1, new
        block = {"type": "thinking", "thinking": "", "signature": ""} if new == "thinking" else {"type": "text", "text": ""}
        return {"type": "content_block_start", "index": index, "content_block": block}

    def stop():
        nonlocal kind
        kind = None
        return {"type": "content_block_stop", "index": index}

    yield {"type": "message_start", "message": {**head, "content": [], "stop_reason": None, "stop_sequence": None,
                                                "usage": {"input_tokens": input_tokens, "output_tokens": 0}}}
    async for content, calls, ev, thought in events:
        for block, delta in (("thinking", thought), ("text", content)):
            if not delta:
                continue
            if kind != block:
                if kind is not None:
                    yield stop()
                yield start(block)
            yield {"type": "content_block_delta", "index": index,
                   "delta": {"type": "thinking_delta", "thinking": delta} if block == "thinking"
                   else {"type": "text_delta", "text": delta}}
        if not ev.done:
            continue
        if kind is None and index < 0 and not calls:  # an empty answer is still a text block
            yield start("text")
        if kind is not None:
            yield stop()
        for call in calls:
            use, index = _tool_use(call), index + 1
            yield {"type": "content_block_start", "index": index, "content_block": {**use, "input": {}}}
            yield {"type": "content_block_delta", "index": index,
                   "delta": {"type": "input_json_delta", "partial_json": json.dumps(call.arguments)}}
            yield {"type": "content_block_stop", "index": index}
        yield {"type": "message_delta", "delta": _stop(ev, calls), "usage": _usage(ev.stats, True),
               "speculative": ev.stats.to_dict()}
        yield {"type": "message_stop"}


def _error(message: str) -> dict:
    return {"type": "error", "error": {"type": "api_error", "message": message}}
