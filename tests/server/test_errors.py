"""Curl-level: every caller mistake is a 4xx with a JSON error; limits, auth, CORS, queue, cancel, memory."""

from __future__ import annotations

import gc
import http.client
import json
import threading
import weakref

import mlx.core as mx
import pytest

from api_helpers import instrument, post
from daemon_harness import ThreadDaemon, wait_until
from mlxspec.home import LOCAL_KEY_HEADER
from mlxspec.server import Settings
from mlxspec.server.registry import Registry
from mlxspec.store import Manifest, Store, load_engine


@pytest.mark.parametrize(
    "path, body, status, words",
    [
        ("/api/generate", b"{not json", 400, "invalid JSON"),
        ("/api/generate", b"[1, 2]", 400, "JSON object"),
        ("/api/generate", {"prompt": "hi"}, 400, "model is required"),
        ("/api/generate", {"model": 7, "prompt": "hi"}, 400, "model must be a string"),
        ("/api/generate", {"model": "tiny", "prompt": 7}, 400, "prompt must be a string"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "stream": "yes"}, 400, "stream must be a boolean"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "options": [1]}, 400, "options must be an object"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "options": {"bogus": 1}}, 400, "unknown option 'bogus'"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "options": {"num_predict": -5}}, 400, "invalid option num_predict=-5"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "options": {"temperature": 1e9}}, 400, "temperature"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "options": {"top_p": 2}}, 400, "top_p"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "options": {"draft_num_predict": 99}}, 400, "invalid option draft_num_predict=99"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "options": {"seed": "x"}}, 400, "seed"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "options": {"seed": -2, "temperature": 1}}, 400, "seed"),
        ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "options": {"seed": 2**70}},
         400, "seed"),
        # an integer past float's range where a number is wanted (JSON allows it): was a 500 (OverflowError)
        ("/api/generate", {"model": "tiny", "prompt": "hi", "options": {"temperature": 10**400}}, 400,
         "invalid option temperature=1000"),
        ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "options": {"top_p": -10**400}},
         400, "invalid option top_p=-1000"),
        ("/api/create", {"model": "x", "from": "tiny", "parameters": {"repeat_penalty": 10**309}}, 400, "repeat_penalty"),
        # an integer of more digits than Python converts: was a 500 (ValueError from json.loads)
        ("/api/generate", b'{"model": "tiny", "options": {"num_ctx": 1' + b"0" * 5000 + b"}}", 400, "more than 4300 digits"),
        # runner options are ignored, but of their type as in the document (and Ollama)
        ("/api/generate", {"model": "tiny", "prompt": "hi", "options": {"num_thread": "x"}}, 400,
         "invalid option num_thread='x': must be an integer"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "options": {"use_mmap": 1}}, 400, "use_mmap"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "options": {"mirostat_tau": "5"}}, 400, "mirostat_tau"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "keep_alive": "forever"}, 400, "keep_alive"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "format": {"type": "nonsense"}}, 400, "format"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "format": "yaml"}, 400, "format"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "images": ["aGk="]}, 400, "images"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "think": True}, 400, "thinking"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "context": ["a"]}, 400, "context"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "template": "{{ .Prompt }}", "context": [2**64]}, 400,
         "vocabulary"),  # was a 500: the reply splitter decoded it first
        ("/api/generate", {"model": "tiny", "prompt": "hi", "raw": True, "context": [1, 10**6]}, 400, "vocabulary"),
        ("/api/generate", {"model": "tiny", "prompt": "word " * 600, "truncate": False, "options": {"num_ctx": 64}}, 400,
         "context window"),
        ("/api/generate", {"model": "tiny", "prompt": "hi", "options": {"num_keep": -2}}, 400, "num_keep"),
        ("/api/generate", {"model": "no-such-model", "prompt": "hi"}, 404, "not found"),
        ("/api/generate", {"model": "broken", "prompt": "hi"}, 400, "neither a model directory"),
        ("/api/show", {"model": "broken"}, 400, "neither a model directory"),
        ("/api/generate", {"model": "../../etc/passwd", "prompt": "hi"}, 400, "invalid model name"),
        ("/api/chat", {"model": "tiny", "messages": "hi"}, 400, "messages must be a list"),
        ("/api/chat", {"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
        ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": 5}]}, 400, "content"),
        ("/api/chat", {"model": "tiny", "messages": [{"role": "assistant", "content": "", "thinking": 5}]}, 400,
         "messages[0].thinking must be a string"),
        ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "think": True}, 400, "think: this model"),
        ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "think": "lots"}, 400, "think must be"),
        ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": "x"}, 400, "tools"),
        ("/api/embed", {"model": "tiny", "input": 5}, 400, "input must be a string or a list of strings"),
        ("/api/embed", {"model": "tiny", "input": "hi", "dimensions": 0}, 400, "dimensions"),
        ("/api/embed", {"model": "tiny", "input": ["hi", ""]}, 400, "input 1 is empty"),
        ("/api/embeddings", {"model": "tiny", "prompt": 5}, 400, "prompt"),
        ("/api/show", {}, 400, "model is required"),
        ("/api/show", {"model": "nothing"}, 404, "not found"),
        ("/api/copy", {"source": "nothing", "destination": "x"}, 404, "not found"),
        ("/api/copy", {"source": "tiny", "destination": "a/b/c"}, 400, "invalid model name"),
        ("/api/create", {"model": "x"}, 400, "from is required"),
        ("/api/create", {"model": "x", "from": "/no/such/dir"}, 403, "MLXSPEC_MODEL_DIRS"),
        # a relative path is no repo id (Hugging Face's: no leading or trailing '.' or '-', no '..')
        ("/api/create", {"model": "x", "from": "./weights"}, 404, "not found"),
        ("/api/create", {"model": "x", "from": "../models/weights"}, 404, "not found"),
        ("/api/create", {"model": "x", "from": "tiny", "draft": "./draft"}, 404, "not found"),
        ("/api/create", {"model": "x", "from": "tiny", "quantize": "q7"}, 400, "unknown quantization"),
        ("/api/create", {"model": "x", "from": "tiny", "drafter": "magic"}, 400, "unknown drafter"),
        ("/api/create", {"model": "x", "from": "tiny", "parameters": {"nope": 1}}, 400, "unknown option"),
        ("/api/create", {"model": "x", "files": {"a.gguf": "sha256:0"}}, 400, "invalid digest format"),
        ("/api/create", {"model": "bad name!", "from": "tiny"}, 400, "invalid model name"),
        ("/api/pull", {"model": "not-a-known-model"}, 404, "cannot pull"),
    ],
)
def test_bad_requests_get_clear_json_errors(daemon, path, body, status, words):
    got_status, got = post(daemon.url + path, body)
    assert got_status == status and isinstance(got, dict), got
    assert words in got["error"], got["error"]


def test_option_errors_name_a_huge_value_without_echoing_it(daemon):
    for options in ({"stop": ["x" * 100_000, ""]}, {"temperature": 10**4000}, {"x" * 100_000: 1}):
        status, got = post(daemon.url + "/api/generate", {"model": "tiny", "prompt": "hi", "options": options})
        assert status == 400 and len(got["error"]) < 150 and "..." in got["error"], got["error"][:300]


# what JSON can carry where an option goes: huge and tiny numbers (10**400 is past float's range), NaN, infinities
HOSTILE = [10**400, -(10**400), 2**64, -(2**63) - 1, 1e308, -1e308, 5e-324, float("nan"), float("inf"), float("-inf"),
           0.5, 4.0, -1, -2, 0, "x", "", "1", [], [""], ["a", 1], {}, {"a": 1}, True, False, None]


def test_every_option_takes_any_json_value_without_an_internal_error():
    """Each option (Ollama's names, ours, the ignored runner ones) with each hostile value: options, or an
    OptionsError (a 400) naming it, never another exception (a float option given 10**400 was an OverflowError:
    a 500). The fuzz draws these one at a time, rarely; here every pair, in milliseconds."""
    from mlxspec.options import GenerateOptions, OptionsError

    for name in GenerateOptions.names():
        for value in HOSTILE:
            try:
                GenerateOptions.from_dict({name: value})
            except OptionsError as e:
                assert name in str(e) and len(str(e)) < 200, (name, value, str(e))


def test_ignored_runner_options_of_their_type_are_served(daemon):
    options = {"num_predict": 2, "num_thread": 2, "num_batch": 512.0, "num_gpu": -1, "use_mmap": True, "numa": None,
               "mirostat": 0, "mirostat_tau": 5, "mirostat_eta": 0.1}
    status, got = post(daemon.url + "/api/generate", {"model": "tiny", "prompt": "hi", "stream": False, "options": options})
    assert status == 200 and got["done"], got


def test_a_draft_with_another_tokenizer_is_refused(daemon, tiny_llama, stories):
    status, _ = post(daemon.url + "/api/create", {"model": "mismatch", "from": str(tiny_llama), "draft": str(stories),
                                                  "stream": False}, headers={LOCAL_KEY_HEADER: daemon.state.local_key})
    assert status == 200
    status, body = post(daemon.url + "/api/generate", {"model": "mismatch", "prompt": "hi"})
    assert status == 400 and "tokenizer differs" in body["error"]
    post(daemon.url + "/api/delete", {"model": "mismatch"}, method="DELETE")


def test_unknown_endpoints_and_methods_are_json(daemon):
    status, body = post(daemon.url + "/api/nothing", {})
    assert status == 404 and "unknown endpoint" in body["error"]
    status, body = post(daemon.url + "/api/tags", {}, method="DELETE")
    assert status == 405 and "not allowed" in body["error"]
    status, body = post(daemon.url + "/api/delete", {"model": "nothing"}, method="DELETE")
    assert status == 404 and "not found" in body["error"]


def test_body_size_limit(tmp_path, tiny_llama):
    d = ThreadDaemon(Store(tmp_path), Settings(max_body=1000)).start()
    try:
        status, body = post(d.url + "/api/generate", {"model": "x", "prompt": "a" * 5000})
        assert status == 413 and "too large" in body["error"]
    finally:
        d.stop()


def test_api_key_and_cors(tmp_path):
    d = ThreadDaemon(Store(tmp_path), Settings(api_key="s3cret", origins=["http://localhost:*", "https://app.example"])).start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", d.port)
        conn.request("HEAD", "/")
        assert conn.getresponse().status == 200  # the heartbeat needs no key
        status, body = post(d.url + "/api/tags", b"", method="GET")
        assert status == 401 and "API key" in body["error"]
        status, body = post(d.url + "/api/tags", b"", method="GET", headers={"Authorization": "Bearer wrong"})
        assert status == 401
        status, body = post(d.url + "/v1/models", b"", method="GET")
        assert status == 401 and body["error"]["type"] == "authentication_error"
        auth = {"Authorization": "Bearer s3cret"}
        assert post(d.url + "/api/tags", b"", method="GET", headers=auth) == (200, {"models": []})
        # Anthropic's clients send x-api-key, and read its error shape
        assert post(d.url + "/api/tags", b"", method="GET", headers={"x-api-key": "s3cret"}) == (200, {"models": []})
        status, body = post(d.url + "/v1/messages", {}, headers={"x-api-key": "wrong"})
        assert status == 401 and body["type"] == "error" and body["error"]["type"] == "authentication_error"

        conn = http.client.HTTPConnection("127.0.0.1", d.port)
        conn.request("GET", "/api/version", headers={**auth, "Origin": "https://app.example"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Access-Control-Allow-Origin") == "https://app.example"
        status, body = post(d.url + "/api/version", b"", method="GET", headers={**auth, "Origin": "https://evil.example"})
        assert status == 403 and "MLXSPEC_ORIGINS" in body["error"]
        conn = http.client.HTTPConnection("127.0.0.1", d.port)
        conn.request("OPTIONS", "/api/chat", headers={"Origin": "http://localhost:3000",
                                                      "Access-Control-Request-Method": "POST"})
        resp = conn.getresponse()
        assert resp.status == 204 and resp.getheader("Access-Control-Allow-Origin") == "http://localhost:3000"
    finally:
        d.stop()


def test_settings_from_environment():
    s = Settings.from_env({"MLXSPEC_KEEP_ALIVE": "1h30m", "MLXSPEC_MAX_LOADED_MODELS": "2", "MLXSPEC_ORIGINS": "https://a.b"})
    assert s.keep_alive == 5400 and s.max_loaded == 2 and "https://a.b" in s.origins and "http://localhost:*" in s.origins
    assert Settings.from_env({"MLXSPEC_KEEP_ALIVE": "-1"}).keep_alive == -1
    assert Settings.from_env({}).keep_alive == 300 and Settings.from_env({}).api_key is None
    for env in ({"MLXSPEC_KEEP_ALIVE": "soon"}, {"MLXSPEC_MAX_LOADED_MODELS": "0"}, {"MLXSPEC_MAX_QUEUE": "x"},
                {"MLXSPEC_KV_CACHE_TYPE": "q8_0"}, {"MLXSPEC_ACTIVATIONS": "int8"}, {"MLXSPEC_LOOKUP_MEMORY": "lots"},
                {"MLXSPEC_KERNELS": "bogus"}):
        with pytest.raises(ValueError):
            Settings.from_env(env)
    assert Settings.from_env({"MLXSPEC_KV_CACHE_TYPE": "f32"}).keep_alive == 300  # a valid engine setting passes
    assert Settings.from_env({"MLXSPEC_ACTIVATIONS": "q8"}).keep_alive == 300
    assert Settings.from_env({"MLXSPEC_LOOKUP_MEMORY": "0"}).keep_alive == 300


def _gated_daemon(tmp_path, tiny_llama, **settings):
    """A daemon whose generations wait at a gate (and record their last event)."""
    gate, entered, finals = threading.Event(), threading.Event(), []
    registry = Registry(3, 300, loader=lambda m: instrument(load_engine(m), gate=gate, entered=entered, finals=finals))
    store = Store(tmp_path)
    store.save("tiny", Manifest(target=str(tiny_llama)))
    d = ThreadDaemon(store, Settings(**settings), registry).start()
    return d, gate, entered, finals


def test_full_queue_is_503_and_queued_work_completes(tmp_path, tiny_llama):
    d, gate, entered, _ = _gated_daemon(tmp_path, tiny_llama, max_queue=1)
    body = {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 3}}
    results = []
    run = lambda: results.append(post(d.url + "/api/generate", body))  # noqa: E731
    try:
        first = threading.Thread(target=run)
        first.start()
        assert entered.wait(30)  # the first generation holds the model's worker
        second = threading.Thread(target=run)
        second.start()
        assert wait_until(lambda: d.state.scheduler.waiting("tiny:latest") == 1)
        status, err = post(d.url + "/api/generate", body)
        assert status == 503 and "busy" in err["error"]
        status, err = post(d.url + "/v1/completions", {"model": "tiny", "prompt": "hi"})
        assert status == 503 and err["error"]["type"] == "api_error"
        gate.set()
        first.join(30), second.join(30)
        assert [r[0] for r in results] == [200, 200] and all(r[1]["eval_count"] == 3 for r in results)
    finally:
        gate.set()
        d.stop()


def test_client_disconnect_cancels_the_generation(tmp_path, tiny_llama):
    d, gate, _, finals = _gated_daemon(tmp_path, tiny_llama)
    gate.set()
    d.state.registry.loader = lambda m: instrument(load_engine(m), delay=0.02, finals=finals)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", d.port)
        conn.request("POST", "/api/generate", body=json.dumps({"model": "tiny", "prompt": "hi", "options": {"num_predict": 500}}))
        resp = conn.getresponse()
        assert json.loads(resp.readline())["done"] is False
        conn.sock.close()  # the client goes away mid-stream
        conn.close()
        assert wait_until(lambda: finals, timeout=10)
        assert finals[0].finish_reason == "cancelled" and finals[0].stats.generated_tokens < 100
    finally:
        d.stop()


def test_a_client_leaving_during_a_long_prompt_stops_its_prefill(tmp_path, tiny_llama, monkeypatch):
    """Editors cancel requests all the time (autocomplete). A prompt is read in chunks; a client that
    left must not hold the model's worker for the rest of its prompt (on a CPU, an 8k prompt of SmolLM2
    takes ~45 s): the prefill stops at the next chunk, and the next request is served at once."""
    from mlxspec.cache import PREFILL_CHUNK

    finals, chunks, left = [], [], threading.Event()
    registry = Registry(3, 300, loader=lambda m: instrument(load_engine(m), finals=finals))
    store = Store(tmp_path)
    store.save("tiny", Manifest(target=str(tiny_llama)))
    d = ThreadDaemon(store, Settings(), registry).start()
    model_class = type(load_engine(Manifest(target=str(tiny_llama))).target.model)
    original = model_class.__call__

    def slow_prompt(self, inputs, *args, **kwargs):
        if inputs.shape[-1] > 1:  # a prompt chunk: the first one waits until its client has left
            chunks.append(inputs.shape[-1])
            if len(chunks) == 1:
                left.wait(30)
                wait_until(lambda: False, timeout=0.5)  # time for the server to see the connection close
        return original(self, inputs, *args, **kwargs)

    monkeypatch.setattr(model_class, "__call__", slow_prompt)
    try:
        prompt = "x" * (PREFILL_CHUNK + 300)  # two chunks within the tiny model's 1024 positions
        assert PREFILL_CHUNK < len(load_engine(Manifest(target=str(tiny_llama))).encode(prompt)) < 1000
        conn = http.client.HTTPConnection("127.0.0.1", d.port)
        conn.request("POST", "/api/generate", body=json.dumps({"model": "tiny", "prompt": prompt, "raw": True,
                                                                "options": {"num_predict": 50}}))
        assert wait_until(lambda: chunks, timeout=30)
        conn.sock.close()  # the client goes away while its prompt is read
        conn.close()
        left.set()
        assert wait_until(lambda: finals, timeout=30)
        assert finals[0].finish_reason == "cancelled" and finals[0].stats.generated_tokens == 0
        assert len(chunks) == 1  # the prompt's other chunks were never computed
        # asked again (the editor's next keystroke), the chunk that was read is not read again
        status, out = post(d.url + "/api/generate", {"model": "tiny", "prompt": prompt, "raw": True, "stream": False,
                                                      "options": {"num_predict": 3}})
        assert status == 200 and out["eval_count"] == 3
        assert out["speculative"]["cached_tokens"] == PREFILL_CHUNK
        assert chunks[1:] == [out["prompt_eval_count"] - 1 - PREFILL_CHUNK]
        status, out = post(d.url + "/api/generate", {"model": "tiny", "prompt": "hi", "stream": False,
                                                      "options": {"num_predict": 3}})
        assert status == 200 and out["eval_count"] == 3
    finally:
        left.set()
        d.stop()


def test_a_client_leaving_while_the_draft_model_reads_its_prompt_stops_that_too(tmp_path, tiny_llama, tiny_llama_other,
                                                                               monkeypatch):
    """A draft model reads the prompt after the target, in the same chunks: a client that left by then
    stops the draft's prefill at its next chunk as well; the chunks read are kept for a retry."""
    from mlxspec.cache import PREFILL_CHUNK

    finals, engines, chunks, left = [], [], [], threading.Event()
    registry = Registry(3, 300, loader=lambda m: engines.append(instrument(load_engine(m), finals=finals)) or engines[-1])
    store = Store(tmp_path)
    store.save("pair", Manifest(target=str(tiny_llama), draft=str(tiny_llama_other)))
    d = ThreadDaemon(store, Settings(), registry).start()
    model_class = type(load_engine(Manifest(target=str(tiny_llama))).target.model)
    original = model_class.__call__

    def slow_draft_prompt(self, inputs, *args, **kwargs):
        if inputs.shape[-1] > 32:  # a prompt chunk (verify passes are a few rows)
            chunks.append(("draft" if self is engines[0].drafter.model else "target", inputs.shape[-1]))
            if chunks.count(("draft", PREFILL_CHUNK)) == 1 and chunks[-1][0] == "draft":  # its client leaves now
                left.wait(30)
                wait_until(lambda: False, timeout=0.5)  # time for the server to see the connection close
        return original(self, inputs, *args, **kwargs)

    monkeypatch.setattr(model_class, "__call__", slow_draft_prompt)
    body = {"model": "pair", "prompt": "x" * (PREFILL_CHUNK + 300), "raw": True, "options": {"draft_num_predict": 4}}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", d.port)
        conn.request("POST", "/api/generate", body=json.dumps({**body, "options": {**body["options"], "num_predict": 50}}))
        assert wait_until(lambda: ("draft", PREFILL_CHUNK) in chunks, timeout=30)
        conn.sock.close()  # the client goes away while the draft model reads its prompt
        conn.close()
        left.set()
        assert wait_until(lambda: finals, timeout=30)
        assert finals[0].finish_reason == "cancelled" and finals[0].stats.generated_tokens == 0
        rest = len(chunks) and chunks[1][1]
        assert chunks == [("target", PREFILL_CHUNK), ("target", rest), ("draft", PREFILL_CHUNK)]  # not the draft's rest
        # asked again: the target reads nothing, the draft only the chunk it had not read
        status, out = post(d.url + "/api/generate", {**body, "stream": False,
                                                      "options": {**body["options"], "num_predict": 3}})
        assert status == 200 and out["eval_count"] == 3
        assert out["speculative"]["cached_tokens"] == out["prompt_eval_count"] - 1
        assert chunks[3:] == [("draft", rest)]
    finally:
        left.set()
        d.stop()


def test_unload_releases_memory_and_max_loaded(tmp_path, tiny_llama):
    store = Store(tmp_path)
    store.save("a", Manifest(target=str(tiny_llama)))
    store.save("b", Manifest(target=str(tiny_llama), quantize="q8"))
    d = ThreadDaemon(store, Settings(max_loaded=1)).start()
    try:
        post(d.url + "/api/generate", {"model": "a", "keep_alive": -1})
        engine = weakref.ref(d.state.registry.loaded["a:latest"].engine)
        weights = engine().info["weight_bytes"]
        gc.collect()
        before = mx.get_active_memory()
        post(d.url + "/api/generate", {"model": "b", "keep_alive": -1})  # one model at most: a goes
        assert list(d.state.registry.loaded) == ["b:latest"]
        gc.collect()
        assert engine() is None
        b_weights, slack = d.state.registry.loaded["b:latest"].size, 64 * 1024
        assert mx.get_active_memory() <= before - weights + b_weights + slack  # a's weights are gone
        status, _ = post(d.url + "/api/generate", {"model": "b", "keep_alive": 0})
        assert status == 200 and not d.state.registry.loaded
        assert wait_until(lambda: mx.get_active_memory() <= before - weights + slack)  # and b's
    finally:
        d.stop()


def test_http_level_streaming_format(daemon):
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port)
    conn.request("POST", "/api/generate", body=json.dumps({"model": "tiny", "prompt": "hi", "options": {"num_predict": 5}}))
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("application/x-ndjson")
    lines = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    assert lines[-1]["done"] is True and all(line["done"] is False for line in lines[:-1])
    assert "".join(line["response"] for line in lines) and lines[-1]["eval_count"] == 5


def test_a_tool_reply_without_an_id_after_calls_without_ids_is_answered(daemon):
    """OpenAI names a tool's reply by the call's id; calls with a null id and a reply with none (found
    by the fuzz: a KeyError, answered 500) read as no id at all."""
    status, body = post(daemon.url + "/v1/chat/completions", {"model": "tiny", "max_tokens": 3, "messages": [
        {"role": "user", "content": "add"},
        {"role": "assistant", "tool_calls": [{"id": None, "type": None, "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "1"}]})
    assert status == 200, body
    assert body["choices"][0]["message"]["role"] == "assistant"
    calls = [{"id": ["x"], "function": {"name": "f", "arguments": "{}"}}]  # an id that is no string: a 400
    status, body = post(daemon.url + "/v1/chat/completions", {"model": "tiny", "messages": [
        {"role": "assistant", "tool_calls": calls}, {"role": "tool", "content": "1"}]})
    assert status == 400 and "tool_calls[0].id must be a string" in body["error"]["message"], body
