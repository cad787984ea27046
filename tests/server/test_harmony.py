"""gpt-oss's harmony replies: reasoning to thinking, the final channel to content, commentary to
functions.NAME to tool calls (mlxspec.server.harmony), checked at every cut of the text and through
the real clients with a scripted engine (a tiny random model cannot be made to write harmony)."""

from __future__ import annotations

import ollama
import openai
import pytest

from api_helpers import post, scripted
from mlxspec.server.harmony import HarmonySplitter, is_harmony
from mlxspec.store import Manifest

TEMPLATE = (  # harmony's shape: messages between <|start|> and <|end|>, channels, tools named
    "{% if tools %}<|start|>developer<|message|>tools: {{ tools | length }}<|end|>{% endif %}"
    "{% for m in messages %}<|start|>{{ m['role'] }}{% if m['role'] == 'assistant' %}<|channel|>final{% endif %}"
    "<|message|>{{ m['content'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
THINK = ["<|channel|>analysis<|mess", "age|>Two and two make four.<|end|><|start|>assistant<|chan",
         "nel|>final<|message|>The answer", " is 4."]
CALL = ["<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary ",
        "to=functions.get_weather <|constrain|>json<|message|>{\"city\": ", "\"Paris\"}"]
USER = [{"role": "user", "content": "What is 2 + 2?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.mark.parametrize("text, thinking, content, calls", [
    ("".join(THINK), "Two and two make four.", "The answer is 4.", []),
    ("".join(CALL), "Need the weather.", "", [("get_weather", {"city": "Paris"})]),
    # the recipient in the header after <|start|>, then <|call|> (when a stop token comes as text)
    ("<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.f<|channel|>commentary json"
     "<|message|>{\"a\": 1}<|call|>", "x", "", [("f", {"a": 1})]),
    ("<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>",
     "", "Let me check.Done.", []),  # a preamble for the user is content
    ("A reply without harmony.", "", "A reply without harmony.", []),  # nothing is lost
    ("<|channel|>commentary to=functions.f<|message|>{not json", "", "", []),  # a broken call is dropped
])
def test_splitter_at_every_cut(text, thinking, content, calls):
    for cut in range(len(text) + 1):
        s = HarmonySplitter()
        parts = [s.feed(text[:cut]), s.feed(text[cut:]), s.finish()]
        got = ("".join(p[0] for p in parts), "".join(p[1] for p in parts), [(c.name, c.arguments) for c in s.calls])
        assert got == (thinking, content, calls), cut


def test_harmony_templates_are_recognised():
    assert is_harmony(TEMPLATE) and not is_harmony("{{ messages }}<|im_start|>") and not is_harmony(None)


@pytest.fixture(scope="module")
def gpt_oss(daemon, tiny_llama):
    registry, original = daemon.state.registry, daemon.state.registry.loader
    scripts = {"harmony-think": THINK, "harmony-call": CALL}

    def loader(m):
        for name, script in scripts.items():
            if m.template == TEMPLATE + f"{{# {name} #}}":
                return scripted(original(m), {"text": script}, [])
        return original(m)

    registry.loader = loader
    for name in scripts:
        daemon.state.store.save(name, Manifest(target=str(tiny_llama), template=TEMPLATE + f"{{# {name} #}}"))
    yield
    registry.loader = original
    for name in scripts:
        post(daemon.url + "/api/generate", {"model": name, "keep_alive": 0})


def test_ollama_chat_splits_harmony(daemon, gpt_oss):
    client = ollama.Client(host=daemon.url)
    assert {"thinking", "tools"} <= set(client.show("harmony-think").capabilities)  # as Ollama lists gpt-oss
    reply = client.chat(model="harmony-think", messages=USER).message
    assert reply.thinking == "Two and two make four." and reply.content == "The answer is 4."
    chunks = list(client.chat(model="harmony-think", messages=USER, stream=True))
    assert "".join(c.message.content for c in chunks) == "The answer is 4."
    called = client.chat(model="harmony-call", messages=USER, tools=[WEATHER]).message
    assert [(c.function.name, dict(c.function.arguments)) for c in called.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert called.content == "" and called.thinking == "Need the weather."


def test_ollama_generate_splits_harmony(daemon, gpt_oss):
    client = ollama.Client(host=daemon.url)
    out = client.generate(model="harmony-think", prompt="What is 2 + 2?")
    assert out.response == "The answer is 4." and out.thinking == "Two and two make four."
    raw = client.generate(model="harmony-think", prompt="<|start|>user<|message|>hi<|end|>", raw=True)
    assert raw.response == "".join(THINK) and not raw.thinking  # raw: the text as written


def test_openai_chat_splits_harmony(daemon, gpt_oss):
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    message = client.chat.completions.create(model="harmony-think", messages=USER).choices[0].message
    assert message.content == "The answer is 4." and message.model_extra["reasoning"] == "Two and two make four."
    choice = client.chat.completions.create(model="harmony-call", messages=USER, tools=[WEATHER]).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [("get_weather", '{"city": "Paris"}')]
