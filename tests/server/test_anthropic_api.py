"""Anthropic's Messages API (/v1/messages) through the real `anthropic` client: text and its
stream, system prompts, tool use both ways, thinking blocks, and refusals. Tool use and thinking use
scripted engines (a tiny random model cannot be made to call or think)."""

from __future__ import annotations

import anthropic
import pytest

from api_helpers import TOOL_CALL_REPLY, TOOL_CALL_TEMPLATE, post, scripted_models

THINK_TEMPLATE = (
    "{% if enable_thinking is defined %}thinking={{ enable_thinking }}\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
THINK = ["<think>\nTwo and ", "two.</think>\n\nIt is 4."]
WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
USER = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def client(daemon, tiny_llama):
    models = {"claude-caller": (TOOL_CALL_TEMPLATE, TOOL_CALL_REPLY), "claude-thinker": (THINK_TEMPLATE, THINK)}
    with scripted_models(daemon, tiny_llama, models) as prompts:
        yield anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0), prompts


def test_text_and_its_stream_agree(client):
    ac, _ = client
    whole = ac.messages.create(model="tiny", max_tokens=8, messages=USER, extra_body={"temperature": 0})
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 8
    assert [b.type for b in whole.content] == ["text"] and whole.content[0].text
    with ac.messages.stream(model="tiny", max_tokens=8, messages=USER, extra_body={"temperature": 0}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text and final.stop_reason == "max_tokens"


def test_tool_use_out_and_results_back(client):
    ac, prompts = client
    out = ac.messages.create(model="claude-caller", max_tokens=64, system="Be brief.", tools=[WEATHER],
                             messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert out.stop_reason == "tool_use" and [b.type for b in out.content] == ["text", "tool_use"]
    use = out.content[1]
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"}) and out.content[0].text == "Checking. "
    assert "<|im_start|>system\nBe brief.<|im_end|>" in prompts[-1] and "<tools>get_weather;</tools>" in prompts[-1]
    with ac.messages.stream(model="claude-caller", max_tokens=64, tools=[WEATHER],
                            messages=[{"role": "user", "content": "Weather?"}]) as stream:
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [("text", None), ("tool_use", {"city": "Paris"})]
    ac.messages.create(model="claude-caller", max_tokens=64, tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": use.id, "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C, sunny"}]}])
    assert 'Checking.call get_weather({"city": "Paris"})' in prompts[-1] and "<|im_start|>tool\n18 C, sunny" in prompts[-1]


def test_thinking_blocks(client):
    ac, prompts = client
    out = ac.messages.create(model="claude-thinker", max_tokens=64, messages=USER,
                             thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in out.content] == ["thinking", "text"] and "thinking=True" in prompts[-1]
    assert out.content[0].thinking == "\nTwo and two." and out.content[1].text == "It is 4."
    with ac.messages.stream(model="claude-thinker", max_tokens=64, messages=USER,
                            thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[1].text == "It is 4."


REFUSALS = [  # (body fields, words of the 400): count_tokens refuses them alike (test_anthropic_count_tokens.py)
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "does not support images"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "only client tools"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"messages": []}, "messages must not be empty"),
    ({"messages": USER + [{"role": "assistant", "content": "It is "}]}, "cannot end with trailing whitespace"),
]


@pytest.mark.parametrize("extra, match", REFUSALS + [
    ({"messages": USER + [{"role": "assistant", "content": [{"type": "text", "text": "It is\n"}]}]}, "trailing whitespace"),
])
def test_what_it_cannot_do_is_a_400(client, extra, match):
    ac, _ = client
    with pytest.raises(anthropic.BadRequestError, match=match):
        ac.messages.create(**{"model": "tiny", "max_tokens": 8, "messages": USER, **extra})


def test_an_empty_block_list_is_an_empty_message(client):
    """Found by benchmarks/fuzz.py: content [] left no message at all, and the template a 500."""
    ac, _ = client
    out = ac.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": []}])
    assert out.stop_reason in ("max_tokens", "end_turn")


def test_a_stop_sequence_is_named_in_the_stop_reason(client, stories_model):
    """Anthropic: text cut by one of `stop_sequences` ends with stop_reason "stop_sequence" and names it
    in `stop_sequence` (end_turn is the model's own end), whole and streamed."""
    ac, _ = client
    kwargs = dict(model=stories_model, max_tokens=30, messages=[{"role": "user", "content": "Once upon a time"}],
                  stop_sequences=["dragon", "girl named"], extra_body={"temperature": 0})
    whole = ac.messages.create(**kwargs)
    assert whole.stop_reason == "stop_sequence" and whole.stop_sequence == "girl named"
    assert whole.content[0].text.endswith("little ") and "girl" not in whole.content[0].text
    with ac.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "girl named"
    free = ac.messages.create(**{**kwargs, "stop_sequences": ["dragon"]})
    assert free.stop_reason == "max_tokens" and free.stop_sequence is None


def test_errors_take_anthropics_shape(client, daemon):
    """Anthropic's errors are {"type": "error", "error": {"type", "message"}} (app.py writes OpenAI's
    shape under /v1/): Claude-compatible tools read `type` and `error.type`."""
    ac, _ = client
    with pytest.raises(anthropic.NotFoundError) as e:
        ac.messages.create(model="nothing-here", max_tokens=8, messages=USER)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    assert "not found" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        ac.messages.create(model="tiny", max_tokens=8, messages=[])
    assert e.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                       "message": "messages must not be empty"}}
    status, body = post(daemon.url + "/v1/messages", b"{not json")
    assert status == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("max_tokens", [0, -1])
def test_max_tokens_below_one_is_a_400(client, max_tokens):
    """Anthropic requires max_tokens >= 1; -1 (Ollama's "no limit") would generate to the context's end."""
    ac, _ = client
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        ac.messages.create(model="tiny", max_tokens=max_tokens, messages=USER)


def test_message_start_counts_the_input(client):
    """message_start's usage holds the prompt's input_tokens, as Anthropic sends them (clients that
    only read output_tokens from message_delta keep what message_start said)."""
    ac, _ = client
    whole = ac.messages.create(model="tiny", max_tokens=4, messages=USER)
    with ac.messages.stream(model="tiny", max_tokens=4, messages=USER) as stream:
        start = next(e for e in stream if e.type == "message_start")
        stream.until_done()
    assert whole.usage.input_tokens > 0 and start.message.usage.input_tokens == whole.usage.input_tokens
