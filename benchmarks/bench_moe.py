"""One mixture-of-experts projection on the CPU: MLX's gather_qmm vs mlxspec's gather kernel.

    python benchmarks/bench_moe.py [--repeats 9]

Shape of Qwen3-30B-A3B's expert gate/up projections (128 experts, 2048 -> 768, 4-bit, group 32),
8 experts per token, for 1 token (a decoding step) and 8 tokens (a verify pass), with float16
(MLX models, Q4_0/Q8_0 GGUFs) and float32 (K-quant GGUFs) scales and activations: median
microseconds of an evaluated call, the kernel with fp32 and with int8 activations, interleaved.
Writes benchmarks/results/moe.json.
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

E, N, K, USED = 128, 768, 2048, 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "moe.json"))
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    kernels = {a: cpu_gather_qmm_function(activations=a) for a in ("f32", "q8")}
    rows = []
    for dtype, tokens in ((mx.float16, 1), (mx.float16, 8), (mx.float32, 1), (mx.float32, 8)):
        w = mx.random.randint(0, 2**32 - 1, (E, N, K * 4 // 32), dtype=mx.uint32, key=mx.random.key(0))
        s = (mx.random.uniform(shape=(E, N, K // 32), key=mx.random.key(1)) * 0.01).astype(dtype)
        b = (mx.random.normal((E, N, K // 32), key=mx.random.key(2)) * 0.01).astype(dtype)
        mx.eval(w, s, b)
        x = mx.random.normal((tokens, K), key=mx.random.key(3)).astype(dtype)
        idx = mx.random.randint(0, E, (tokens, USED), key=mx.random.key(4)).astype(mx.uint32)
        pairs, ids = mx.repeat(x, USED, axis=0), idx.reshape(-1)
        calls = {"mlx gather_qmm": lambda: mx.gather_qmm(x[:, None, None], w, s, b, rhs_indices=idx, transpose=True,
                                                         group_size=32, bits=4),
                 **{f"mlxspec {a}": (lambda g=g: g(pairs, w, s, b, ids, 32, 4)) for a, g in kernels.items()}}
        times = {name: [] for name in calls}
        for _ in range(3):  # interleaved rounds
            for name, fn in calls.items():
                times[name].append(time_call(fn, repeats=args.repeats))
        row = {"dtype": str(dtype).split(".")[-1], "tokens": tokens, **{f"{n} us": round(statistics.median(t), 1) for n, t in times.items()}}
        row["speedup q8"] = round(row["mlx gather_qmm us"] / row["mlxspec q8 us"], 1)
        rows.append(row)
        print(row)
    report = {"machine": platform.processor() or platform.machine(), "mlx": mx.__version__,
              "shape": {"experts": E, "n": N, "k": K, "used": USED, "bits": 4, "group": 32}, "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
