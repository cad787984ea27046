"""The int8 CPU matmul over MLX's row layout vs its own (packed codes, biases implied), one row.

    python benchmarks/bench_layout.py                          # gemma3-1B's and SmolLM2's shapes, 4-bit
    python benchmarks/bench_layout.py --shapes 4096x2048 --bits 8 --matrices 8
    python benchmarks/bench_layout.py --isa 2                  # the AVX2 int8 path (CPUs without VNNI)

Each variant multiplies one row by --matrices different random matrices of a shape in one graph
(more bytes than the caches hold, so the weights come from memory), alternated within one process,
medians of --repeats. Variants: "rows" (MLX's layout, biases read), "packed" (codes packed 4 columns
chunk by chunk, packing.py), "packed+implied" (biases -2^(bits-1) x scale, computed, not read).
Every variant's output is checked bit for bit against "rows" first. Writes benchmarks/results/layout.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mlxspec.bench.hardware import machine_facts, mlx_facts  # noqa: E402
from mlxspec.kernels.build import load_cpu_extension  # noqa: E402
from mlxspec.kernels.packing import PACK, pack_codes  # noqa: E402
from mlxspec.kernels.reference import random_quantized  # noqa: E402

SHAPES = "6912x1152,1152x6912,1536x576,4096x2048"


def variants(n: int, k: int, bits: int, group: int, count: int) -> dict:
    """name -> (matrices, call kwargs); biases are c x scales so every variant computes the same."""
    c = -(2.0 ** (bits - 1))
    rows, packed = [], []
    for i in range(count):
        w, s, _ = random_quantized(n, k, group, bits, mx.float16, key=mx.random.key(i))
        rows.append((w, s, s * c))
        packed.append((pack_codes(w, bits), s, s * c))
    mx.eval(rows, packed)
    return {"rows": (rows, {}), "packed": (packed, {"pack": PACK}),
            "packed+implied": (packed, {"pack": PACK, "bias_of_scale": c})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES, help="NxK,... (N output columns, K inputs)")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--matrices", type=int, default=26, help="different matrices per graph (26: gemma3-1B's layers)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--isa", type=int, default=-1, help="-1: the best here; 2: AVX2; 0: the portable path")
    ap.add_argument("--out", default=str(HERE / "results" / "layout.json"))
    args = ap.parse_args()
    ext = load_cpu_extension()
    mx.set_default_device(mx.cpu)
    report = {"bits": args.bits, "group": args.group, "matrices": args.matrices, "repeats": args.repeats,
              "isa": args.isa, "q8_path": ext.q8_path() if args.isa < 0 else f"isa {args.isa}", "machine": machine_facts(), "mlx": mlx_facts(), "shapes": {}}
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        runs = variants(n, k, args.bits, args.group, args.matrices)
        x = mx.random.normal((1, k), key=mx.random.key(99))
        nbytes = sum(a.nbytes for m in runs["rows"][0] for a in m)

        def call(name):
            mats, kw = runs[name]
            return [ext.qmm(x, w, s, b, args.group, args.bits, args.isa, q8=True, **kw) for w, s, b in mats]

        want = call("rows")
        for name in runs:  # the same bits, or the timing means nothing
            assert all(mx.array_equal(a, b).item() for a, b in zip(call(name), want)), name
        times = {name: [] for name in runs}
        for r in range(args.repeats + 2):
            order = list(runs) if r % 2 else list(reversed(runs))
            for name in order:
                t0 = time.perf_counter()
                mx.eval(call(name))
                if r >= 2:  # two warm-up rounds
                    times[name].append(time.perf_counter() - t0)
        row = {name: {"ms": round(1e3 * statistics.median(t), 3), "gbs": round(nbytes / statistics.median(t) / 1e9, 1)}
               for name, t in times.items()}
        for name in row:
            row[name]["vs_rows"] = round(row["rows"]["ms"] / row[name]["ms"], 2)
        report["shapes"][shape] = row
        print(f"{shape}: " + ", ".join(f"{n} {v['gbs']} GB/s ({v['vs_rows']}x)" for n, v in row.items()), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
