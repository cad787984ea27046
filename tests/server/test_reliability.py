"""Issue 14: the daemon must not fall over on hostile or odd input."""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import ollama
import pytest

from api_helpers import post
from daemon_harness import ThreadDaemon
from mlxspec.home import LOCAL_KEY_HEADER
from mlxspec.server import Settings
from mlxspec.server.registry import Registry
from mlxspec.store import Manifest, Store, load_engine


@pytest.fixture
def client(daemon):
    return ollama.Client(host=daemon.url)


@pytest.mark.parametrize("keep_alive", ["nan", "inf", "1e400", "-inf", "5 minutes", 10**400, "1e3", True, [5]])
def test_bad_keep_alive_is_400_and_ps_keeps_working(daemon, client, keep_alive):
    status, body = post(daemon.url + "/api/generate", {"model": "tiny-plain", "keep_alive": keep_alive})
    assert status == 400 and "keep_alive" in body["error"], body
    status, body = post(daemon.url + "/api/ps", b"", method="GET")
    assert status == 200 and all(m["name"] != "tiny-plain:latest" for m in body["models"])


def test_keep_alive_durations_as_ollama(daemon, client):
    client.generate("tiny-plain", keep_alive="1h30m")  # load only
    (entry,) = [m for m in client.ps().models if m.model == "tiny-plain:latest"]
    assert 5390 < (entry.expires_at.timestamp() - time.time()) <= 5400
    client.generate("tiny-plain", keep_alive=9e9)  # ~285 years: within Go's int64 nanoseconds
    assert [m.expires_at.year > 2300 for m in client.ps().models if m.model == "tiny-plain:latest"] == [True]
    client.generate("tiny-plain", keep_alive=-1)
    assert [m.expires_at.year for m in client.ps().models if m.model == "tiny-plain:latest"] == [9999]
    with pytest.raises(ollama.ResponseError) as e:
        client.generate("tiny-plain", keep_alive="nan")
    assert e.value.status_code == 400
    client.generate("tiny-plain", keep_alive=0)  # unload now
    assert all(m.model != "tiny-plain:latest" for m in client.ps().models)


def _get(port: int, path: str, host: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.request("GET", path, headers={"Host": host})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read() or b"null")


@pytest.mark.parametrize("path", ["/api/tags", "/api/ps", "/api/version", "/v1/models"])
def test_unknown_host_names_are_refused(daemon, path):
    for host in ("evil.example", f"evil.example:{daemon.port}", "localhost.evil.example"):
        status, body = _get(daemon.port, path, host)
        assert status == 403 and "MLXSPEC_ALLOWED_HOSTS" in json.dumps(body), (host, body)
    for host in (f"localhost:{daemon.port}", f"127.0.0.1:{daemon.port}", f"[::1]:{daemon.port}", "LocalHost"):
        assert _get(daemon.port, path, host)[0] == 200, host


def test_allowed_host_names_come_from_the_settings(tmp_path):
    settings = Settings.from_env({"MLXSPEC_ALLOWED_HOSTS": "*.corp.example, box.lan"})
    d = ThreadDaemon(Store(tmp_path), settings).start()
    try:
        assert _get(d.port, "/api/tags", "gpu.corp.example:11435")[0] == 200
        assert _get(d.port, "/api/tags", "box.lan")[0] == 200
        assert _get(d.port, "/api/tags", f"{socket.gethostname()}:11435")[0] == 200  # as Ollama
        assert _get(d.port, "/api/tags", "corp.example.evil")[0] == 403
    finally:
        d.stop()


def _tokens(daemon, options: dict) -> list[int]:
    body = {"model": "tiny-plain", "prompt": "Once upon a time", "stream": False,
            "options": {"num_predict": 12, "seed": 1, **options}}
    status, out = post(daemon.url + "/api/generate", body)
    assert status == 200, out
    return out["context"][-out["eval_count"]:]


def test_tiny_temperature_is_greedy_not_token_zero(daemon):
    greedy = _tokens(daemon, {"temperature": 0})
    assert set(greedy) != {0}
    for t in (1e-39, 5e-324, 1e-4):
        assert _tokens(daemon, {"temperature": t}) == greedy, t


def test_repeat_penalty_rule(daemon):
    for bad in (1e-39, 0.001, 0, -1, 11):
        status, body = post(daemon.url + "/api/generate", {"model": "tiny-plain", "prompt": "hi",
                                                            "options": {"repeat_penalty": bad}})
        assert status == 400 and "repeat_penalty" in body["error"] and "0.01" in body["error"], (bad, body)
    assert set(_tokens(daemon, {"repeat_penalty": 0.01, "temperature": 0.7})) != {0}


def _raw(daemon, path: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


@pytest.mark.parametrize(
    "path, body, headers, status, words",
    [
        ("/api/generate", b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}, 400, "nested"),
        ("/api/generate", b'{"model": "tiny", "prompt": "a\\ud800b", "stream": false}', {}, 400, "surrogate"),
        ("/api/chat", b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udc00"}]}', {}, 400, "surrogate"),
        ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udc00"}]}', {}, 400,
         "surrogate"),
        ("/api/generate", b'{"model": "tiny"}', {"Content-Encoding": "gzip"}, 400, "not valid gzip"),
        ("/api/generate", b'{"model": "tiny"}', {"Content-Encoding": "deflate"}, 400, "not valid deflate"),
        ("/api/generate", b'{"model": "tiny"}', {"Content-Encoding": "bogus"}, 415, "Content-Encoding"),
    ],
)
def test_malformed_bodies_are_4xx_json(daemon, path, body, headers, status, words):
    got, answer = _raw(daemon, path, body, headers)
    message = answer["error"]["message"] if path.startswith("/v1/") else answer["error"]
    assert got == status and words in message, answer


def test_a_gzip_body_is_read(daemon):
    body = gzip.compress(json.dumps({"model": "tiny", "keep_alive": 0}).encode())
    assert _raw(daemon, "/api/generate", body, {"Content-Encoding": "gzip"})[0] == 200


@pytest.mark.parametrize("template", ["{{ 1 / 0 }}", "{{ prompt + 1 }}", "{% for %}", "{{ raise_exception('no') }}",
                                      # were 500s: Python's other errors, raised by the template's own code
                                      "{{ 'a'.index('b') }}",  # ValueError
                                      "{{ 10**5000 }}",  # ValueError (Jinja's compiler writes the int out)
                                      "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",  # RecursionError
                                      "{{ [0] * 2**62 }}",  # MemoryError (refused before any allocation)
                                      "{{ 'ab'|truncate(-5) }}"])  # AssertionError (a Jinja filter's)
@pytest.mark.parametrize("stream", [False, True])
def test_template_errors_are_400(daemon, template, stream):
    status, body = post(daemon.url + "/api/generate", {"model": "tiny", "prompt": "hi", "template": template, "stream": stream})
    assert status == 400 and "template error" in body["error"], body


def test_only_what_jinja_raises_is_the_templates_error():
    """A ValueError from the code around the template (a tokenizer's, ours) stays an internal error (a 500)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from mlxspec.server.prompts import _apply
    from mlxspec.server.requests import ApiError

    def ours():
        raise ValueError("a bug of ours")

    with pytest.raises(ValueError, match="a bug of ours"):
        _apply(None, ours)
    with pytest.raises(ApiError, match="template error: ValueError: substring not found"):
        _apply(None, lambda: ImmutableSandboxedEnvironment().from_string("{{ 'a'.index('b') }}").render())


def test_an_internal_value_error_is_a_logged_500(tmp_path, tiny_llama, caplog):
    def shape_error(engine):
        def generate(prompt, options=None, *, cancel=None, format=None):
            raise ValueError("[matmul] Last dimension of first input with shape (1,8) must match ...")
            yield  # a generator, as the engine's

        engine.generate = generate
        return engine

    store = Store(tmp_path)
    store.save("tiny", Manifest(target=str(tiny_llama)))
    d = ThreadDaemon(store, Settings(), Registry(1, 300, loader=lambda m: shape_error(load_engine(m)))).start()
    try:
        with caplog.at_level(logging.ERROR, logger="mlxspec.server"):
            status, body = post(d.url + "/api/generate", {"model": "tiny", "prompt": "hi", "stream": False})
        assert status == 500 and "internal error" in body["error"], body
        assert any(r.exc_info and "matmul" in str(r.exc_info[1]) for r in caplog.records)
    finally:
        d.stop()


@pytest.mark.parametrize(
    "source, status, words",
    [
        ("/etc/passwd", 403, "MLXSPEC_MODEL_DIRS"),
        ("/proc/self/environ", 403, "MLXSPEC_MODEL_DIRS"),
        ("~/.ssh", 403, "MLXSPEC_MODEL_DIRS"),
        ("pypi:mlxspec/../../../../../../etc/passwd", 400, "inside its package"),
        ("pypi:mlxspec/options.py", 400, "inside its package"),
        ("", 400, "must not be empty"),
        ("   ", 400, "must not be empty"),
        ("etc", 404, "not found"),
        ("a" * 300, 404, "not found"),
        ("/" + "a" * 300 + "/b", 403, "MLXSPEC_MODEL_DIRS"),
    ],
)
def test_create_refuses_server_paths(daemon, source, status, words):
    """`from`, `draft` and the sources of the mtp and eagle3 drafters (where their weights are read) alike;
    an eagle or medusa head named by a path too (a bare name is a file in MLXSPEC_HOME/drafters)."""
    pairs = [("from", source), ("draft", source), ("drafter", f"mtp:{source}"), ("drafter", f"eagle3:{source}")]
    if source.startswith(("/", "~")):
        pairs += [("drafter", f"eagle:{source}"), ("drafter", f"medusa:{source}")]
    for key, value in pairs:
        body = {"model": "x", "from": "tiny", key: value}
        got, answer = post(daemon.url + "/api/create", body)
        assert got == status and words in answer["error"], (key, answer)
    assert not daemon.state.store.exists("x")


def test_create_paths_under_model_dirs_must_be_models(daemon, tiny_llama, tmp_path):
    (tmp_path / "notes.txt").write_text("secret")
    (tmp_path / "outside").symlink_to("/etc")
    for path, status, words in [(tmp_path, 400, "not a model"), (tmp_path / "notes.txt", 400, "not a model"),
                                (tmp_path / "outside", 403, "MLXSPEC_MODEL_DIRS"), (tmp_path / "nothing", 404, "not found"),
                                (tmp_path / ("a" * 300), 400, "cannot be read")]:
        got, answer = post(daemon.url + "/api/create", {"model": "x", "from": str(path)})
        assert got == status and words in answer["error"], (path, answer)
    for source in (str(tiny_llama), "tiny", "org/some-repo"):  # a model directory, a store name, a repo id
        assert post(daemon.url + "/api/create", {"model": "x", "from": source, "stream": False})[0] == 200, source
    post(daemon.url + "/api/delete", {"model": "x"}, method="DELETE")


def test_a_head_file_over_http_is_a_safetensors_file_under_model_dirs(daemon, tmp_path):
    (tmp_path / "head.safetensors").write_bytes(b"{}")
    (tmp_path / "notes.txt").write_text("secret")
    create = daemon.url + "/api/create"
    body = {"model": "x", "from": "tiny", "stream": False}
    try:
        assert post(create, {**body, "drafter": f"eagle:{tmp_path / 'head.safetensors'}"})[0] == 200
        assert daemon.state.store.get("x").drafter == f"eagle:{(tmp_path / 'head.safetensors').resolve()}"
        assert post(create, {**body, "drafter": "medusa:my-head"})[0] == 200  # a name: MLXSPEC_HOME/drafters
        for drafter, status, words in [(f"eagle:{tmp_path / 'notes.txt'}", 400, "not a drafter file"),
                                       ("eagle:heads/h.safetensors", 400, "must be absolute"),
                                       (f"medusa:{tmp_path / 'none.safetensors'}", 404, "not found")]:
            got, answer = post(create, {**body, "drafter": drafter})
            assert got == status and words in answer["error"], (drafter, answer)
    finally:
        post(daemon.url + "/api/delete", {"model": "x"}, method="DELETE")


def test_only_the_local_key_lets_any_local_model_path_through(tmp_path, tiny_llama):
    d = ThreadDaemon(Store(tmp_path / "home"), Settings()).start()  # no MLXSPEC_MODEL_DIRS
    try:
        body = {"model": "x", "from": str(tiny_llama), "stream": False}
        assert post(d.url + "/api/create", body)[0] == 403
        assert post(d.url + "/api/create", body, headers={LOCAL_KEY_HEADER: "guess"})[0] == 403
        key = (tmp_path / "home" / "local.key").read_text()
        assert oct((tmp_path / "home" / "local.key").stat().st_mode & 0o777) == "0o600"
        assert post(d.url + "/api/create", body, headers={LOCAL_KEY_HEADER: key})[0] == 200
        status, answer = post(d.url + "/api/create", {**body, "from": "/etc/passwd"}, headers={LOCAL_KEY_HEADER: key})
        assert status == 400 and "not a model" in answer["error"]
    finally:
        d.stop()


def test_503_says_when_to_retry(tmp_path, tiny_llama):
    store = Store(tmp_path)
    for name in ("a", "b"):
        store.save(name, Manifest(target=str(tiny_llama)))
    d = ThreadDaemon(store, Settings(max_loaded=1)).start()
    try:
        entry, _ = d.call(d.state.registry.acquire("a:latest", store.get("a")))  # a is busy and fills the limit
        for path, body in (("/api/generate", {"model": "b", "prompt": "hi"}), ("/v1/completions", {"model": "b", "prompt": "hi"})):
            conn = http.client.HTTPConnection("127.0.0.1", d.port)
            conn.request("POST", path, body=json.dumps(body))
            resp = conn.getresponse()
            assert resp.status == 503 and int(resp.getheader("Retry-After")) > 0 and "busy" in resp.read().decode()
        d.loop.call_soon_threadsafe(d.state.registry.release, entry, 0)
    finally:
        d.stop()


def test_the_bearer_scheme_is_case_insensitive(tmp_path):
    d = ThreadDaemon(Store(tmp_path), Settings(api_key="s3cret")).start()
    try:
        for given, status in [("bearer s3cret", 200), ("BEARER  s3cret", 200), ("Bearer s3cret", 200),
                              ("Basic s3cret", 401), ("bearers3cret", 401), ("bearer S3CRET", 401), ("s3cret", 401)]:
            assert post(d.url + "/api/tags", b"", method="GET", headers={"Authorization": given})[0] == status, given
    finally:
        d.stop()


def test_max_loaded_models_holds_when_loads_overlap(tmp_path, tiny_llama):
    store = Store(tmp_path)
    names = [f"m{i}" for i in range(32)]
    for name in names:
        store.save(name, Manifest(target=str(tiny_llama)))
    seen = []

    def loader(manifest):
        seen.append(len(d.state.registry.loaded))  # at each load start, the models already loaded
        time.sleep(0.02)  # the other requests arrive meanwhile
        return load_engine(manifest)

    d = ThreadDaemon(store, Settings(max_loaded=3), Registry(3, 300, loader=loader)).start()
    try:
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(lambda n: post(d.url + "/api/generate", {"model": n, "keep_alive": -1}), names))
        assert {status for status, _ in answers} <= {200, 503} and any(status == 200 for status, _ in answers)
        assert len(d.state.registry.loaded) <= 3 and max(seen) <= 2
    finally:
        d.stop()
