"""Issue 14: the daemon must not fall over on hostile or odd input."""

from __future__ import annotations

import time

import ollama
import pytest

from api_helpers import post


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
