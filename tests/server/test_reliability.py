"""Issue 14: the daemon must not fall over on hostile or odd input."""

from __future__ import annotations

import http.client
import json
import time

import ollama
import pytest

from api_helpers import post
from daemon_harness import ThreadDaemon
from mlxspec.server import Settings
from mlxspec.store import Store


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
