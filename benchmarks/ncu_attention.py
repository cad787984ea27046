"""One launch of each attention kernel under NVIDIA Nsight Compute: why a few-row pass over a long cache is slow.

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis python3 benchmarks/ncu_attention.py

On an H200 (benchmarks/results/gpu_h200.md, 2026-11-28; H=32, HKV=8, D=128, fp16) our kernel took 319-527 us a call
at 16 rows over 8,192 keys against MLX's 57, and 38 us at one row over 300 keys against 7: far more than its reads
and arithmetic predict, so latency, occupancy or stalls. This warms every case first (JIT compiles, self-check),
then turns the profiler on for exactly one call of each: MLX's scaled_dot_product_attention, and ours with the
production's choice of warps and with 1 and 8 warps for every launch (the same bits), and the tensor-core family
(gpu_attention_mma_source.py, bits of its own). ncu then reports each
kernel's duration, throughput, occupancy, launch shape and where its warps stall. --dry (a CPU test) runs the
calls through the CPU kernel without the profiler.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parent))

CASES = {"full": [(1, 300), (1, 8192), (16, 8192), (8, 1000)], "quick": [(1, 40), (4, 40)]}  # (rows, keys)


def attention_calls(heads: int, kv_heads: int, dim: int, cases, dry: bool) -> list[tuple[str, object]]:
    """(label, call) for MLX's op and each build of ours, per (rows, keys) case."""
    from mlxspec.kernels import gpu_attention
    from mlxspec.kernels.cpu import cpu_sdpa_function

    scale = dim**-0.5
    if dry:
        ours = {"ours": cpu_sdpa_function()}
    else:
        make = gpu_attention.cuda_sdpa_function
        ours = {"ours": make(), "ours-w1": make(1), "ours-w8": make(8), "ours-mma": gpu_attention.cuda_sdpa_mma_function()}
    calls = []
    for m, keys in cases:
        kq, kk, kv = mx.random.split(mx.random.key(keys + m), 3)
        q = mx.random.normal((1, heads, m, dim), key=kq).astype(mx.float16)
        k = mx.random.normal((1, kv_heads, keys, dim), key=kk).astype(mx.float16)
        v = mx.random.normal((1, kv_heads, keys, dim), key=kv).astype(mx.float16)
        calls.append((f"mlx M={m} keys={keys}", lambda q=q, k=k, v=v: mx.fast.scaled_dot_product_attention(
            q, k, v, scale=scale, mask="causal")))
        calls += [(f"{name} M={m} keys={keys}", lambda q=q, k=k, v=v, f=f: f(q, k, v, scale, True))
                  for name, f in ours.items()]
    return calls


def main(argv: list[str] | None = None) -> list[str]:
    from ncu_qmm import profiler

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small shapes (a CPU test)")
    ap.add_argument("--dry", action="store_true", help="the CPU kernel, no profiler calls (a machine without CUDA)")
    args = ap.parse_args(argv)
    shape = (4, 2, 64) if args.quick else (32, 8, 128)
    calls = attention_calls(*shape, CASES["quick" if args.quick else "full"], args.dry)
    for _, call in calls:  # compile and warm outside the profiled range
        mx.eval(call())
    mx.synchronize()
    for label, call in calls:
        print(f"profiling: {label}", flush=True)
        if not args.dry:
            profiler(True)
        mx.eval(call())
        mx.synchronize()
        if not args.dry:
            profiler(False)
    return [label for label, _ in calls]


if __name__ == "__main__":
    main()
