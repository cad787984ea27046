"""Anthropic's POST /v1/messages/count_tokens through the real `anthropic` client: the count is the
`input_tokens` /v1/messages reports for the same request (template, system, tools, thinking switch,
truncation to the window), nothing is generated, and its refusals are those of /v1/messages."""

from __future__ import annotations

import anthropic
import pytest

from api_helpers import TOOL_CALL_REPLY, TOOL_CALL_TEMPLATE, post, scripted_models
from test_anthropic_api import REFUSALS, THINK, THINK_TEMPLATE, USER, WEATHER

USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
TOOL_TURNS = [{"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, USE]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C, sunny"}]}]
LONG = [{"role": r, "content": f"message {i} " + "words " * 4} for i, r in enumerate(["user", "assistant"] * 3 + ["user"])]


@pytest.fixture(scope="module")
def client(daemon, tiny_llama):
    models = {"count-caller": (TOOL_CALL_TEMPLATE, TOOL_CALL_REPLY), "count-thinker": (THINK_TEMPLATE, THINK)}
    with scripted_models(daemon, tiny_llama, models) as prompts:
        yield anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0), prompts


@pytest.mark.parametrize("request_", [
    {"model": "tiny", "messages": USER},
    {"model": "tiny", "messages": USER, "system": [{"type": "text", "text": "Be brief."}]},
    {"model": "count-caller", "messages": TOOL_TURNS, "system": "Be brief.", "tools": [WEATHER]},
    {"model": "count-caller", "messages": USER, "tools": [WEATHER], "tool_choice": {"type": "none"}},
    {"model": "count-thinker", "messages": USER, "thinking": {"type": "enabled", "budget_tokens": 1024}},
    {"model": "count-thinker", "messages": USER, "thinking": {"type": "disabled"}},
    # a conversation past a small window: both count what is left once the oldest messages go
    {"model": "tiny", "messages": LONG, "extra_body": {"options": {"num_ctx": 160}}},
], ids=["plain", "system-blocks", "tools-and-results", "tool-choice-none", "thinking", "no-thinking", "truncated"])
def test_the_count_is_the_input_tokens_of_messages(client, request_):
    ac, prompts = client
    counted = ac.messages.count_tokens(**request_)
    made = len(prompts)
    answered = ac.messages.create(max_tokens=2, **request_)
    assert counted.input_tokens == answered.usage.input_tokens > 0
    assert counted.model_dump() == {"input_tokens": counted.input_tokens}
    assert len(prompts) == made + ("tiny" != request_["model"])  # the count itself generated nothing


def test_what_changes_the_prompt_changes_the_count(client):
    ac, _ = client
    plain = ac.messages.count_tokens(model="count-caller", messages=USER).input_tokens
    with_tools = ac.messages.count_tokens(model="count-caller", messages=USER, tools=[WEATHER]).input_tokens
    full = ac.messages.count_tokens(model="tiny", messages=LONG).input_tokens
    cut = ac.messages.count_tokens(model="tiny", messages=LONG, extra_body={"options": {"num_ctx": 160}}).input_tokens
    assert with_tools > plain and full >= 160 > cut


@pytest.mark.parametrize("extra, match", REFUSALS + [
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"model": "base", "tools": [WEATHER]}, "base:latest does not support tools"),  # refused as the prompt is built
])
def test_refusals_are_those_of_messages(client, extra, match):
    ac, _ = client
    request_ = {"model": "tiny", "messages": USER, **extra}
    with pytest.raises(anthropic.BadRequestError, match=match) as counted:
        ac.messages.count_tokens(**request_)
    with pytest.raises(anthropic.BadRequestError) as created:
        ac.messages.create(max_tokens=2, **request_)
    assert counted.value.body == created.value.body and counted.value.body["error"]["type"] == "invalid_request_error"


def test_errors_take_anthropics_shape(client, daemon):
    ac, _ = client
    with pytest.raises(anthropic.NotFoundError) as e:
        ac.messages.count_tokens(model="nothing-here", messages=USER)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    url = daemon.url + "/v1/messages/count_tokens"
    status, body = post(url, b"{not json")
    assert status == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert post(url, {"messages": USER}) == (400, {"type": "error", "error": {
        "type": "invalid_request_error", "message": "model is required"}})
    status, body = post(url, {"model": "tiny", "messages": USER, "max_tokens": 8})  # max_tokens: no part of a count
    assert status == 200 and body["input_tokens"] > 0
