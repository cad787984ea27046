"""OpenAI's Responses API: POST /v1/responses (Codex and other agents), over the chat machinery.

`input` (a string, or items: messages, `function_call`s and their `function_call_output`s) and
`instructions` become chat messages; `tools` are flat function tools; the reply comes back as output
items: `reasoning` (thinking), a `message` with `output_text`, and `function_call`s. Stateless, as
Ollama's: `previous_response_id` is refused (send the whole conversation, as `store: false` does).
Streaming sends the typed events (`response.created`, `response.output_text.delta`, ...,
`response.completed`), each with its `event:` line.
"""

from __future__ import annotations

import json
import secrets
import time

from aiohttp import web

from .openai_routes import json_schema, options, think_field
from .prompts import chat_build, check_messages
from .requests import ApiError, field, format_field, read_json
from .scheduler import Job
from .state import STATE
from .streams import serve_reply
from .tool_calls import Found, ToolCall

routes = web.RouteTableDef()


@routes.post("/v1/responses")
async def responses(request: web.Request) -> web.StreamResponse:
    state, body = request.app[STATE], await read_json(request)
    name, manifest = state.manifest(field(body, "model", str, required=True))
    if body.get("previous_response_id") is not None:
        raise ApiError(400, "previous_response_id is not supported: send the whole conversation in input")
    messages = check_messages(input_messages(body), openai=True)
    tools, found = _tools(body), Found()
    think = think_field({"reasoning_effort": (field(body, "reasoning", dict, {}) or {}).get("effort")})
    opts = options({**body, "max_tokens": field(body, "max_output_tokens", int)}, manifest)
    job = Job(name, manifest, chat_build(manifest, name, messages, tools, think, found, opts.num_ctx), opts,
              format=_text_format(body))
    head = {"id": f"resp_{secrets.token_hex(12)}", "object": "response", "created_at": int(time.time()),
            "model": name, "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
            "parallel_tool_calls": True, "instructions": body.get("instructions"), "metadata": {}}
    return await serve_reply(request, state.scheduler, job, found, field(body, "stream", bool, False),
                             lambda events: _stream(events, head),
                             lambda text, calls, thoughts, last: _response(head, _items(thoughts, text, calls), last), _error)


def input_messages(body: dict) -> list[dict]:
    """`instructions` and `input` as chat messages (OpenAI chat shapes, checked by check_messages)."""
    out = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    items = field(body, "input", (str, list), required=True)
    if isinstance(items, str):
        return out + [{"role": "user", "content": items}]
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ApiError(400, f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            out.append({"role": item.get("role"), "content": _content(item.get("content"), i)})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") and not out[-1]["content"]:
                out[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")  # a string, or content parts (as a message's, checked alike)
            output = _content(output, i) if isinstance(output, list) else output
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": output if isinstance(output, (str, list)) else json.dumps(output)})
        elif kind != "reasoning":  # earlier reasoning is not shown to the model again
            raise ApiError(400, f"input[{i}].type {kind!r} is not supported (message, function_call, function_call_output)")
    if all(m["role"] in ("system", "developer") for m in out):
        raise ApiError(400, "input must hold at least one message, function call or function call output")
    return out


def _content(content, i: int):
    """A message's content: a string, or input_text/output_text parts (as chat's text parts)."""
    if not isinstance(content, list):
        return content
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text")})
        else:
            what = "this model does not support images" if "image" in str(kind) else f"content type {kind!r} is not supported"
            raise ApiError(400, f"input[{i}].content: {what}")
    return parts


def _tools(body: dict) -> list | None:
    """Responses' flat function tools -> chat's {"type": "function", "function": {...}}."""
    choice = body.get("tool_choice")
    if choice == "none":
        return None
    if choice not in (None, "auto"):
        raise ApiError(400, "tool_choice: only \"auto\" and \"none\" are supported (a call cannot be forced)")
    tools = field(body, "tools", list)
    out = []
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise ApiError(400, f"tools[{i}]: only function tools ({{\"type\": \"function\", \"name\": ...}}) are supported")
        out.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters") if k in tool}})
    return out or None


def _text_format(body: dict):
    """`text.format`: text, json_object or json_schema (its schema), as chat's response_format."""
    fmt = (field(body, "text", dict, {}) or {}).get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return format_field("json")
    if kind == "json_schema":  # the Responses API flattens json_schema's fields into the format
        return format_field(json_schema(fmt, "text.format"))
    raise ApiError(400, "text.format.type must be text, json_object or json_schema")


# -- output ------------------------------------------------------------------------------------


def _reasoning(thinking: str, done: bool = True) -> dict:
    return {"type": "reasoning", "id": f"rs_{secrets.token_hex(8)}", "summary": [],
            "content": [{"type": "reasoning_text", "text": thinking}], **({} if done else {"status": "in_progress"})}


def _message(text: str, done: bool = True) -> dict:
    return {"type": "message", "id": f"msg_{secrets.token_hex(8)}", "role": "assistant",
            "status": "completed" if done else "in_progress",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if done else []}


def _call(call: ToolCall) -> dict:
    return {"type": "function_call", "id": f"fc_{secrets.token_hex(8)}", "call_id": f"call_{secrets.token_hex(8)}",
            "name": call.name, "arguments": json.dumps(call.arguments), "status": "completed"}


def _items(thinking: str, text: str, calls: list[ToolCall]) -> list[dict]:
    return ([_reasoning(thinking)] if thinking else []) + ([_message(text)] if text or not calls else []) + \
        [_call(c) for c in calls]


def _response(head: dict, output: list[dict], last) -> dict:
    stats, length = last.stats, last.finish_reason == "length"
    return {**head, "status": "incomplete" if length else "completed", "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if length else None, "error": None,
            "usage": {"input_tokens": stats.prompt_tokens, "output_tokens": stats.generated_tokens,
                      "total_tokens": stats.prompt_tokens + stats.generated_tokens,
                      "input_tokens_details": {"cached_tokens": stats.cached_tokens},
                      "output_tokens_details": {"reasoning_tokens": 0}},
            "speculative": stats.to_dict()}


async def _stream(events, head: dict):
    """The typed events of one response: reasoning deltas, then the message's text deltas, then calls."""
    seq = iter(range(1 << 62))
    output: list[dict] = []
    open_item = None  # ("reasoning" | "message", item, index, parts of its text)

    def event(kind: str, **fields) -> dict:
        return {"type": kind, "sequence_number": next(seq), **fields}

    def close():
        nonlocal open_item
        kind, item, index, parts = open_item
        text = "".join(parts)
        if kind == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            yield event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=text)
            yield event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part)
            item = {**item, "status": "completed", "content": [part]}
        else:
            yield event("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0, text=text)
            item = {**item, "content": [{"type": "reasoning_text", "text": text}]}
            item.pop("status", None)
        output[index] = item
        yield event("response.output_item.done", output_index=index, item=item)
        open_item = None

    def start(kind: str):
        nonlocal open_item
        item = _message("", done=False) if kind == "message" else _reasoning("", done=False)
        output.append(item)
        open_item = (kind, item, len(output) - 1, [])
        yield event("response.output_item.added", output_index=len(output) - 1, item=item)
        if kind == "message":
            yield event("response.content_part.added", item_id=item["id"], output_index=len(output) - 1,
                        content_index=0, part={"type": "output_text", "text": "", "annotations": []})

    def text(kind: str, delta: str):
        if open_item is not None and open_item[0] != kind:
            yield from close()
        if open_item is None:
            yield from start(kind)
        _, item, index, parts = open_item
        parts.append(delta)
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        yield event(name, item_id=item["id"], output_index=index, content_index=0, delta=delta)

    started = {**head, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None, "error": None}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    async for content, calls, ev, thinking in events:
        for kind, delta in (("reasoning", thinking), ("message", content)):
            if delta:
                for out in text(kind, delta):
                    yield out
        if ev.done:
            if open_item is None and not calls and not any(o["type"] == "message" for o in output):
                for out in start("message"):  # an empty answer is still a message
                    yield out
            if open_item is not None:
                for out in close():
                    yield out
            for call in calls:
                item, index = _call(call), len(output)
                output.append(item)
                yield event("response.output_item.added", output_index=index, item={**item, "arguments": "", "status": "in_progress"})
                yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=item["arguments"])
                yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index, arguments=item["arguments"])
                yield event("response.output_item.done", output_index=index, item=item)
            final = _response(head, output, ev)
            yield event("response.completed" if final["status"] == "completed" else "response.incomplete", response=final)


def _error(message: str) -> dict:
    return {"type": "error", "code": "server_error", "message": message, "param": None}
