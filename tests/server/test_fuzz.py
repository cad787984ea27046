"""Issue 14: property-based fuzz of every endpoint, driven by the daemon's own OpenAPI document
(GET /api/openapi.json; strategies and checks in tests/openapi_fuzz.py).

Property: no 5xx, every status one the document lists for the operation, every 4xx the documented
JSON error, every 200 (each NDJSON line, each SSE event) the documented schema, a schema-valid body
never refused for a field's shape, and the daemon still answers a normal request afterwards. A
bounded, deterministic run (~300 requests); benchmarks/fuzz.py runs thousands against a daemon
subprocess. MLXSPEC_FUZZ_EXAMPLES=N runs N here instead.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings

from api_helpers import post
from conftest import populate
from daemon_harness import ThreadDaemon
from openapi_fuzz import requests, send, valid_requests
from mlxspec.server import Settings
from mlxspec.store import Manifest, Store

MODELS = ["tiny", "tiny-plain", "base", "fim", "broken"]
EXAMPLES = int(os.environ.get("MLXSPEC_FUZZ_EXAMPLES", "300"))


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


def test_no_request_breaks_the_documented_contract(fuzzed, tiny_llama):
    status, doc = post(fuzzed.url + "/api/openapi.json", None, method="GET")
    assert status == 200 and doc["openapi"].startswith("3.")
    failures, reached = [], Counter()

    @settings(max_examples=EXAMPLES, database=None, deadline=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(requests(doc, MODELS, [str(tiny_llama)]))
    def one(call):
        status, why, _ = send(fuzzed.url, call, doc, timeout=60)
        reached[(call.operation, call.mode, status)] += 1
        if why:  # collected, not asserted: one run reports every distinct failure, not the first
            failures.append((status, call.method, call.path, call.mode, why, repr(call.body)[:300]))

    one()
    # the generated bodies get through to the models, not only to the first check: where chance (the draws
    # follow the temporary paths in the bodies) left an operation without a 200, look for one on purpose
    answered = {op for (op, mode, status), n in reached.items() if mode == "valid" and status == 200}
    for path in sorted({"/api/generate", "/api/chat", "/v1/chat/completions"} - answered):
        def answers(call) -> bool:
            status, why, _ = send(fuzzed.url, call, doc, timeout=60)
            if why:
                failures.append((status, call.method, call.path, call.mode, why, repr(call.body)[:300]))
            return status == 200

        find(valid_requests(doc, MODELS, [str(tiny_llama)], path), answers,
             settings=settings(max_examples=100, database=None, deadline=None, phases=[Phase.generate],
                               suppress_health_check=list(HealthCheck)))
    assert not failures, "\n".join(map(str, failures[:10]))
    status, body = post(fuzzed.url + "/api/generate", {"model": "control", "prompt": "Once upon", "stream": False,
                                                       "options": {"num_predict": 3}})
    assert status == 200 and body["done"], body
