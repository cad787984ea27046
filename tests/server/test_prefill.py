"""A chat that ends with the assistant's own words is continued, not answered with a new turn.

Ollama, OpenAI and Anthropic ("prefill") alike: the chat template renders the earlier messages and the
partial assistant message without its end of turn and without a generation prompt, and the reply
holds only what follows. Greedy, that is exactly /api/generate with raw=True on the rendered text.
"""

from __future__ import annotations

import anthropic
import ollama
import openai
import pytest

from api_helpers import post
from mlxspec.store import Manifest

GREEDY = {"temperature": 0, "num_predict": 8}
CHAT = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once upon a"}]
# the tiny models' chat template (tests/model_factory.py), continued after the partial answer
RENDERED = "<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\nOnce upon a"


@pytest.fixture(scope="module")
def raw(daemon) -> dict:
    status, out = post(daemon.url + "/api/generate", {"model": "tiny", "prompt": RENDERED, "raw": True,
                                                      "stream": False, "options": GREEDY})
    assert status == 200 and out["response"]
    return out


def test_ollama_chat_continues_the_last_assistant_message(daemon, raw):
    reply = ollama.Client(host=daemon.url).chat(model="tiny", messages=CHAT, options=GREEDY)
    assert reply.message.content == raw["response"]  # the continuation only, not "Once upon a" again
    assert reply.prompt_eval_count == raw["prompt_eval_count"]
    streamed = ollama.Client(host=daemon.url).chat(model="tiny", messages=CHAT, options=GREEDY, stream=True)
    assert "".join(c.message.content for c in streamed) == raw["response"]


def test_openai_chat_continues_the_last_assistant_message(daemon, raw):
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(model="tiny", messages=CHAT, temperature=0, max_tokens=8)
    assert out.choices[0].message.content == raw["response"]
    assert out.usage.prompt_tokens == raw["prompt_eval_count"]


def test_anthropic_prefill_is_continued(daemon, raw):
    client = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0)
    out = client.messages.create(model="tiny", max_tokens=8, messages=CHAT, extra_body={"temperature": 0})
    assert out.content[0].text == raw["response"] and out.usage.input_tokens == raw["prompt_eval_count"]


def test_a_chat_ending_with_the_user_still_opens_the_assistant_turn(daemon):
    status, out = post(daemon.url + "/api/generate", {"model": "tiny", "raw": True, "stream": False, "options": GREEDY,
                                                      "prompt": RENDERED.removesuffix("Once upon a")})
    reply = ollama.Client(host=daemon.url).chat(model="tiny", messages=CHAT[:1], options=GREEDY)
    assert status == 200 and reply.message.content == out["response"]


def test_go_templates_decide_as_in_ollama(daemon):
    """A per-turn Go template runs its last turn up to `.Response` (Ollama's template.Execute): the
    partial answer ends the prompt. A `.Messages` template renders what it renders."""
    store, client = daemon.state.store, ollama.Client(host=daemon.url)
    store.save("go-turns", Manifest(target=store.get("tiny").target,
                                    template="<|user|>{{ .Prompt }}<|assistant|>{{ .Response }}<|end|>"))
    reply = client.chat(model="go-turns", messages=CHAT, options=GREEDY)
    status, out = post(daemon.url + "/api/generate", {"model": "tiny", "raw": True, "stream": False, "options": GREEDY,
                                                      "prompt": "<|user|>Tell me a story.<|assistant|>Once upon a"})
    assert status == 200 and reply.message.content == out["response"]

    store.save("go-messages", Manifest(target=store.get("tiny").target, template=(
        "{{ range .Messages }}<|{{ .Role }}|>{{ .Content }}<|end|>{{ end }}<|assistant|>")))
    reply = client.chat(model="go-messages", messages=CHAT, options=GREEDY)
    status, out = post(daemon.url + "/api/generate", {"model": "tiny", "raw": True, "stream": False, "options": GREEDY,
                                                      "prompt": "<|user|>Tell me a story.<|end|><|assistant|>Once upon a"
                                                                "<|end|><|assistant|>"})
    assert status == 200 and reply.message.content == out["response"]


def test_a_template_that_hides_the_message_to_continue_is_a_400(daemon):
    store = daemon.state.store
    store.save("forgetful", Manifest(target=store.get("tiny").target, template=(
        "{% for m in messages %}{% if m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>\n"
        "{% endif %}{% endfor %}<|im_start|>assistant\n")))
    status, out = post(daemon.url + "/api/chat", {"model": "forgetful", "messages": CHAT, "stream": False})
    assert status == 400 and "cannot continue" in out["error"], out
