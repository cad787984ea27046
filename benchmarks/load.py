"""Load test: N concurrent streaming clients (the official ollama and openai clients) against a daemon.

    python benchmarks/load.py [--model smollm2-135m] [--clients 64] [--rounds 3] [--max-tokens 32]
    python benchmarks/load.py --url http://127.0.0.1:11435 ...   # an already running daemon

Without --url it starts `mlxspec serve` on a free port with a temporary MLXSPEC_HOME (the model is
a name from models/ or any reference `mlxspec create` takes). Half the clients use `ollama.AsyncClient`
(/api/chat), half `openai.AsyncOpenAI` (/v1/chat/completions), all streaming, greedy. Reports
per-request latency (first token, total) p50/p99, outcomes by status, lost streams (a stream that
ended without its final object or raised mid-stream), and the daemon's RSS before, after warm-up and
at the end. Writes benchmarks/results/load.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from report import write_report

HERE = Path(__file__).parent
PROMPTS = ["Tell me a short story about a fox.", "Explain what a KV cache is.", "List three prime numbers.",
           "Write a haiku about rain.", "Fix the spelling: teh quick brwon fox."]


def rss_bytes(pid: int) -> int | None:
    """Resident set size of a process (Linux /proc, else ps)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(subprocess.check_output(["ps", "-o", "rss=", "-p", str(pid)]).strip()) * 1024
    except (OSError, subprocess.CalledProcessError, ValueError):
        return None


def start_daemon(model: str) -> tuple[subprocess.Popen, str, str]:
    """`mlxspec serve` on a free port with a fresh home, and `model` created in it as 'load'."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tempfile.mkdtemp(prefix="mlxspec-load-")
    env = {**os.environ, "MLXSPEC_HOME": home, "MLXSPEC_HOST": f"127.0.0.1:{port}", "MLXSPEC_MAX_QUEUE": "4096"}
    cli = [sys.executable, "-m", "mlxspec"]
    proc = subprocess.Popen([*cli, "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(Path(home) / "serve.err", "w"))
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    subprocess.run([*cli, "create", "load", "--from", model], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return proc, url, "load"


async def ollama_stream(url: str, model: str, prompt: str, max_tokens: int) -> dict:
    import ollama

    client = ollama.AsyncClient(host=url)
    start, first, done = time.perf_counter(), None, False
    stream = await client.chat(model, messages=[{"role": "user", "content": prompt}], stream=True,
                               options={"temperature": 0, "num_predict": max_tokens})
    async for part in stream:
        first = first or time.perf_counter()
        done = done or bool(part.done)
    return {"api": "ollama", "done": done, "ttft": (first or time.perf_counter()) - start,
            "total": time.perf_counter() - start}


async def openai_stream(url: str, model: str, prompt: str, max_tokens: int) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    start, first, done = time.perf_counter(), None, False
    stream = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                  stream=True, temperature=0, max_tokens=max_tokens)
    async for chunk in stream:
        first = first or time.perf_counter()
        done = done or any(c.finish_reason for c in chunk.choices)
    await client.close()
    return {"api": "openai", "done": done, "ttft": (first or time.perf_counter()) - start,
            "total": time.perf_counter() - start}


async def one(url: str, model: str, i: int, max_tokens: int) -> dict:
    call = ollama_stream if i % 2 == 0 else openai_stream
    try:
        result = await call(url, model, PROMPTS[i % len(PROMPTS)], max_tokens)
        result["status"] = 200 if result["done"] else "lost"  # ended without its final object
    except Exception as e:  # a client error carries the HTTP status; anything else is a lost stream
        status = getattr(e, "status_code", None) or getattr(e, "status", None)
        result = {"api": call.__name__.split("_")[0], "status": status or "lost", "error": f"{type(e).__name__}: {e}"[:200]}
    return result


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 4)


async def run(url: str, model: str, clients: int, rounds: int, max_tokens: int, pid: int | None) -> dict:
    await one(url, model, 0, 4)  # load the model
    rss = {"after_load": rss_bytes(pid) if pid else None}
    results = []
    for r in range(rounds):
        results += await asyncio.gather(*(one(url, model, i, max_tokens) for i in range(clients)))
        if r == 0:
            rss["after_warmup"] = rss_bytes(pid) if pid else None
    rss["end"] = rss_bytes(pid) if pid else None
    ok = [x for x in results if x["status"] == 200]
    outcomes: dict[str, int] = {}
    for x in results:
        outcomes[str(x["status"])] = outcomes.get(str(x["status"]), 0) + 1
    growth = (rss["end"] / rss["after_warmup"] - 1) if rss.get("end") and rss.get("after_warmup") else None
    return {
        "clients": clients, "rounds": rounds, "requests": len(results), "max_tokens": max_tokens,
        "outcomes": outcomes, "lost_streams": outcomes.get("lost", 0),
        "ttft_s": {"p50": percentile([x["ttft"] for x in ok], 0.5), "p99": percentile([x["ttft"] for x in ok], 0.99)},
        "total_s": {"p50": percentile([x["total"] for x in ok], 0.5), "p99": percentile([x["total"] for x in ok], 0.99)},
        "rss_bytes": rss, "rss_growth_after_warmup": round(growth, 4) if growth is not None else None,
        "errors": sorted({x["error"] for x in results if "error" in x})[:10],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running daemon (default: start one)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out", default=str(HERE / "results" / "load.json"))
    args = ap.parse_args()
    proc = None
    if args.url:
        url, model, pid = args.url, args.model, None
    else:
        proc, url, model = start_daemon(args.model)
        pid = proc.pid
    try:
        report = asyncio.run(run(url, model, args.clients, args.rounds, args.max_tokens, pid))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    report.update(model=args.model)
    write_report(report, args.out, hide=("errors",))

if __name__ == "__main__":
    main()
