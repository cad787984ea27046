"""OpenAI's Responses API (/v1/responses) through the real `openai` client: text, streaming events,
function calls both ways, reasoning items, and refusals. Calls and reasoning use scripted engines
(a tiny random model cannot be made to call or think)."""

from __future__ import annotations

import json

import openai
import pytest

from api_helpers import TOOL_CALL_REPLY, TOOL_CALL_TEMPLATE, scripted_models

THINK_TEMPLATE = (
    "{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant<|channel|>{% endif %}"
)
THINK = ["<|channel|>analysis<|message|>Two and ", "two.<|end|><|start|>assistant<|channel|>final<|message|>It is 4."]
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def client(daemon, tiny_llama):
    models = {"caller": (TOOL_CALL_TEMPLATE, TOOL_CALL_REPLY), "thinker-oss": (THINK_TEMPLATE, THINK)}
    with scripted_models(daemon, tiny_llama, models) as prompts:
        yield openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0), prompts


def test_text_and_its_stream_agree(client):
    oa, _ = client
    whole = oa.responses.create(model="tiny", input="Once upon a time", max_output_tokens=8, temperature=0)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output[0].type == "message" and whole.output_text and whole.usage.output_tokens == 8
    events = list(oa.responses.create(model="tiny", input="Once upon a time", max_output_tokens=8, temperature=0,
                                      stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output[0].content[0].text == whole.output_text


def test_instructions_and_message_items_reach_the_template(client):
    oa, prompts = client
    oa.responses.create(model="caller", instructions="Be brief.", input=[
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}])
    assert "<|im_start|>system\nBe brief.<|im_end|>" in prompts[-1] and "Weather in Paris?" in prompts[-1]


def test_function_calls_out_and_their_results_back(client):
    oa, prompts = client
    out = oa.responses.create(model="caller", input="Weather in Paris?", tools=[WEATHER])
    calls = [item for item in out.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert out.output_text == "Checking. " and "<tools>get_weather;</tools>" in prompts[-1]
    events = list(oa.responses.create(model="caller", input="Weather?", tools=[WEATHER], stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [d.name for d in done] == ["get_weather"]
    assert [e.arguments for e in events if e.type == "response.function_call_arguments.done"] == [done[0].arguments]
    # the next turn sends the call and its output back: the template sees both
    oa.responses.create(model="caller", tools=[WEATHER], input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C, sunny"}])
    assert 'call get_weather({"city": "Paris"})' in prompts[-1] and "<|im_start|>tool\n18 C, sunny" in prompts[-1]


def test_reasoning_comes_back_as_a_reasoning_item(client):
    oa, _ = client
    out = oa.responses.create(model="thinker-oss", input="What is 2 + 2?")
    assert [item.type for item in out.output] == ["reasoning", "message"]
    assert out.output[0].content[0].text == "Two and two." and out.output_text == "It is 4."
    events = list(oa.responses.create(model="thinker-oss", input="What is 2 + 2?", stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "Two and two."
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "It is 4."


@pytest.mark.parametrize("extra, match", [
    ({"previous_response_id": "resp_1"}, "previous_response_id is not supported"),
    ({"tools": [{"type": "web_search"}]}, "only function tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "does not support images"),
    ({"input": [{"type": "computer_call"}]}, "not supported"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"input": []}, "at least one message"),  # found by benchmarks/fuzz.py: was a 500
])
def test_what_it_cannot_do_is_a_400(client, extra, match):
    oa, _ = client
    with pytest.raises(openai.BadRequestError, match=match):
        oa.responses.create(**{"model": "tiny", "input": "hi", **extra})


def test_a_function_call_output_may_be_a_list_of_text_parts(client):
    """A function_call_output's `output` is a string or a list of content parts (input_text, ...): the tool
    sees their text, not the list's JSON; an image part is refused as images are elsewhere."""
    oa, prompts = client
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    parts = [{"type": "input_text", "text": "18 C, "}, {"type": "input_text", "text": "sunny"}]
    oa.responses.create(model="caller", tools=[WEATHER], input=[
        {"role": "user", "content": "Weather in Paris?"}, call,
        {"type": "function_call_output", "call_id": "call_1", "output": parts}])
    assert "<|im_start|>tool\n18 C, sunny<|im_end|>" in prompts[-1]
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    with pytest.raises(openai.BadRequestError, match="does not support images"):
        oa.responses.create(model="caller", tools=[WEATHER], input=[
            {"role": "user", "content": "Weather in Paris?"}, call,
            {"type": "function_call_output", "call_id": "call_1", "output": [image]}])
