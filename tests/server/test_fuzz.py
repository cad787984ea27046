"""Issue 14: property-based fuzz of every endpoint (strategies in tests/fuzz_bodies.py).

Property: no 5xx, every 4xx a JSON error with a message, no internal error inside a 200 stream,
and the daemon still answers a normal request afterwards. A bounded, deterministic run (~150
requests, about 10 s); benchmarks/fuzz.py runs thousands against a daemon subprocess.
MLXSPEC_FUZZ_EXAMPLES=N runs N here instead.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from api_helpers import post
from conftest import populate
from daemon_harness import ThreadDaemon
from fuzz_bodies import requests, send
from mlxspec.server import Settings
from mlxspec.store import Manifest, Store

MODELS = ["tiny", "tiny-plain", "base", "fim", "broken"]
EXAMPLES = int(os.environ.get("MLXSPEC_FUZZ_EXAMPLES", "150"))


@pytest.fixture(scope="module")
def fuzzed(tiny_llama, base_model, tmp_path_factory):
    """A daemon of its own: the fuzz creates, copies and deletes models, which must not touch the shared one's."""
    import huggingface_hub.constants

    # /api/pull and repo-id models must fail fast, never download (read at call time by the hub library)
    offline, huggingface_hub.constants.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE, True
    store = Store(tmp_path_factory.mktemp("fuzz-home"))
    populate(store, tiny_llama, base_model)
    store.save("control", Manifest(target=str(tiny_llama)))  # not aimed at by the fuzz
    d = ThreadDaemon(store, Settings(max_loaded=3, model_dirs=[tmp_path_factory.getbasetemp().resolve()])).start()
    yield d
    d.stop()
    huggingface_hub.constants.HF_HUB_OFFLINE = offline


def test_no_request_gets_a_5xx_or_a_shapeless_error(fuzzed):
    failures = []

    @settings(max_examples=EXAMPLES, database=None, deadline=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(requests(MODELS))
    def one(call):
        method, path, body = call
        status, why, _ = send(fuzzed.url, method, path, body, timeout=60)
        if why:  # collected, not asserted: one run reports every distinct failure, not the first
            failures.append((status, method, path, why, repr(body)[:300]))

    one()
    assert not failures, "\n".join(map(str, failures[:10]))
    status, body = post(fuzzed.url + "/api/generate", {"model": "control", "prompt": "Once upon", "stream": False,
                                                       "options": {"num_predict": 3}})
    assert status == 200 and body["done"], body
