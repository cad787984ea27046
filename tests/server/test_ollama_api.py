"""The Ollama API end to end with the official `ollama` Python client against our daemon."""

from __future__ import annotations

import http.client
from datetime import datetime, timezone

import ollama
import pytest

from api_helpers import ndjson_lines, post
from daemon_harness import wait_until
from mlxspec.engine import Engine
from mlxspec.options import GenerateOptions
from mlxspec.store import Manifest

GREEDY = {"temperature": 0, "num_predict": 12, "adaptive": False}  # keep drafting even where it does not pay


def speculative(daemon, path: str, body: dict) -> dict:
    """The same request without the client (its models drop fields they do not know): our statistics."""
    status, out = post(daemon.url + path, {**body, "stream": False})
    assert status == 200
    return out["speculative"]


@pytest.fixture
def client(daemon):
    return ollama.Client(host=daemon.url)


def test_version_and_heartbeat(daemon):
    status, body = post(daemon.url + "/", b"", method="GET")
    assert status == 200 and body == "Ollama is running"  # the exact string clients and editors probe for
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port)
    conn.request("HEAD", "/")
    head = conn.getresponse()
    assert head.status == 200 and head.read() == b""
    conn.close()
    status, body = post(daemon.url + "/api/version", b"", method="GET")
    major, minor, patch = map(int, body["version"].split("."))
    assert (major, minor, patch) >= (0, 6, 4)
    assert body["mlxspec_version"]


def test_generate_with_draft_stream_and_not(client, daemon, tiny_llama):
    whole = client.generate(model="tiny", prompt="Once upon a time", options=GREEDY)
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 12
    for key in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(whole[key], int) and whole[key] >= 0
    assert whole.total_duration > whole.eval_duration > 0 and whole.prompt_eval_count > 0
    spec = speculative(daemon, "/api/generate", {"model": "tiny", "prompt": "Once upon a time", "options": GREEDY})
    assert spec["drafter"] == "draft-model" and spec["drafted"] > 0 and spec["accepted"] == spec["drafted"]
    assert spec["generated_tokens"] == 12 and spec["target_passes"] < 12  # several tokens per pass

    parts = list(client.generate(model="tiny", prompt="Once upon a time", options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.response for p in parts) == whole.response
    assert parts[-1].context == whole.context and len(whole.context) == whole.prompt_eval_count + 12

    # The same tokens as the engine alone, without speculation.
    engine = Engine.load(str(tiny_llama))
    ids = engine.chat_prompt([{"role": "user", "content": "Once upon a time"}])
    plain = "".join(e.text for e in engine.generate(ids, GenerateOptions(max_tokens=12)))
    assert whole.response == plain


def test_chat_stream_and_not(client, daemon):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    whole = client.chat(model="tiny", messages=messages, options=GREEDY)
    assert whole.message.role == "assistant" and whole.message.content
    spec = speculative(daemon, "/api/chat", {"model": "tiny", "messages": messages, "options": GREEDY})
    assert spec["drafted"] > 0 and spec["accepted"] > 0
    parts = list(client.chat(model="tiny", messages=messages, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].done and parts[-1].eval_count == 12
    _, lines = ndjson_lines(daemon.url + "/api/chat", {"model": "tiny", "messages": messages, "options": GREEDY})
    assert lines[-1]["done"] and lines[-1]["speculative"]["drafted"] > 0
    # a conversation that goes on is a longer prompt
    longer = client.chat(model="tiny", messages=messages + [whole.message, {"role": "user", "content": "More"}], options=GREEDY)
    assert longer.prompt_eval_count > whole.prompt_eval_count


def test_real_model_through_the_api(client, daemon, stories_model):
    body = {"model": stories_model, "prompt": "Once upon a time", "raw": True, "options": {"num_predict": 30, "adaptive": False}}
    out = client.generate(**body)
    assert out.response.startswith(", there was a little girl named Lily. She loved to play outside")
    spec = speculative(daemon, "/api/generate", body)
    assert spec["drafted"] > 0 and spec["acceptance_rate"] > 0.5


def test_options_reach_the_engine(client, daemon):
    off = speculative(daemon, "/api/generate", {"model": "tiny", "prompt": "Hi", "options": {**GREEDY, "draft_num_predict": 0}})
    assert off["drafted"] == 0 and off["target_passes"] == 12
    plain = client.generate(model="tiny", prompt="Hi", options={**GREEDY, "draft_num_predict": 0})
    drafted = client.generate(model="tiny", prompt="Hi", options=GREEDY)
    assert drafted.response == plain.response  # speculation never changes greedy output

    text = client.generate(model="tiny", prompt="Hi", options={"temperature": 0, "num_predict": 20}).response
    letter = next(c for c in text[1:] if c.isalpha())
    stopped = client.generate(model="tiny", prompt="Hi", options={"temperature": 0, "num_predict": 20, "stop": [letter]})
    assert stopped.done_reason == "stop" and stopped.response == text[: text.index(letter)]

    sampled = [client.generate(model="tiny", prompt="Hi", options={"temperature": 1.0, "seed": 7, "num_predict": 10}).response
               for _ in range(2)]
    assert sampled[0] == sampled[1]

    short = client.generate(model="tiny", prompt="Hi", options={"num_predict": 3})
    assert short.eval_count == 3 and short.done_reason == "length"


def test_raw_system_template_and_suffix(client, daemon):
    engine_tokens = len(Engine.load(daemon.state.store.get("tiny").target).encode("Once upon a time"))
    raw = client.generate(model="tiny-plain", prompt="Once upon a time", raw=True, options=GREEDY)
    assert raw.prompt_eval_count == engine_tokens and raw.context is None

    plain = client.generate(model="tiny-plain", prompt="Once", options=GREEDY)
    with_system = client.generate(model="tiny-plain", prompt="Once", system="You are terse.", options=GREEDY)
    assert with_system.prompt_eval_count > plain.prompt_eval_count
    templated = client.generate(model="tiny-plain", prompt="Once", template="{{ messages[-1].content }}", options=GREEDY)
    assert templated.prompt_eval_count < plain.prompt_eval_count

    fim = client.generate(model="fim", prompt="def f(", suffix="    return x\n", options=GREEDY)
    no_suffix = client.generate(model="fim", prompt="def f(", options=GREEDY)
    assert fim.done and fim.prompt_eval_count > no_suffix.prompt_eval_count
    assert "insert" in client.show("fim").capabilities

    coder = client.generate(model="coder", prompt="def f(", suffix="    return x\n", options=GREEDY)  # FIM tokens
    engine = Engine.load(daemon.state.store.get("coder").target)
    assert coder.prompt_eval_count == len(engine.encode("def f(", False)) + len(engine.encode("    return x\n", False)) + 3
    assert "insert" in client.show("coder").capabilities and "insert" not in client.show("tiny").capabilities
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="tiny", prompt="def f(", suffix="    return x\n")
    assert e.value.status_code == 400 and "does not support insert" in e.value.error


def test_list_show_ps_copy_delete(client, daemon):
    names = {m.model for m in client.list().models}
    assert {"tiny:latest", "tiny-plain:latest", "fim:latest"} <= names
    entry = next(m for m in client.list().models if m.model == "tiny:latest")
    assert entry.size > 0 and len(entry.digest) == 64 and entry.details.family == "llama"

    shown = client.show("tiny")
    assert shown.modelinfo["general.architecture"] == "llama" and shown.modelinfo["llama.context_length"] == 1024
    assert "completion" in shown.capabilities and "<|im_start|>" in shown.template
    ours = post(daemon.url + "/api/show", {"model": "tiny"})[1]["mlxspec"]  # fields the client drops
    assert ours["draft"] and ours["drafter"] == "draft-model" and ours["chat"] is True
    assert shown.modelfile.startswith("# Modelfile") and "DRAFT " in shown.modelfile

    client.generate(model="tiny", prompt="Hi", options={"num_predict": 2}, keep_alive="10m")
    loaded = {m.model: m for m in client.ps().models}
    assert "tiny:latest" in loaded and loaded["tiny:latest"].size > 0
    assert loaded["tiny:latest"].expires_at > datetime.now(timezone.utc)

    client.copy("tiny", "tiny-copy:v2")
    assert "tiny-copy:v2" in {m.model for m in client.list().models}
    assert client.delete("tiny-copy:v2").status == "success"
    assert "tiny-copy:v2" not in {m.model for m in client.list().models}
    with pytest.raises(ollama.ResponseError) as e:
        client.delete("tiny-copy:v2")
    assert e.value.status_code == 404


def test_keep_alive_load_and_unload(client, daemon):
    ps = lambda: {m.model: m for m in client.ps().models}  # noqa: E731
    client.generate(model="tiny-plain", prompt="Hi", options={"num_predict": 2}, keep_alive=0)
    assert wait_until(lambda: "tiny-plain:latest" not in ps())

    loaded = client.generate(model="tiny-plain", keep_alive=-1)  # empty prompt: just load
    assert loaded.done_reason == "load" and ps()["tiny-plain:latest"].expires_at.year == 9999
    unloaded = client.generate(model="tiny-plain", keep_alive=0)
    assert unloaded.done_reason == "unload" and "tiny-plain:latest" not in ps()

    client.chat(model="tiny-plain", messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2}, keep_alive="300ms")
    assert "tiny-plain:latest" in ps()
    assert wait_until(lambda: "tiny-plain:latest" not in ps(), timeout=5)


def test_create_from_references_and_models(client, daemon, tiny_llama):
    status, lines = ndjson_lines(daemon.url + "/api/create", {"model": "made", "from": str(tiny_llama), "drafter": "lookup",
                                                               "parameters": {"num_predict": 4}})
    assert status == 200 and lines[-1] == {"status": "success"}
    out = client.generate(model="made", prompt="Hi")
    assert out.eval_count == 4
    assert speculative(daemon, "/api/generate", {"model": "made", "prompt": "Hi"})["drafter"] == "lookup"
    assert 'num_predict 4' in client.show("made").parameters

    client.create(model="made-q", from_="made", quantize="q8")  # from a stored model: inherits, overrides
    shown = post(daemon.url + "/api/show", {"model": "made-q"})[1]["mlxspec"]
    assert shown["quantize"] == "q8" and shown["drafter"] == "lookup" and shown["target"] == str(tiny_llama)
    assert client.generate(model="made-q", prompt="Hi").eval_count == 4
    for name in ("made", "made-q"):
        client.delete(name)


def test_a_qwen35_gguf_drafts_with_its_own_mtp_block_over_http(client, daemon, tmp_path):
    """create --drafter mtp over the API; the answer is plain decoding's; a file without the block is a 4xx."""
    from gguf_fixtures import Dims, write_tiny_llama_gguf

    dims = Dims(head_dim=32, rope_dims=8, nextn=1)
    path = write_tiny_llama_gguf(tmp_path / "q35.gguf", "Q8_0", arch="qwen35", dims=dims, pre="qwen35")
    bare = write_tiny_llama_gguf(tmp_path / "bare.gguf", "Q8_0", arch="qwen35", dims=Dims(head_dim=32, rope_dims=8), pre="qwen35")
    for name, source, drafter in (("q35-mtp", path, "mtp"), ("q35-plain", path, "none"), ("q35-bare", bare, "mtp")):
        status, lines = ndjson_lines(daemon.url + "/api/create", {"model": name, "from": str(source), "drafter": drafter})
        assert status == 200 and lines[-1] == {"status": "success"}
    try:
        body = {"prompt": "the world and the", "raw": True, "stream": False,
                "options": {"temperature": 0, "num_predict": 12, "adaptive": False, "draft_length": 2}}
        status, drafted = post(daemon.url + "/api/generate", {"model": "q35-mtp", **body})
        assert status == 200 and drafted["speculative"]["drafter"] == "mtp" and drafted["speculative"]["drafted"] > 0
        assert drafted["response"] == post(daemon.url + "/api/generate", {"model": "q35-plain", **body})[1]["response"]
        status, refused = post(daemon.url + "/api/generate", {"model": "q35-bare", **body})
        assert 400 <= status < 500 and "multi-token-prediction" in refused["error"]
    finally:
        for name in ("q35-mtp", "q35-plain"):
            client.generate(model=name, keep_alive=0)  # unload
        for name in ("q35-mtp", "q35-plain", "q35-bare"):
            client.delete(name)


def test_pull_of_unknown_name_is_404_before_streaming(daemon):
    status, body = post(daemon.url + "/api/pull", {"model": "no-such-model"})
    assert status == 404 and "cannot pull" in body["error"]


def test_a_lookup_model_drafts_a_repeated_request_from_its_earlier_answer(client, daemon, tiny_llama):
    """The loaded model's lookup drafter remembers answers across requests (editors asking again)."""
    daemon.state.store.save("tiny-lookup", Manifest(target=str(tiny_llama), drafter="lookup"))
    try:
        body = {"model": "tiny-lookup", "prompt": "The quick brown fox", "raw": True,
                "options": {"temperature": 0, "num_predict": 40, "adaptive": False, "draft_length": 4}}
        status, first = post(daemon.url + "/api/generate", {**body, "stream": False})
        assert status == 200
        again = client.generate(**{k: v for k, v in body.items() if k != "options"}, options=body["options"])
        assert again.response == first["response"]
        status, third = post(daemon.url + "/api/generate", {**body, "stream": False})
        assert third["response"] == first["response"]
        assert third["speculative"]["accepted"] > first["speculative"]["accepted"] + 4
    finally:
        client.generate(model="tiny-lookup", keep_alive=0)
        daemon.state.store.delete("tiny-lookup")


def test_a_seeded_sampling_request_to_a_lookup_model_is_reproducible(client, daemon, tiny_llama):
    """Ollama: a seed makes the model "generate the same text for the same prompt". The lookup
    drafter's memory of earlier answers changes its drafts, and with them which random numbers a
    round draws: a seeded run must draft from the request alone."""
    daemon.state.store.save("tiny-lookup-seed", Manifest(target=str(tiny_llama), drafter="lookup"))
    try:
        body = {"model": "tiny-lookup-seed", "prompt": "The quick brown fox", "raw": True, "stream": False,
                "options": {"temperature": 1.0, "top_k": 3, "seed": 11, "num_predict": 40, "adaptive": False,
                            "draft_length": 4}}
        answers = []
        for _ in range(3):  # the first answer enters the memory; the next ones would draft from it
            status, out = post(daemon.url + "/api/generate", body)
            assert status == 200
            answers.append(out["response"])
        assert answers[0] == answers[1] == answers[2]
        # the memory still serves unseeded and greedy requests
        greedy = {**body, "options": {"temperature": 0, "num_predict": 40, "adaptive": False, "draft_length": 4}}
        post(daemon.url + "/api/generate", greedy)
        status, again = post(daemon.url + "/api/generate", greedy)
        assert again["speculative"]["accepted"] > 4
    finally:
        client.generate(model="tiny-lookup-seed", keep_alive=0)
        daemon.state.store.delete("tiny-lookup-seed")


def test_a_prompt_past_the_context_keeps_its_start_and_end(client, daemon):
    """As Ollama's completion prompt (llm/llama_server.go): /api/generate's prompt past num_ctx keeps its first
    num_keep tokens and its end, so that about half of what they leave of the window is free, and is answered
    exactly as that prompt; with `truncate: false` it is a 400. /v1/completions cuts the same way."""
    long_ids = list(range(40, 140))  # an earlier answer's context: 100 tokens, then a short prompt
    opts = {**GREEDY, "num_ctx": 60, "num_keep": 5, "num_predict": 3}
    cut = client.generate(model="tiny", prompt="the end", raw=True, context=long_ids, options=opts)
    tail = client.generate(model="tiny", prompt="the end", raw=True, options={**GREEDY, "num_predict": 1})
    room = 60 - (60 - 5) // 2  # the prompt's tokens after the cut: 33
    assert cut.prompt_eval_count == room and cut.done_reason == "length"
    kept = long_ids[:5] + long_ids[5 + len(long_ids) + tail.prompt_eval_count - room:]
    assert len(kept) + tail.prompt_eval_count == room
    again = client.generate(model="tiny", prompt="the end", raw=True, context=kept, options=opts)
    assert (again.response, again.prompt_eval_count) == (cut.response, room)  # greedy: the answer to the prompt kept
    status, out = post(daemon.url + "/api/generate", {"model": "tiny", "prompt": "the end", "raw": True, "stream": False,
                                                      "context": long_ids, "truncate": False, "options": opts})
    assert status == 400 and "context window" in out["error"]
    whole = client.generate(model="tiny", prompt="word " * 100, options={**GREEDY, "num_predict": 1})  # templated
    status, out = post(daemon.url + "/v1/completions", {"model": "tiny", "prompt": "word " * 100, "max_tokens": 2,
                                                        "temperature": 0, "options": {"num_ctx": 40}})
    assert whole.prompt_eval_count > 40 and status == 200  # (the tiny tokenizer has no BOS: num_keep 4 is 4 tokens)
    assert out["usage"]["prompt_tokens"] == 40 - (40 - 4) // 2


def test_a_conversation_past_the_context_loses_its_oldest_messages(client, daemon):
    """As Ollama (server/prompt.go): a chat longer than num_ctx drops its oldest messages, system messages
    kept and the last message always, and is answered exactly as the conversation it kept; with
    `truncate: false`, or a last message too long alone, it is a 400."""
    system = {"role": "system", "content": "Be brief."}
    turns = [{"role": role, "content": f"turn {i} " + "word " * 12} for i, role in
             zip(range(8), ["user", "assistant"] * 4)]
    last = {"role": "user", "content": "And now?"}
    whole = client.chat(model="tiny", messages=[system] + turns + [last], options=GREEDY)
    budget = whole.prompt_eval_count - 30  # too small for the whole conversation
    opts = {**GREEDY, "num_ctx": budget, "num_predict": 4}
    cut = client.chat(model="tiny", messages=[system] + turns + [last], options=opts)
    sizes = [client.chat(model="tiny", messages=[system] + turns[n:] + [last], options={**GREEDY, "num_predict": 1})
             .prompt_eval_count for n in range(len(turns) + 1)]  # each tail whole (the default context holds it)
    kept = min(n for n, size in enumerate(sizes) if size < budget)  # the first turn of the longest tail that fits
    assert kept > 0 and cut.prompt_eval_count == sizes[kept] and cut.done_reason == "length"
    again = client.chat(model="tiny", messages=[system] + turns[kept:] + [last], options=opts)
    assert again.message.content == cut.message.content  # greedy: the answer to the conversation kept
    status, out = post(daemon.url + "/api/chat", {"model": "tiny", "messages": [system] + turns + [last], "stream": False,
                                                  "truncate": False, "options": opts})
    assert status == 400 and "context window" in out["error"]
    status, out = post(daemon.url + "/api/chat", {"model": "tiny", "stream": False, "options": {"num_ctx": 16},
                                                  "messages": [{"role": "user", "content": "word " * 40}]})
    assert status == 400 and "context window" in out["error"]
