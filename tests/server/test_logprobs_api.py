"""Logprobs over HTTP with the `ollama` and `openai` clients: Ollama's per-chunk lists, OpenAI's chat and
completions shapes, speculation reporting plain decoding's values, and bad counts as 400s."""

from __future__ import annotations

import ollama
import openai
import pytest

from api_helpers import ndjson_lines, post

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"
GREEDY = {"temperature": 0, "num_predict": 12}
MESSAGES = [{"role": "user", "content": "Hello there"}]


def values(logprobs) -> list[tuple]:
    """(token, logprob, alternatives) of each entry, from dicts or the clients' models."""
    get = (lambda x, k: x[k]) if logprobs and isinstance(logprobs[0], dict) else getattr
    return [(get(lp, "token"), get(lp, "logprob"), [(get(t, "token"), get(t, "logprob")) for t in get(lp, "top_logprobs") or []])
            for lp in logprobs]


def test_ollama_generate_logprobs_with_and_without_speculation(daemon):
    client = ollama.Client(host=daemon.url)
    plain = client.generate(model="tiny-plain", prompt=PROMPT, options=GREEDY, logprobs=True, top_logprobs=2)
    status, drafted = post(daemon.url + "/api/generate", {"model": "tiny", "prompt": PROMPT, "stream": False,
                                                          "options": {**GREEDY, "adaptive": False},
                                                          "logprobs": True, "top_logprobs": 2})
    assert status == 200 and drafted["speculative"]["accepted"] > 0  # (the client drops our statistics)
    assert values(drafted["logprobs"]) == values(plain.logprobs) and len(plain.logprobs) == plain.eval_count == 12
    for token, logprob, top in values(plain.logprobs):  # greedy: each token is its position's most likely one
        assert top[0] == (token, logprob) and len(top) == 2 and logprob <= 0

    status, lines = ndjson_lines(daemon.url + "/api/generate", {"model": "tiny", "prompt": PROMPT, "options": GREEDY,
                                                                 "logprobs": True, "top_logprobs": 2})
    assert status == 200 and all("logprobs" in line for line in lines)
    streamed = [lp for line in lines for lp in line["logprobs"]]
    assert values(streamed) == values(plain.logprobs)
    text = "".join(line["response"] for line in lines)  # a random model writes broken UTF-8 too: both replace it
    assert b"".join(bytes(lp["bytes"]) for lp in streamed).decode(errors="replace") == text


def test_ollama_chat_logprobs_without_alternatives(daemon):
    status, out = post(daemon.url + "/api/chat", {"model": "tiny", "messages": MESSAGES, "options": GREEDY,
                                                  "stream": False, "logprobs": True})
    assert status == 200 and len(out["logprobs"]) == out["eval_count"]
    assert all("top_logprobs" not in lp for lp in out["logprobs"])  # as Ollama: only where some were asked for
    status, out = post(daemon.url + "/api/chat", {"model": "tiny", "messages": MESSAGES, "options": GREEDY,
                                                  "stream": False, "top_logprobs": 3})
    assert status == 200 and "logprobs" not in out  # top_logprobs alone asks for nothing


@pytest.mark.parametrize("path", ["/api/generate", "/api/chat", "/v1/chat/completions"])
def test_bad_logprob_counts_are_400s(daemon, path):
    body = {"model": "tiny", "prompt": PROMPT, "messages": MESSAGES, "logprobs": True, "top_logprobs": 21, "stream": False}
    status, out = post(daemon.url + path, body)
    assert status == 400 and "top_logprobs must be between 0 and 20" in str(out)
    status, out = post(daemon.url + "/v1/completions", {"model": "tiny", "prompt": PROMPT, "logprobs": -1})
    assert status == 400 and "logprobs must be between 0 and 20" in str(out)


@pytest.fixture
def client(daemon):
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)


def test_openai_chat_logprobs_whole_and_streamed(client):
    kwargs = dict(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kwargs)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens == 10
    assert all(len(lp.top_logprobs) == 2 and lp.top_logprobs[0].token == lp.token for lp in content)
    assert b"".join(bytes(lp.bytes) for lp in content).decode(errors="replace") == whole.choices[0].message.content
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed = [lp for c in chunks if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.content]
    assert values(streamed) == values(content)
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10, temperature=0)
    assert plain.choices[0].logprobs is None


def test_openai_completions_logprobs(client):
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == out.usage.completion_tokens == 8
    text = out.choices[0].text  # a random model's: byte tokens, some of them halves of a character
    whole = 0  # up to the first half character, each piece is where its offset says
    while whole < 8 and not lp.tokens[whole].startswith("bytes:\\x"):
        assert text[lp.text_offset[whole] :].startswith(lp.tokens[whole])
        whole += 1
    assert whole > 0
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0 and lp.text_offset[-1] < len(text)
    assert all(len(top) == 3 and max(top.values()) >= value - 1e-6 for top, value in zip(lp.top_logprobs, lp.token_logprobs))
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3,
                                            stream=True))
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert tokens == lp.tokens and offsets == lp.text_offset


def test_logprobs_stop_where_a_stop_string_cuts_the_text(daemon, stories_model, client):
    """As Ollama's runner: the tokens of a stop string are not in the text, so their logprobs are not in
    the answer either (a token the cut splits keeps its entry). Streamed, they were sent before the stop
    string was whole: they must be held back with the text."""
    # stories260K greedy: ", there was a little girl named Lily. ..." -> cut inside " g|ir|l| named"
    body = {"model": stories_model, "prompt": "Once upon a time", "raw": True, "logprobs": True,
            "options": {"temperature": 0, "num_predict": 20, "stop": ["girl named"]}}

    def check(text: str, tokens: list[str]) -> None:
        assert text == ", there was a little "
        assert "".join(tokens).startswith(text) and len("".join(tokens[:-1])) < len(text)  # each token starts in it

    status, whole = post(daemon.url + "/api/generate", {**body, "stream": False})
    assert status == 200 and whole["done_reason"] == "stop"
    check(whole["response"], [lp["token"] for lp in whole["logprobs"]])
    status, lines = ndjson_lines(daemon.url + "/api/generate", body)
    assert status == 200
    check("".join(line["response"] for line in lines), [lp["token"] for line in lines for lp in line["logprobs"]])

    kwargs = dict(model=stories_model, prompt="Once upon a time", max_tokens=20, temperature=0, stop=["girl named"])
    out = client.completions.create(**kwargs, logprobs=1)
    lp = out.choices[0].logprobs
    check(out.choices[0].text, lp.tokens)
    assert all(offset < len(out.choices[0].text) for offset in lp.text_offset)
    chunks = list(client.completions.create(**kwargs, logprobs=1, stream=True))
    check("".join(c.choices[0].text for c in chunks),
          [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens])
    chat = dict(model=stories_model, messages=[{"role": "user", "content": "Once upon a time"}], max_tokens=20,
                temperature=0, stop=["girl named"], logprobs=True)
    whole = client.chat.completions.create(**chat)
    chunks = list(client.chat.completions.create(**chat, stream=True))
    streamed = [lp.token for c in chunks if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.content]
    assert streamed == [lp.token for lp in whole.choices[0].logprobs.content]
    assert "".join(streamed).startswith(whole.choices[0].message.content)
    assert len("".join(streamed[:-1])) < len(whole.choices[0].message.content)
