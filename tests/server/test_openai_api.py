"""The OpenAI-compatible API with the official `openai` Python client against our daemon."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from api_helpers import instrument, post
from mlxspec.store import load_engine

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
KEEP_DRAFTING = {"options": {"adaptive": False}}  # an Ollama options object rides along in extra_body


@pytest.fixture
def client(daemon):
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)


def test_chat_completion_with_draft(client):
    out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0, extra_body=KEEP_DRAFTING)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.message.content and choice.finish_reason == "length"
    assert out.usage.completion_tokens == 10 and out.usage.total_tokens == out.usage.prompt_tokens + 10
    spec = out.model_extra["speculative"]
    assert spec["drafter"] == "draft-model" and spec["drafted"] > 0 and spec["accepted"] == spec["drafted"]


def test_chat_completion_streaming_with_usage(client):
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0)
    chunks = list(client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=KEEP_DRAFTING,
    ))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
    assert finish[0].model_extra["speculative"]["drafted"] > 0
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10

    no_usage = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3, stream=True, temperature=0))
    assert all(c.usage is None for c in no_usage)


def test_completions_stream_and_not(client, daemon):
    out = client.completions.create(model="tiny-plain", prompt="Once upon a time", max_tokens=8, temperature=0)
    assert out.object == "text_completion" and out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 8
    parts = list(client.completions.create(model="tiny-plain", prompt="Once upon a time", max_tokens=8, temperature=0,
                                           stream=True, stream_options={"include_usage": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices) == out.choices[0].text
    assert parts[-1].usage.total_tokens == out.usage.total_tokens
    fim = client.completions.create(model="fim", prompt="def f(", suffix="    return x\n", max_tokens=4, temperature=0)
    assert fim.usage.prompt_tokens > client.completions.create(model="fim", prompt="def f(", max_tokens=4).usage.prompt_tokens


def test_sampling_options_map_onto_the_engine(client):
    one = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=1.0, seed=3)
    two = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=1.0, seed=3)
    assert one.choices[0].message.content == two.choices[0].message.content
    off = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0,
                                         extra_body={"options": {"draft_num_predict": 0}})
    assert off.model_extra["speculative"]["drafted"] == 0
    parts = client.chat.completions.create(
        model="tiny", max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": " there"}]}],
    )
    assert parts.usage.completion_tokens == 8


def test_models_and_errors(client, daemon):
    ids = {m.id for m in client.models.list().data}
    assert {"tiny:latest", "tiny-plain:latest"} <= ids
    assert client.models.retrieve("tiny").id == "tiny:latest"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nothing-here")
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nothing-here", messages=MESSAGES)
    assert "not found" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="tiny", input=[])
    assert "input must be" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MESSAGES, n=2)
    assert e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=-1)
    assert "temperature" in e.value.message

    status, body = post(daemon.url + "/v1/chat/completions", b"{not json")
    assert status == 400 and set(body["error"]) == {"message", "type", "param", "code"}
    status, body = post(daemon.url + "/v1/chat/completions", {"model": "tiny", "messages": []})
    assert status == 400 and "messages" in body["error"]["message"]
    # found by benchmarks/fuzz.py: an object as tool_call_id was a 500 (unhashable), not the caller's 400
    status, body = post(daemon.url + "/v1/chat/completions",
                        {"model": "tiny", "messages": [{"role": "tool", "tool_call_id": {}, "content": "x"}]})
    assert status == 400 and "tool_call_id must be a string" in body["error"]["message"]


def test_stream_error_after_start_is_a_final_event(daemon):
    """A failure mid-stream cannot change the status: it arrives as an error event before [DONE]."""
    registry = daemon.state.registry
    original = registry.loader
    registry.loader = lambda m: instrument(load_engine(m), fail_after=1)
    daemon.call(registry.unload("tiny-plain:latest"))
    try:
        body = {"model": "tiny-plain", "messages": MESSAGES, "max_tokens": 50, "stream": True, "temperature": 0}
        req = urllib.request.Request(daemon.url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            events = [line[6:].strip() for line in resp.read().decode().split("\n") if line.startswith("data: ")]
        assert resp.status == 200 and events[-1] == "[DONE]"
        assert "injected failure" in json.loads(events[-2])["error"]["message"]
    finally:
        registry.loader = original
        daemon.call(registry.unload("tiny-plain:latest"))


@pytest.mark.parametrize("max_tokens", [0, -1])
def test_max_tokens_below_one_is_a_400(client, max_tokens):
    """As OpenAI: max_tokens (or max_completion_tokens) below 1 is refused, not an empty answer or no limit."""
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=max_tokens)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=max_tokens)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="tiny-plain", prompt="Once", max_tokens=max_tokens)
