"""One 4-bit matmul per kernel under NVIDIA Nsight Compute: where the time of a small decoding matmul goes.

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section LaunchStats \
        python3 benchmarks/ncu_qmm.py [--shapes 4096x4096,14336x4096] [--rows 1,8]

On the H100 (benchmarks/results/gpu_h100.md) a 4096 x 4096 matmul took ~110 us a call with our
kernels against ~75 with MLX's, timed one evaluation per call, while on the 128256 x 4096 head ours
was faster. Sync-dominated timings cannot say whether that is the kernel itself (latency with few
warps a column tile?) or host work. This script compiles and warms every kernel first, then turns
the profiler on (cuProfilerStart through the driver) for exactly one launch of each: MLX's
quantized_matmul, the FMA qmm and the tensor-core qmm, per shape and row count. ncu then reports
each kernel's duration, DRAM throughput, achieved occupancy and launch shape.
"""

from __future__ import annotations

import argparse
import ctypes

import mlx.core as mx

from mlxspec.kernels.reference import random_quantized


def profiler(on: bool) -> None:
    """cuProfilerStart / cuProfilerStop on the context MLX made current (ncu --profile-from-start off)."""
    driver = ctypes.CDLL("libcuda.so.1")
    result = driver.cuProfilerStart() if on else driver.cuProfilerStop()
    if result != 0:
        raise RuntimeError(f"cuProfiler{'Start' if on else 'Stop'} returned {result}")


def main() -> None:
    from mlxspec.kernels import gpu

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4096x4096,14336x4096")
    ap.add_argument("--rows", default="1,8")
    args = ap.parse_args()
    fma = gpu.cuda_qmm_function()
    kernels = {"mlx": None, "fma": fma, "mma": gpu.cuda_mma_qmm_function(fma)}
    calls = []
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        w, s, b = random_quantized(n, k, 64, 4, mx.float16, key=mx.random.key(n + k))
        for m in map(int, args.rows.split(",")):
            x = mx.random.normal((m, k), key=mx.random.key(m)).astype(mx.float16)
            for name, fn in kernels.items():
                call = (lambda x=x, w=w, s=s, b=b: mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=4)) \
                    if fn is None else (lambda x=x, w=w, s=s, b=b, fn=fn: fn(x, w, s, b, 64, 4))
                calls.append((f"{name} {n}x{k} M={m}", call))
    for _, call in calls:  # compile and warm outside the profiled range
        mx.eval(call())
    mx.synchronize()
    for label, call in calls:
        print(f"profiling: {label}", flush=True)
        profiler(True)
        mx.eval(call())
        mx.synchronize()
        profiler(False)


if __name__ == "__main__":
    main()
