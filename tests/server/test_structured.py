"""Structured output through the real clients: Ollama `format`, OpenAI `response_format`.

`tiny` drafts with itself (speculation on); `tiny-plain` does not: the JSON must be the same.
"""

from __future__ import annotations

import json

import ollama
import openai
import pytest

pytest.importorskip("llguidance")

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["ok", "n"], "additionalProperties": False}
USER = [{"role": "user", "content": "Answer in JSON."}]


def valid(text: str) -> dict:
    value = json.loads(text)
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and 0 <= value["n"] <= 9
    return value


def test_ollama_format_schema_with_and_without_speculation(daemon):
    client = ollama.Client(host=daemon.url)
    drafted = client.chat(model="tiny", messages=USER, format=SCHEMA, options={"num_predict": 100})
    plain = client.chat(model="tiny-plain", messages=USER, format=SCHEMA, options={"num_predict": 100})
    valid(drafted.message.content)
    assert drafted.message.content == plain.message.content and drafted.done_reason == "stop"
    streamed = "".join(c.message.content for c in client.chat(model="tiny", messages=USER, format=SCHEMA, stream=True,
                                                               options={"num_predict": 100}))
    assert streamed == drafted.message.content
    generated = client.generate(model="tiny", prompt="JSON please", format="json", options={"num_predict": 40})
    assert generated.response.lstrip().startswith("{")  # an object (a random model may not close it in 40 tokens)
    if generated.done_reason == "stop":
        assert isinstance(json.loads(generated.response), dict)


def test_openai_response_format(daemon):
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    out = client.chat.completions.create(model="tiny", messages=USER, response_format=schema, max_tokens=100)
    valid(out.choices[0].message.content)
    obj = client.chat.completions.create(model="tiny", messages=USER, response_format={"type": "json_object"}, max_tokens=100)
    assert obj.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=USER, response_format={"type": "json_schema",
                                       "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
    assert "format" in e.value.message


@pytest.mark.parametrize("response_format, missing", [
    ({"type": "json_schema"}, "'response_format.json_schema'"),
    ({"type": "json_schema", "json_schema": {"name": "answer"}}, "'response_format.json_schema.schema'"),
    ({"type": "json_schema", "json_schema": {"name": "answer", "schema": None}}, "'response_format.json_schema.schema'"),
])
def test_a_json_schema_format_without_its_schema_is_a_400_naming_it(daemon, response_format, missing):
    """As OpenAI answers: no schema is no silent fallback to any JSON object."""
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=USER, response_format=response_format, max_tokens=4)
    assert e.value.status_code == 400 and f"Missing required parameter: {missing}" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:  # the Responses API's flattened text.format alike
        client.responses.create(model="tiny", input="hi", text={"format": {"type": "json_schema", "name": "answer"}})
    assert "Missing required parameter: 'text.format.schema'" in e.value.message
