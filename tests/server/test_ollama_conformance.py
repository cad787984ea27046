"""Where mlxspec's Ollama routes must answer as Ollama's own server does (server/routes.go), with the
official `ollama` client where it shapes the request."""

from __future__ import annotations

import ollama
import pytest

from api_helpers import post
from mlxspec.store import Manifest

GREEDY = {"temperature": 0, "num_predict": 4}


@pytest.fixture
def client(daemon):
    return ollama.Client(host=daemon.url)


def test_a_message_whose_empty_content_the_client_dropped_is_empty_content(client, daemon):
    """The client leaves out a message's falsy fields (content ""); Ollama reads a missing content as ""."""
    messages = [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"}]
    reply = client.chat(model="tiny", messages=messages, options=GREEDY)
    status, sent = post(daemon.url + "/api/chat", {"model": "tiny", "messages": messages, "options": GREEDY, "stream": False})
    assert status == 200 and (reply.prompt_eval_count, reply.message.content) == (sent["prompt_eval_count"],
                                                                                  sent["message"]["content"])
    status, out = post(daemon.url + "/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": None}]})
    assert status == 200  # JSON null: "" too
    status, out = post(daemon.url + "/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": 5}]})
    assert status == 400 and "content must be a string" in out["error"]


@pytest.fixture
def with_system(daemon, tiny_llama):
    daemon.state.store.save("with-system", Manifest(target=str(tiny_llama), system="You are a pirate. Say arr."))
    yield "with-system"
    post(daemon.url + "/api/generate", {"model": "with-system", "keep_alive": 0})
    daemon.state.store.delete("with-system")


def test_generate_with_an_empty_system_keeps_the_models_system(client, with_system):
    """Ollama: `system` replaces the model's SYSTEM only when it is not empty (`req.System != ""`)."""
    default = client.generate(model=with_system, prompt="Hi", options=GREEDY)
    empty = client.generate(model=with_system, prompt="Hi", system="", options=GREEDY)
    other = client.generate(model=with_system, prompt="Hi", system="Be brief.", options=GREEDY)
    assert empty.context == default.context and other.prompt_eval_count < default.prompt_eval_count


def test_ps_lists_the_longest_kept_model_first(client, daemon):
    """Ollama's /api/ps sorts by expires_at, the latest first (whatever order the models were loaded in)."""
    try:
        client.generate(model="tiny-plain", keep_alive="10m")
        client.generate(model="base", keep_alive="1h")
        order = [m.model for m in client.ps().models]
        assert order.index("base:latest") < order.index("tiny-plain:latest")
        expires = [m.expires_at for m in client.ps().models]
        assert expires == sorted(expires, reverse=True)
    finally:
        for name in ("tiny-plain", "base"):
            client.generate(model=name, keep_alive=0)


def test_options_ollama_ignores_or_turns_off_are_served(client, daemon):
    """Fields of the client's Options that Ollama's server no longer reads (mirostat, tfs_z, penalize_newline...)
    are ignored as Ollama ignores them; Ollama's typical_p and penalties are served at their off values
    (typical_p 1, penalties 0) and refused, by name, at any other."""
    plain = client.generate(model="tiny", prompt="Hi", options=GREEDY)
    options = ollama.Options(**GREEDY, mirostat=0, mirostat_tau=5.0, mirostat_eta=0.1, tfs_z=1.0, penalize_newline=True,
                             f16_kv=True, logits_all=False, vocab_only=False, embedding_only=False, typical_p=1.0,
                             presence_penalty=0.0, frequency_penalty=0)
    for path, body in (("generate", {"prompt": "Hi"}), ("chat", {"messages": [{"role": "user", "content": "Hi"}]})):
        status, out = post(daemon.url + f"/api/{path}", {"model": "tiny", **body, "stream": False,
                                                         "options": options.model_dump(exclude_none=True)})
        assert status == 200, out
    assert client.generate(model="tiny", prompt="Hi", options=options).response == plain.response
    for key, value in (("presence_penalty", 1.5), ("frequency_penalty", 0.5), ("typical_p", 0.7)):
        with pytest.raises(ollama.ResponseError) as e:
            client.generate(model="tiny", prompt="Hi", options={**GREEDY, key: value})
        assert e.value.status_code == 400 and key in e.value.error and "not supported" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:  # a name Ollama never had stays a mistake
        client.generate(model="tiny", prompt="Hi", options={"bogus": 1})
    assert e.value.status_code == 400 and "unknown option 'bogus'" in e.value.error
