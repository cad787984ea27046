"""Every kernel of one decoding forward under NVIDIA Nsight Compute: how much of a step is GPU work.

    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw \
        python3 benchmarks/ncu_forward.py --variant kernels [--layers 8] [--rows 1]

On an H200 (benchmarks/results/gpu_h200.md, fourth session) a one-row forward of an 8B-shape model took
21.2 ms with mlxspec's kernels built eagerly against 9.9 ms with MLX's ops, while per call the kernels
timed as fast or faster than MLX's. This builds the same layers (fewer of them: each is the same work),
warms the variant up, then profiles exactly one forward (cuProfilerStart/Stop around it): ncu lists each
kernel that forward ran with its duration. Their sum against the forward's wall time (printed here,
measured without the profiler) says whether the step is GPU-bound or waits on the host, and the kernel
names say which part costs what. Run once per variant (mlx, kernels); --dry builds and runs without the
profiler (a CPU test).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))


def main(argv: list[str] | None = None) -> dict:
    import bench_gpu
    from ncu_qmm import profiler

    from mlxspec.cache import new_cache, rewind
    from mlxspec.kernels.install import install_kernels, remove_kernels

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=("mlx", "kernels"), default="kernels")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="bench_gpu's quick shape (a CPU test)")
    ap.add_argument("--dry", action="store_true", help="no profiler calls (a machine without CUDA)")
    args = ap.parse_args(argv)
    config = dict(bench_gpu.FORWARD_SHAPES["quick" if args.quick else "full"], num_hidden_layers=args.layers)
    model = bench_gpu.random_llama(config)
    install_kernels(model) if args.variant == "kernels" else remove_kernels(model)
    cache = new_cache(model)
    model(mx.random.randint(0, min(1000, config["vocab_size"]), (1, 256 if not args.quick else 32)), cache=cache)
    mx.eval([c.state for c in cache])
    x = mx.random.randint(0, min(1000, config["vocab_size"]), (1, args.rows))
    mx.eval(x)
    times = []
    for _ in range(12):  # warm: compiles, plans, allocations; the last 10 timed
        t = time.perf_counter()
        mx.eval(model(x, cache=cache))
        times.append(time.perf_counter() - t)
        rewind(cache, args.rows)
    mx.synchronize()
    if not args.dry:
        profiler(True)
    mx.eval(model(x, cache=cache))
    mx.synchronize()
    if not args.dry:
        profiler(False)
    rewind(cache, args.rows)
    report = {"variant": args.variant, "layers": args.layers, "rows": args.rows,
              "wall_ms": round(statistics.median(times[2:]) * 1e3, 3)}
    print(f"forward: {report}", flush=True)
    return report


if __name__ == "__main__":
    main()
