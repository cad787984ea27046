"""One mixture-of-experts projection on the CPU: MLX's gather_qmm vs mlxspec's gather kernel.

    python benchmarks/bench_moe.py [--repeats 9] [--shape qwen3-30b|gpt-oss-20b]

qwen3-30b (default): Qwen3-30B-A3B's expert gate/up projections (128 experts, 2048 -> 768, 4-bit
affine, group 32), 8 experts per token, with float16 (MLX models, Q4_0/Q8_0 GGUFs) and float32
(K-quant GGUFs) scales and activations; the kernel with fp32 and with int8 activations.
gpt-oss-20b: its MXFP4 experts (32 experts, 2880 -> 2880, e2m1 codes, power-of-two scales), 4 per
token, bfloat16 (MLX models) and float32 (GGUF) activations; the kernel with int8 activations only
(mxfp4 runs there). For 1 token (a decoding step) and 8 tokens (a verify pass): median microseconds
of an evaluated call, interleaved. Writes benchmarks/results/moe.json (moe_gpt_oss.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import mlx.core as mx

from mlxspec.kernels.cpu import cpu_gather_qmm_function
from mlxspec.kernels.timing import time_call

SHAPES = {  # experts, n, k, used per token, mode, activations (dtypes), kernels
    "qwen3-30b": (128, 768, 2048, 8, "affine", (mx.float16, mx.float32), ("f32", "q8")),
    "gpt-oss-20b": (32, 2880, 2880, 4, "mxfp4", (mx.bfloat16, mx.float32), ("q8",)),
}


def experts(shape: str, dtype):
    """(w, scales, biases) of every expert, random, in MLX's layout for the shape's mode."""
    e, n, k, _, mode, _, _ = SHAPES[shape]
    w = mx.random.randint(0, 2**32 - 1, (e, n, k * 4 // 32), dtype=mx.uint32, key=mx.random.key(0))
    if mode == "mxfp4":
        return w, mx.random.randint(118, 124, (e, n, k // 32), key=mx.random.key(1)).astype(mx.uint8), None
    s = (mx.random.uniform(shape=(e, n, k // 32), key=mx.random.key(1)) * 0.01).astype(dtype)
    return w, s, (mx.random.normal((e, n, k // 32), key=mx.random.key(2)) * 0.01).astype(dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b")
    ap.add_argument("--out", help="default benchmarks/results/moe.json (moe_gpt_oss.json for gpt-oss-20b)")
    args = ap.parse_args()
    E, N, K, USED, mode, dtypes, acts = SHAPES[args.shape]
    out = args.out or str(Path(__file__).parent / "results" / ("moe.json" if args.shape == "qwen3-30b" else "moe_gpt_oss.json"))
    mx.set_default_device(mx.cpu)
    kernels = {a: cpu_gather_qmm_function(activations=a) for a in acts}
    extra = {} if mode == "affine" else {"mode": mode}
    rows = []
    for dtype in dtypes:
        w, s, b = experts(args.shape, dtype)
        mx.eval(w, s, b)
        for tokens in (1, 8):
            x = mx.random.normal((tokens, K), key=mx.random.key(3)).astype(dtype)
            idx = mx.random.randint(0, E, (tokens, USED), key=mx.random.key(4)).astype(mx.uint32)
            pairs, ids = mx.repeat(x, USED, axis=0), idx.reshape(-1)
            calls = {"mlx gather_qmm": lambda: mx.gather_qmm(x[:, None, None], w, s, b, rhs_indices=idx, transpose=True,
                                                             group_size=32, bits=4, mode=mode),
                     **{f"mlxspec {a}": (lambda g=g: g(pairs, w, s, b, ids, 32, 4, **extra)) for a, g in kernels.items()}}
            times = {name: [] for name in calls}
            for _ in range(3):  # interleaved rounds
                for name, fn in calls.items():
                    times[name].append(time_call(fn, repeats=args.repeats))
            row = {"dtype": str(dtype).split(".")[-1], "tokens": tokens,
                   **{f"{n} us": round(statistics.median(t), 1) for n, t in times.items()}}
            row["speedup q8"] = round(row["mlx gather_qmm us"] / row["mlxspec q8 us"], 1)
            rows.append(row)
            print(row, flush=True)
    report = {"machine": platform.processor() or platform.machine(), "mlx": mx.__version__, "command":
              f"python benchmarks/bench_moe.py --repeats {args.repeats} --shape {args.shape}",
              "shape": {"experts": E, "n": N, "k": K, "used": USED, "bits": 4, "group": 32, "mode": mode}, "rows": rows}
    Path(out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
