"""Modelfiles end to end (issue 12 item 4): a Modelfile parsed as the CLI does, created through the official
`ollama` client, then a chat whose prompt is the Go template rendered with the SYSTEM and MESSAGE lines;
`show --modelfile` creates the same manifest again."""

from __future__ import annotations

import ollama
import pytest

from api_helpers import post
from mlxspec import modelfile

# A Go template as Ollama writes them (zephyr's), with a system message, a few-shot exchange and options.
MODELFILE = '''FROM {path}
TEMPLATE """{{{{- range .Messages }}}}<|{{{{ .Role }}}}|>
{{{{ .Content }}}}</s>
{{{{ end }}}}<|assistant|>
"""
SYSTEM Answer like a pirate.
MESSAGE user Who are you?
MESSAGE assistant A pirate.
PARAMETER temperature 0
PARAMETER num_predict 5
PARAMETER stop </s>
PARAMETER stop "<|user|>"
LICENSE MIT
'''
EXPECTED = ("<|system|>\nAnswer like a pirate.</s>\n<|user|>\nWho are you?</s>\n<|assistant|>\nA pirate.</s>\n"
            "<|user|>\nHi there</s>\n<|assistant|>\n")


def recording(engine, prompts: list):
    """Wrap engine.generate to record the prompt ids it is given."""
    original = engine.generate

    def generate(prompt, options=None, *, cancel=None, format=None):
        prompts.append(list(prompt))
        return original(prompt, options, cancel=cancel, format=format)

    engine.generate = generate


def test_ollama_client_creates_from_a_modelfile_and_chats_through_its_template(daemon, tiny_llama, tmp_path):
    body = modelfile.parse(MODELFILE.format(path=tiny_llama), tmp_path)
    client = ollama.Client(host=daemon.url)
    done = client.create(model="pirate", from_=body["from"], template=body["template"], system=body["system"],
                         parameters=body["parameters"], messages=body["messages"], license=body["license"])
    assert done.status == "success"
    show = client.show("pirate")
    assert show.template == body["template"] and show.license == "MIT"
    assert 'stop "</s>"' in show.parameters and 'stop "<|user|>"' in show.parameters
    shown = post(daemon.url + "/api/show", {"model": "pirate"})[1]
    assert shown["system"] == "Answer like a pirate." and shown["messages"] == body["messages"]

    client.generate(model="pirate")  # load it, then watch the prompts it is given
    prompts: list = []
    recording(daemon.state.registry.loaded["pirate:latest"].engine, prompts)
    try:
        reply = client.chat(model="pirate", messages=[{"role": "user", "content": "Hi there"}])
        engine = daemon.state.registry.loaded["pirate:latest"].engine
        assert prompts[-1] == engine.encode(EXPECTED, add_special_tokens=False)
        assert reply.eval_count <= 5 and "</s>" not in reply.message.content
        # a request that starts with its own system message replaces the model's; it follows the MESSAGE lines (as Ollama)
        client.chat(model="pirate", messages=[{"role": "system", "content": "Be a cat."}, {"role": "user", "content": "Hi there"}])
        own = EXPECTED.replace("<|system|>\nAnswer like a pirate.</s>\n", "").replace("<|user|>\nHi", "<|system|>\nBe a cat.</s>\n<|user|>\nHi")
        assert prompts[-1] == engine.encode(own, add_special_tokens=False)
        # /api/generate takes the same template, system and messages (Ollama: the messages unless a context continues)
        client.generate(model="pirate", prompt="Hi there")
        assert prompts[-1] == engine.encode(EXPECTED, add_special_tokens=False)
    finally:
        client.generate(model="pirate", keep_alive=0)


def test_show_modelfile_round_trips_through_create(daemon, tiny_llama, tmp_path):
    text = MODELFILE.format(path=tiny_llama) + "DRAFTER lookup\nDRAFT_LENGTH 3\nQUANTIZE q8\nMESSAGE user \" two\n lines\"\n"
    status, _ = post(daemon.url + "/api/create", {"model": "rt1", **modelfile.parse(text, tmp_path), "stream": False})
    assert status == 200
    shown = post(daemon.url + "/api/show", {"model": "rt1"})[1]["modelfile"]
    status, _ = post(daemon.url + "/api/create", {"model": "rt2", **modelfile.parse(shown, tmp_path), "stream": False})
    assert status == 200
    store = daemon.state.store
    assert store.get("rt2") == store.get("rt1") and store.get("rt1").messages[-1]["content"] == " two\n lines"
    assert store.get("rt1").drafter == "lookup" and store.get("rt1").quantize == "q8"


@pytest.mark.parametrize("body, status, words", [
    ({"template": "{{ range .Messages }}{{ .Images }}{{ end }}"}, 400, ".Images is not supported"),
    ({"template": "{{ .Prompt | printf }}"}, 400, "pipelines"),
    ({"adapters": {"lora.gguf": "sha256:00"}}, 400, "ADAPTER (LoRA adapters) is not supported"),
    ({"files": {"model.gguf": "sha256:" + "0" * 64}}, 400, "give either from or files"),
    ({"renderer": "qwen3"}, 400, "RENDERER"),
    ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0] must be"),
    ({"license": [1]}, 400, "license must be"),
    ({"parameters": {"mirostat_x": 1}}, 400, "unknown option 'mirostat_x'"),
    ({"drafter": "early-exit:99"}, 400, "choose 1.."),  # was saved, then every request to it a 400
    ({"drafter": "early-exit:0"}, 400, "choose 1.."),
])
def test_create_refusals_name_the_problem(daemon, body, status, words):
    got, answer = post(daemon.url + "/api/create", {"model": "refused", "from": "tiny", "stream": False, **body})
    assert got == status and words in answer["error"], answer


def test_an_early_exit_the_target_can_take_is_created(daemon):
    got, answer = post(daemon.url + "/api/create", {"model": "exits", "from": "tiny", "drafter": "early-exit:1",
                                                     "stream": False})
    assert got == 200, answer
    got, answer = post(daemon.url + "/api/generate", {"model": "exits", "prompt": "hi", "stream": False,
                                                       "options": {"num_predict": 3}})
    assert got == 200 and answer["done"], answer


def test_a_request_template_in_go_syntax_renders_too(daemon):
    """/api/generate's `template` field is Go in Ollama: translated the same way."""
    client = ollama.Client(host=daemon.url)
    go = client.generate(model="tiny-plain", prompt="Once upon", template="<|user|>{{ .Prompt }}<|assistant|>",
                         options={"temperature": 0, "num_predict": 4}, stream=False)
    raw = client.generate(model="tiny-plain", prompt="<|user|>Once upon<|assistant|>", raw=True,
                          options={"temperature": 0, "num_predict": 4}, stream=False)
    assert go.response == raw.response
    with pytest.raises(ollama.ResponseError, match="function 'len' is not supported"):
        client.generate(model="tiny-plain", prompt="x", template="{{ len .Prompt }}")
