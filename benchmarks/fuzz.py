"""Fuzz the daemon: thousands of generated hostile requests against `mlxspec serve` in a subprocess.

    python benchmarks/fuzz.py [--requests 5000] [--seed 0]

Starts `mlxspec serve` with a temporary MLXSPEC_HOME holding tiny random models (tests/model_factory.py,
greedy, fast) and the Hugging Face hub switched off (HF_HUB_OFFLINE=1: /api/pull must fail fast, never
download). Requests come from the daemon's own OpenAPI document (GET /api/openapi.json) through
tests/openapi_fuzz.py, the generator tests/server/test_fuzz.py uses: schema-valid bodies, schemathesis's
negative ones, hostile mutations and raw bytes. The property per request: no 5xx, the status one the
document lists, every 4xx the documented JSON error, every 200 the documented schema, a valid body never
refused for its shape, no internal error inside a stream, and the daemon alive. Every 250 requests, and
at the end, a normal generate must still work. Writes counts by status and by mode, the failures, and
whether the daemon crashed to benchmarks/results/fuzz.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent
# this checkout's mlxspec (not another one installed in the venv), and the tests' helpers
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests"), str(HERE.parent / "tests" / "server")]

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from api_helpers import post  # noqa: E402
from daemon_harness import ProcessDaemon  # noqa: E402
from openapi_fuzz import Call, requests, send  # noqa: E402
from model_factory import make_model_dir  # noqa: E402
from report import write_report  # noqa: E402

MODELS = ["tiny", "tiny-draft", "tiny-lookup", "base", "go"]
NORMAL = {"model": "control", "prompt": "Once upon a time", "stream": False, "options": {"num_predict": 4}}


def store_models(home: Path) -> dict:
    """Tiny models on disk, and the store entries the fuzz aims at."""
    from mlxspec.store import Manifest, Store

    model = make_model_dir(home / "models" / "tiny", seed=0)
    store = Store(home)
    store.save("tiny", Manifest(target=str(model)))
    store.save("tiny-draft", Manifest(target=str(model), draft=str(model)))
    store.save("tiny-lookup", Manifest(target=str(model), drafter="lookup"))
    store.save("base", Manifest(target=str(model), template="{{ prompt }}"))
    store.save("go", Manifest(target=str(model), template="{{ if .System }}{{ .System }} {{ end }}{{ .Prompt }}",
                              system="Be brief.", messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]))
    store.save("control", Manifest(target=str(model)))  # not aimed at: the normal request after hostile ones
    return {"MLXSPEC_MODEL_DIRS": str(home / "models")}


def run(n: int, seed_value: int, home: Path) -> dict:
    env = {**store_models(home), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(HERE.parent), "MLXSPEC_KEEP_ALIVE": "5m"}
    daemon = ProcessDaemon(home, env).start()
    statuses: Counter = Counter()
    by_endpoint: Counter = Counter()
    by_mode: Counter = Counter()
    failures: list[dict] = []
    errors: Counter = Counter()
    sent = {"n": 0, "crashed": False, "normal_failed": 0}
    start = time.monotonic()

    status, doc = post(daemon.url + "/api/openapi.json", None, method="GET")
    assert status == 200, doc

    def normal_ok() -> bool:
        status, _, raw = send(daemon.url, Call("POST", "/api/generate", "/api/generate", NORMAL, "valid"), doc)
        if status != 200:
            failures.append({"why": f"normal request: {status} {raw[:300]!r}"})
        return status == 200

    @seed(seed_value)
    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(requests(doc, MODELS, [str(home / "models" / "tiny")]))
    def one(call):
        if sent["crashed"]:
            return
        status, why, raw = send(daemon.url, call, doc)
        if status and 400 <= status < 500:  # what was refused, to judge how deep the fuzz reaches
            errors[f"{call.operation} {status} {raw[:70].decode('utf-8', 'replace')}"] += 1
        sent["n"] += 1
        statuses[str(status)] += 1
        by_endpoint[f"{call.method} {call.operation} {status}"] += 1
        by_mode[f"{call.mode} {status}"] += 1
        if why:
            failures.append({"method": call.method, "path": call.path, "mode": call.mode, "status": status, "why": why,
                             "body": repr(call.body)[:500]})
        if daemon.proc.poll() is not None:
            sent["crashed"] = True
            failures.append({"method": call.method, "path": call.path, "why": f"daemon exited with {daemon.proc.returncode}",
                             "body": repr(call.body)[:500]})
        elif sent["n"] % 250 == 0:
            sent["normal_failed"] += not normal_ok()
            print(f"{sent['n']} requests, {len(failures)} failures, {time.monotonic() - start:.0f} s", flush=True)

    try:
        one()
        alive = daemon.proc.poll() is None and normal_ok()
    finally:
        daemon.stop()
    return {
        "requests": sent["n"], "seconds": round(time.monotonic() - start, 1), "seed": seed_value,
        "statuses": dict(sorted(statuses.items())), "by_mode": dict(sorted(by_mode.items())),
        "5xx": sum(v for k, v in statuses.items() if k.startswith("5")),
        "failures": len(failures), "crashes": int(sent["crashed"]),
        "normal_request_failed_midway": sent["normal_failed"], "alive_and_answering_at_end": alive,
        "by_endpoint": dict(sorted(by_endpoint.items())), "failure_samples": failures[:50],
        "top_refusals": dict(errors.most_common(40)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results" / "fuzz.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlxspec-fuzz-") as home:
        report = run(args.requests, args.seed, Path(home))
    write_report(report, args.out, hide=("by_endpoint", "failure_samples", "top_refusals"))
    for f in report["failure_samples"][:10]:
        print(f)


if __name__ == "__main__":
    main()
