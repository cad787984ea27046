"""Curl-level helpers for the daemon tests: raw requests, NDJSON lines, engine instrumentation."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
import urllib.error
import urllib.request

from mlxspec.emit import Event
from mlxspec.store import Manifest

# A template with fill-in-the-middle: `suffix` makes /api/generate's suffix usable.
FIM_TEMPLATE = "{% if suffix %}<|im_start|>{{ prompt }}<|im_end|>{{ suffix }}<|im_start|>{% else %}{{ prompt }}{% endif %}"


def post(url: str, body, headers: dict | None = None, method: str = "POST") -> tuple[int, dict | str]:
    """A raw HTTP request (curl-level): status and decoded JSON (or text)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def ndjson_lines(url: str, body: dict) -> tuple[int, list[dict]]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status, [json.loads(line) for line in resp if line.strip()]


def instrument(engine, *, delay: float = 0.0, gate: threading.Event | None = None,
               entered: threading.Event | None = None, finals: list | None = None, fail_after: int | None = None):
    """Wrap engine.generate to slow it, hold it at a gate, record its last event, or fail mid-way."""
    original = engine.generate

    def generate(prompt, options=None, *, cancel=None, format=None):
        if entered is not None:
            entered.set()
        if gate is not None:
            gate.wait(30)
        for i, event in enumerate(original(prompt, options, cancel=cancel, format=format)):
            if fail_after is not None and i >= fail_after:
                raise RuntimeError("injected failure")
            time.sleep(delay)
            if event.done and finals is not None:
                finals.append(event)
            yield event

    engine.generate = generate
    return engine


def scripted(engine, script: dict, prompts: list):
    """For text a tiny random model cannot be made to write: the engine generates as usual (so
    speculation runs and counts), then streams script['text'] instead; prompts collects the prompts."""
    original = engine.generate

    def generate(prompt, options=None, *, cancel=None, format=None):
        prompts.append(engine.tokenizer.decode(prompt))
        last = None
        for last in original(prompt, dataclasses.replace(options, max_tokens=8), cancel=cancel):  # quick
            pass
        *pieces, end = script["text"]
        for piece in pieces:
            yield Event(text=piece)
        yield Event(text=end, done=True, finish_reason="stop", stats=last.stats)

    engine.generate = generate
    return engine


# A Qwen-like template that shows the tools, earlier calls and tool results in the prompt, and the
# reply a model taught by it writes to call get_weather (hermes format).
TOOL_CALL_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t['function']['name'] }};{% endfor %}</tools>"
    " answer with <tool_call>{json}</tool_call>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% for c in m.get('tool_calls', []) %}call {{ c.function.name }}({{ c.function.arguments | tojson }}){% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOL_CALL_REPLY = ["Checking. <tool_call>{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Paris\"}}</tool_call>"]


@contextlib.contextmanager
def scripted_models(daemon, target, models: dict[str, tuple[str, list[str]]]):
    """Models {name: (template, reply pieces)} on `target`'s weights whose engines stream the scripted
    reply (see `scripted`); yields the list of prompts they were given. Unloaded and unhooked after."""
    registry, original = daemon.state.registry, daemon.state.registry.loader
    prompts, replies = [], dict(models.values())
    registry.loader = lambda m: scripted(original(m), {"text": replies[m.template]}, prompts) \
        if m.template in replies else original(m)
    for name, (template, _) in models.items():
        daemon.state.store.save(name, Manifest(target=str(target), template=template))
    try:
        yield prompts
    finally:
        registry.loader = original
        for name in models:
            post(daemon.url + "/api/generate", {"model": name, "keep_alive": 0})


def assert_splits_at_every_cut(fmt: str, tools: list, text: str, content: str, calls: list) -> None:
    """A reply streamed in two pieces, cut anywhere, through a call format's Splitter: the same content
    out before the end, nothing left over, the same calls."""
    from mlxspec.server.tool_calls import FORMATS, Splitter

    for cut in range(len(text) + 1):
        s = Splitter(FORMATS[fmt], tools)
        out = s.feed(text[:cut]) + s.feed(text[cut:])
        rest, found = s.finish()
        assert (out, rest, found) == (content, "", calls), cut


def assert_clients_get_calls(url: str, model: str, messages: list, tools: list, content: str, call: tuple) -> None:
    """The ollama client's chat, and the openai client's (whole and streamed), get this content and this one
    call (name, arguments), the call markup kept out of the text."""
    import ollama
    import openai

    reply = ollama.Client(host=url).chat(model=model, messages=messages, tools=tools).message
    assert reply.content == content
    assert [(c.function.name, dict(c.function.arguments)) for c in reply.tool_calls] == [call]
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    choice = client.chat.completions.create(model=model, messages=messages, tools=tools).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert (choice.message.tool_calls[0].function.name, json.loads(choice.message.tool_calls[0].function.arguments)) == call
    chunks = [c for c in client.chat.completions.create(model=model, messages=messages, tools=tools, stream=True)
              if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == content
    streamed = [t for c in chunks for t in (c.choices[0].delta.tool_calls or [])]
    assert [(t.function.name, json.loads(t.function.arguments)) for t in streamed] == [call]
