"""Tool calls, think and template-less chat, through the official `ollama` and `openai` clients.

A tiny random model cannot be made to write a tool call, so the model `tools` runs its real engine
(drafting included, for the statistics) and then replaces the text it streams with a script: what
a Qwen-style model asked to call a tool would write. The parsers are also tested on their own.
"""

from __future__ import annotations

import json
import re

import ollama
import openai
import pytest

from api_helpers import ndjson_lines, post, scripted
from mlxspec.server.tool_calls import FORMATS, Splitter, ToolCall, detect, parse_hermes, parse_llama3, parse_mistral
from mlxspec.store import Manifest

# A Qwen/Hermes-like template: the tools, earlier calls (arguments must be objects: `.items()`),
# tool results by name, and a thinking switch.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t['function']['name'] }};{% endfor %}</tools>"
    " answer with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{% if enable_thinking is defined %}thinking={{ enable_thinking }}\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% for c in m.get('tool_calls', []) %}call {{ c.function.name }}"
    "{% for k, v in c.function.arguments.items() %} {{ k }}={{ v }}{% endfor %}{% endfor %}"
    "{% if m.get('tool_name') %} from {{ m['tool_name'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CALL = ['Let me check. <tool', '_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n</tool_call>']
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def tools_model(daemon, tiny_llama):
    script, prompts = {"text": CALL}, []
    registry, original = daemon.state.registry, daemon.state.registry.loader
    registry.loader = lambda m: scripted(original(m), script, prompts) if m.template == TOOL_TEMPLATE else original(m)
    daemon.state.store.save("tools", Manifest(target=str(tiny_llama), draft=str(tiny_llama), template=TOOL_TEMPLATE))
    yield script, prompts
    registry.loader = original
    post(daemon.url + "/api/generate", {"model": "tools", "keep_alive": 0})


def test_parsers_per_family():
    assert parse_hermes('hi <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call><tool_call>{"name": "g", "arguments": "{}"}') \
        == ("hi", [ToolCall("f", {"a": 1}), ToolCall("g", {})])
    assert parse_llama3('<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}') \
        == ("", [ToolCall("f", {"a": 1}), ToolCall("g", {})])
    assert parse_mistral('[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]') == ("", [ToolCall("f", {"a": 1})])
    assert parse_mistral('[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}') == ("", [ToolCall("f", {"a": 1}), ToolCall("g", {})])
    for not_a_call in ('{"a": 1}', '{"name": "f", "parameters": [1]} and more'):
        assert parse_llama3(not_a_call) is None
    assert parse_hermes("<tool_call>{broken</tool_call>") is None and parse_mistral("[TOOL_CALLS] nope") is None
    assert [detect(t) for t in ("x [TOOL_CALLS] y", TOOL_TEMPLATE, "<|python_tag|>", "plain", None)] \
        == ["mistral", "hermes", "llama3", None, None]


PARIS = [ToolCall("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("fmt, text, content, calls", [
    ("hermes", "".join(CALL), "Let me check. ", PARIS),
    ("hermes", "a <tool time, <tool_call>{oops}</tool_call>", "a <tool time, <tool_call>{oops}</tool_call>", []),
    ("llama3", ' {"name": "get_weather", "parameters": {"city": "Paris"}}', "", PARIS),
    ("llama3", 'Sure: <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "Sure: ", PARIS),
    ("llama3", '{"answer": 42} is JSON, not a call', '{"answer": 42} is JSON, not a call', []),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", PARIS),
    ("mistral", "[TOOL]S are brackets", "[TOOL]S are brackets", []),
])
def test_splitter_holds_back_markers_at_every_cut(fmt, text, content, calls):
    """Whatever the streaming pieces, no part of a call leaks out as content, and non-calls survive."""
    for cut in range(len(text) + 1):
        s = Splitter(FORMATS[fmt])
        out = s.feed(text[:cut]) + s.feed(text[cut:])
        assert not calls or out == content, cut  # nothing of the call went out before the end
        rest, got = s.finish()
        assert (out + rest, got) == (content, calls), cut


def test_ollama_client_gets_tool_calls(daemon, tools_model):
    client = ollama.Client(host=daemon.url)
    out = client.chat(model="tools", messages=USER, tools=[WEATHER], options={"temperature": 0})
    assert out.message.content == "Let me check. " and out.done_reason == "stop"
    assert [(c.function.name, dict(c.function.arguments)) for c in out.message.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert "<tools>get_weather;</tools>" in tools_model[1][-1]  # the tools reached the template
    chunks = list(client.chat(model="tools", messages=USER, tools=[WEATHER], stream=True))
    assert "".join(c.message.content for c in chunks) == "Let me check. "
    assert [c.function.name for ch in chunks for c in ch.message.tool_calls or []] == ["get_weather"]
    assert chunks[-1].done and not chunks[-1].message.tool_calls  # the calls came once, before the final chunk


def test_ollama_tool_calls_carry_an_id_and_an_index_as_ollamas(daemon, tools_model):
    """Ollama's api.ToolCall: `id` (call_ + 8 of [a-z0-9]) and `function.index` (the call's place in the
    reply), whole and streamed; the message sent back as it came, with a tool_call_id answering an id,
    reaches the template (the result under its call's name)."""
    two = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' \
          '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    tools_model[0]["text"] = [two]
    try:
        reply = ollama.Client(host=daemon.url).chat(model="tools", messages=USER, tools=[WEATHER]).message
        status, whole = post(daemon.url + "/api/chat", {"model": "tools", "messages": USER, "tools": [WEATHER], "stream": False})
        _, lines = ndjson_lines(daemon.url + "/api/chat", {"model": "tools", "messages": USER, "tools": [WEATHER]})
    finally:
        tools_model[0]["text"] = CALL
    assert [(c.function.name, dict(c.function.arguments)) for c in reply.tool_calls] == \
        [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]  # the client reads them as before
    streamed = [c for line in lines for c in line["message"].get("tool_calls", [])]
    for calls in (whole["message"]["tool_calls"], streamed):
        assert [(c["function"]["index"], c["function"]["arguments"]["city"]) for c in calls] == [(0, "Paris"), (1, "Rome")]
        assert all(re.fullmatch(r"call_[a-z0-9]{8}", c["id"]) for c in calls) and calls[0]["id"] != calls[1]["id"]

    history = USER + [whole["message"], {"role": "tool", "tool_call_id": whole["message"]["tool_calls"][1]["id"],
                                         "content": "rainy"}]
    status, _ = post(daemon.url + "/api/chat", {"model": "tools", "messages": history, "tools": [WEATHER], "stream": False})
    assert status == 200 and "call get_weather city=Rome" in tools_model[1][-1]
    assert "rainy from get_weather" in tools_model[1][-1]


def test_ollama_text_that_is_not_a_call_stays_content(daemon, tools_model):
    tools_model[0]["text"] = ["<tool_call>{not json", "}</tool_call> sorry"]
    try:
        out = ollama.Client(host=daemon.url).chat(model="tools", messages=USER, tools=[WEATHER])
    finally:
        tools_model[0]["text"] = CALL
    assert out.message.content == "<tool_call>{not json}</tool_call> sorry" and not out.message.tool_calls


def test_openai_client_gets_tool_calls(daemon, tools_model):
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(model="tools", messages=USER, tools=[WEATHER], extra_body={"options": {"adaptive": False}})
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check. "
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert out.model_extra["speculative"]["drafted"] > 0  # speculation ran under the parsing

    chunks = list(client.chat.completions.create(model="tools", messages=USER, tools=[WEATHER], stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Let me check. "
    calls = [t for d in deltas for t in d.tool_calls or []]
    assert [(t.index, t.function.name, json.loads(t.function.arguments)) for t in calls] == [(0, "get_weather", {"city": "Paris"})]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]

    # The caller sends the call and its result back: JSON-text arguments reach the template as an object.
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    client.chat.completions.create(model="tools", messages=history, tools=[WEATHER])
    assert "call get_weather city=Paris" in tools_model[1][-1] and "sunny from get_weather" in tools_model[1][-1]
    with pytest.raises(openai.BadRequestError, match="arguments is not valid JSON"):
        bad = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{nope"}}
        client.chat.completions.create(model="tools", messages=USER + [{"role": "assistant", "tool_calls": [bad]}])
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(model="tools", messages=USER, tools=[WEATHER], tool_choice="required")


def test_think_reaches_templates_that_know_it(daemon, tools_model):
    client = ollama.Client(host=daemon.url)
    client.chat(model="tools", messages=USER, think=False)
    assert "thinking=False" in tools_model[1][-1]
    client.chat(model="tools", messages=USER, think=True)
    assert "thinking=True" in tools_model[1][-1]
    caps = post(daemon.url + "/api/show", {"model": "tools"})[1]["capabilities"]
    assert "tools" in caps and "thinking" in caps
    with pytest.raises(ollama.ResponseError, match="think: this model"):
        client.chat(model="tiny", messages=USER, think=True)


def test_model_without_template_chats_as_ollama_default(daemon):
    """Ollama's default template `{{ .Prompt }}` (plus the `{{ .Response }}` its Parse appends), run once per
    turn: user turns and replies verbatim, a user's consecutive messages joined by a blank line, no system."""
    client = ollama.Client(host=daemon.url)
    talk = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Once upon"},
            {"role": "user", "content": "a time"}, {"role": "assistant", "content": " there"},
            {"role": "user", "content": " was"}]
    opts = {"temperature": 0, "num_predict": 6}
    chat = client.chat(model="base", messages=talk, options=opts)
    raw = client.generate(model="base", prompt="Once upon\n\na time there was", raw=True, options=opts)
    assert chat.message.content == raw.response and chat.prompt_eval_count == raw.prompt_eval_count
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    assert oa.chat.completions.create(model="base", messages=talk, max_tokens=6, temperature=0).choices[0].message.content == raw.response
    one = client.generate(model="base", prompt=USER[0]["content"], system="Be brief.", options=opts)  # no system either
    assert one.prompt_eval_count == client.generate(model="base", prompt=USER[0]["content"], raw=True, options=opts).prompt_eval_count
    show = post(daemon.url + "/api/show", {"model": "base"})[1]
    assert show["template"] == "{{ .Prompt }}" and "none came with the model" in show["mlxspec"]["template_source"]


def test_images_to_a_text_model_are_refused(daemon):
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(openai.BadRequestError, match="does not support images"):
        oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [image]}])
    with pytest.raises(ollama.ResponseError, match="does not support images"):
        ollama.Client(host=daemon.url).chat(model="tiny", messages=[{"role": "user", "content": "x", "images": ["AAAA"]}])


def test_gguf_without_template_chats_too(daemon, tmp_path):
    from gguf_fixtures import write_tiny_llama_gguf

    path = write_tiny_llama_gguf(tmp_path / "bare.gguf", qtype="F32", tokenizer="llama")  # no chat template
    daemon.state.store.save("bare-gguf", Manifest(target=str(path)))
    client = ollama.Client(host=daemon.url)
    try:
        out = client.chat(model="bare-gguf", messages=USER, options={"num_predict": 3})
        assert out.done and out.prompt_eval_count == client.generate(model="bare-gguf", prompt=USER[0]["content"], raw=True,
                                                                     options={"num_predict": 1}).prompt_eval_count
        assert "none came with the model" in post(daemon.url + "/api/show", {"model": "bare-gguf"})[1]["mlxspec"]["template_source"]
    finally:
        client.generate(model="bare-gguf", keep_alive=0)


def test_tools_to_a_model_without_a_call_format_are_refused_as_ollama_does(daemon):
    """Ollama answers 400 "NAME does not support tools" (clients then describe tools in text); an empty
    list, or tool_choice "none", asks for no tools and is served."""
    caps = post(daemon.url + "/api/show", {"model": "tiny"})[1]["capabilities"]
    assert "tools" not in caps
    with pytest.raises(ollama.ResponseError, match="tiny:latest does not support tools") as refused:
        ollama.Client(host=daemon.url).chat(model="tiny", messages=USER, tools=[WEATHER])
    assert refused.value.status_code == 400
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="does not support tools"):
        oa.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER], stream=True)
    opts = {"temperature": 0, "num_predict": 4}
    assert ollama.Client(host=daemon.url).chat(model="tiny", messages=USER, tools=[], options=opts).done
    out = oa.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER], tool_choice="none", max_tokens=4,
                                     temperature=0)  # greedy: sampled tokens may end early
    assert out.choices[0].finish_reason == "length"


def test_a_template_that_shows_tools_in_an_unknown_format_is_served(daemon):
    """It sees the tools (as Ollama's `.Tools`); mlxspec cannot parse its calls, so they stay text."""
    template = "{% if tools %}TOOLS {{ tools | length }}\n{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    daemon.state.store.save("odd-tools", Manifest(target=daemon.state.store.named("tiny")[1].target, template=template))
    client = ollama.Client(host=daemon.url)
    assert "tools" in client.show("odd-tools").capabilities  # listed, as Ollama lists any `.Tools` template
    out = client.chat(model="odd-tools", messages=USER, tools=[WEATHER], options={"temperature": 0, "num_predict": 4})
    assert out.done and not out.message.tool_calls


@pytest.mark.parametrize("tool, match", [
    (1, r"tools\[0\] must be"),  # was a 500 (the template library refused it)
    ({"type": "function"}, r"tools\[0\] must be"),  # was a 400 "template error: ... has no attribute 'function'"
    ({"type": "web_search"}, r"tools\[0\] must be"),
    ({"type": "function", "function": {"description": "no name"}}, r"tools\[0\]\.function\.name"),  # was served
    ({"type": "function", "function": {"name": "f", "parameters": "x"}}, r"tools\[0\]\.function\.parameters"),
])
def test_malformed_tools_are_400s_naming_the_field(daemon, tools_model, tool, match):
    """As OpenAI: a tool that is not {"type": "function", "function": {"name", "parameters"?: object}} is a 400
    naming the field, before any template sees it; /api/chat checks its tools alike (tools: [1] was a 500 there)."""
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=match):
        client.chat.completions.create(model="tools", messages=USER, tools=[WEATHER, tool][::-1], max_tokens=2)
    status, out = post(daemon.url + "/api/chat", {"model": "tools", "messages": USER, "tools": [tool], "stream": False})
    assert status == 400 and re.search(match, out["error"])
