"""Gemma 4's tool calls (<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>, Ollama's model/parsers/
gemma4.go): the parser, at every cut of a streamed reply, and through the ollama and openai clients with a
scripted engine (a tiny random model cannot be made to call)."""

from __future__ import annotations

import ollama
import pytest

from api_helpers import assert_clients_get_calls, assert_splits_at_every_cut, scripted_models
from mlxspec.server.tool_calls import ToolCall, detect, parse_gemma4

# The shape of Gemma 4's chat template: tools declared in the system turn, calls in its own syntax.
TEMPLATE = (
    "<bos>{% if tools or enable_thinking %}<|turn>system\n{% if enable_thinking %}<|think|>{% endif %}{% for t in tools %}<|tool>declaration:{{ t['function']['name'] }}{}<tool|>"
    "{% endfor %}<turn|>\n{% endif %}{% for m in messages %}<|turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}"
    "\n{% if m.tool_calls %}{% for c in m.tool_calls %}<|tool_call>call:{{ c['function']['name'] }}{}<tool_call|>"
    "{% endfor %}{% endif %}{{ m['content'] }}<turn|>\n{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}"
    "{# a model's thoughts: <|channel>thought ... <channel|> #}"
)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "object"}}}}}
REPLY = ['Let me check.<|tool_call>call:get_weather{city:<|"|>Paris, "FR"<|', '"|>,days:3,units:{deg:<|"|>C<|"|>}}',
         "<tool_call|><tool_call|>"]
WANT = {"city": 'Paris, "FR"', "days": 3, "units": {"deg": "C"}}
THINKING = ["<|channel>thought\nThey want", " the weather.<chan",  # thinks, then calls
            'nel|><|tool_call>call:get_weather{city:<|"|>Paris, "FR"<|'] + REPLY[1:]
USER = [{"role": "user", "content": "Weather in Paris?"}]


def test_detected_and_parsed():
    assert detect(TEMPLATE) == "gemma4"
    assert parse_gemma4("".join(REPLY)) == ("Let me check.", [ToolCall("get_weather", WANT)])
    two = '<|tool_call>call:f{a:[1,{b:<|"|>x:y,z<|"|>}]}<tool_call|>\n<|tool_call>call:g{}<tool_call|>'
    assert parse_gemma4(two) == ("", [ToolCall("f", {"a": [1, {"b": "x:y,z"}]}), ToolCall("g", {})])
    assert parse_gemma4('<|tool_call>call:f{note:<|"|>cut off by the end') == ("", [ToolCall("f", {"note": "cut off by the end"})])
    assert parse_gemma4("<|tool_call>call:f{a: not a value}") is None  # text, not a call
    assert parse_gemma4("no call here") is None


def test_splitter_at_every_cut():
    assert_splits_at_every_cut("gemma4", [WEATHER], "".join(REPLY), "Let me check.", [ToolCall("get_weather", WANT)])


@pytest.fixture(scope="module")
def gemma4(daemon, tiny_llama):
    with scripted_models(daemon, tiny_llama, {"gemma4-calls": (TEMPLATE, REPLY), "gemma4-thinks": (TEMPLATE + " ", THINKING)}):
        yield "gemma4-calls"


def test_clients_get_the_calls(daemon, gemma4):
    assert_clients_get_calls(daemon.url, gemma4, USER, [WEATHER], "Let me check.", ("get_weather", WANT))


@pytest.mark.parametrize("think", [True, False])
def test_thinking_then_a_call(daemon, gemma4, think):
    """Its thoughts (<|channel>thought ... <channel|>) go to message.thinking when asked for, and are dropped
    otherwise (as Ollama's parser drops them); the call after them is parsed either way."""
    reply = ollama.Client(host=daemon.url).chat(model="gemma4-thinks", messages=USER, tools=[WEATHER], think=think).message
    assert (reply.thinking or "") == ("They want the weather." if think else "") and not reply.content
    assert [(c.function.name, dict(c.function.arguments)) for c in reply.tool_calls] == [("get_weather", WANT)]
