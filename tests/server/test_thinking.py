"""Thinking split off a reasoning model's reply: Ollama's message.thinking, OpenAI's reasoning.

The splitter is checked at every cut of the text; the wiring through the real clients uses a model
whose engine streams a scripted Qwen3-style reply (a tiny random model cannot be made to think).
"""

from __future__ import annotations

import ollama
import openai
import pytest

from api_helpers import post, scripted
from mlxspec.server.prompts import think_variables
from mlxspec.server.thinking import ThinkSplitter, opens_thinking, splitter_for
from mlxspec.store import Manifest

TEMPLATE = (
    "{% if enable_thinking is defined %}thinking={{ enable_thinking }}\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
REPLY = ["<think>\nTwo and two", " make four.</th", "ink>\n\nThe answer", " is 4."]
USER = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.mark.parametrize("text, inside, thinking, content", [
    ("<think>\nTwo and two make four.</think>\n\nThe answer is 4.", False, "\nTwo and two make four.", "The answer is 4."),
    ("  <think>a</think>b", False, "a", "b"),
    ("No thinking here, <think> is just text", False, "", "No thinking here, <think> is just text"),
    ("reasoning</think>answer", True, "reasoning", "answer"),  # the template opened the block
    ("<think>unfinished", False, "unfinished", ""),
    ("<thi", False, "", "<thi"),  # a reply that only looks like the start of a tag
])
def test_splitter_at_every_cut(text, inside, thinking, content):
    for cut in range(len(text) + 1):
        s = ThinkSplitter(inside)
        parts = [s.feed(text[:cut]), s.feed(text[cut:]), s.finish()]
        assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == (thinking, content), cut


def test_a_prompt_that_opens_the_block():
    assert opens_thinking("<|im_start|>assistant\n<think>\n") and not opens_thinking("<|im_start|>assistant\n")


GEMMA4 = "{% if enable_thinking %}<|think|>{% endif %}<|turn>model\n<|channel>"  # its template's markers
GEMMA4_REPLY = "<|channel>thought\nThe user asks 2 + 2.<channel|>The answer is 4."


@pytest.mark.parametrize("think, tail, text, thinking, content", [
    (True, "<|turn>model\n", GEMMA4_REPLY, "The user asks 2 + 2.", "The answer is 4."),
    (False, "<|turn>model\n", GEMMA4_REPLY, "", "The answer is 4."),  # thinking not asked for: dropped
    (True, "<|turn>model\n", "No thinking, just 4.", "", "No thinking, just 4."),
    (True, "<|channel>thought\n", "thought about it<channel|>4", "thought about it", "4"),  # opened by the prompt
    (True, "<|turn>model\n", "<|channel>thoughtful cut", "thoughtful cut", ""),  # another name: kept
])
def test_gemma4_s_thinking_channel_at_every_cut(think, tail, text, thinking, content):
    """Gemma 4 thinks in <|channel>thought\n ... <channel|> (Ollama's parser: the name dropped; without
    `think` the block is dropped as well)."""
    for cut in range(len(text) + 1):
        s = splitter_for(GEMMA4, tail, think)
        parts = [s.feed(text[:cut]), s.feed(text[cut:]), s.finish()]
        assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == (thinking, content), cut
    assert splitter_for(TEMPLATE, "", False) is None and splitter_for(TEMPLATE, "", True).open == "<think>"


@pytest.fixture(scope="module")
def thinker(daemon, tiny_llama):
    registry, original = daemon.state.registry, daemon.state.registry.loader
    registry.loader = lambda m: scripted(original(m), {"text": REPLY}, []) if m.template == TEMPLATE else original(m)
    daemon.state.store.save("thinker", Manifest(target=str(tiny_llama), draft=str(tiny_llama), template=TEMPLATE))
    yield "thinker"
    registry.loader = original
    post(daemon.url + "/api/generate", {"model": "thinker", "keep_alive": 0})


def test_ollama_chat_puts_the_reasoning_in_message_thinking(daemon, thinker):
    client = ollama.Client(host=daemon.url)
    reply = client.chat(model=thinker, messages=USER, think=True).message
    assert reply.thinking == "\nTwo and two make four." and reply.content == "The answer is 4."
    chunks = list(client.chat(model=thinker, messages=USER, think=True, stream=True))
    assert "".join(c.message.thinking or "" for c in chunks) == reply.thinking
    assert "".join(c.message.content for c in chunks) == reply.content
    plain = client.chat(model=thinker, messages=USER).message  # think not asked: the text as written
    assert plain.content == "".join(REPLY) and not plain.thinking


def test_openai_chat_puts_it_in_reasoning(daemon, thinker):
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")
    message = client.chat.completions.create(model=thinker, messages=USER, reasoning_effort="low").choices[0].message
    assert message.content == "The answer is 4." and message.model_extra["reasoning"] == "\nTwo and two make four."
    stream = client.chat.completions.create(model=thinker, messages=USER, reasoning_effort="low", stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning", "") for d in deltas) == "\nTwo and two make four."
    assert "".join(d.content or "" for d in deltas) == "The answer is 4."


def test_think_true_on_an_effort_template_is_ollamas_default_level():
    """gpt-oss's template takes an effort, not a switch: `true` is Ollama's default level (ThinkValue.String),
    so `mlxspec run` (which turns thinking on for models that can think) is no 400 there."""
    effort = "{{ reasoning_effort }}"
    assert think_variables(effort, True) == {"reasoning_effort": "medium"}
    assert think_variables(effort, "high") == {"reasoning_effort": "high"} and think_variables(effort, False) == {}
    assert think_variables(TEMPLATE, True) == {"enable_thinking": True}
