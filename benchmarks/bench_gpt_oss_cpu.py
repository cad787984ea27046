"""gpt-oss-20b's decoding step on the CPU, a few of its layers at their real size: MLX's ops vs mlxspec's kernels.

    python benchmarks/bench_gpt_oss_cpu.py [--layers 4] [--context 512] [--repeats 5]

A random model of gpt-oss-20b's shape (hidden 2880, 64 query / 8 kv heads of 64, 32 experts of 2880,
4 per token, a 128-token window on every other layer, attention sinks), quantized as mlx-community's
MXFP4-Q8 conversion is (experts mxfp4, the rest 8-bit affine, group 64; bfloat16 activations), with
`--layers` of its 24 layers. One forward of M = 1 (a decoding step) and M = 8 rows (a verify pass)
after `--context` tokens, MLX's ops vs the kernels with int8 activations (what `auto` picks there),
interleaved, medians; and whether M-row forwards equal one-row steps with the kernels. Writes
benchmarks/results/gpt_oss_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

CONFIG = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_attention_heads": 64,
          "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4,
          "sliding_window": 128, "rope_theta": 150000, "vocab_size": 201088, "rms_norm_eps": 1e-5}


def model(layers: int) -> nn.Module:
    from mlx_lm.utils import _get_classes

    from mlxspec.cache import exact_windows

    config = dict(CONFIG, num_hidden_layers=layers, layer_types=["sliding_attention", "full_attention"] * (layers // 2))
    model_class, args_class = _get_classes(config)
    m = model_class(args_class.from_dict(config))
    m.set_dtype(mx.bfloat16)
    nn.quantize(m, 32, 4, mode="mxfp4", class_predicate=lambda p, mod: "experts" in p and hasattr(mod, "to_quantized"))
    nn.quantize(m, 64, 8, class_predicate=lambda p, mod: isinstance(mod, (nn.Linear, nn.Embedding)))
    key = mx.random.key(0)
    for layer in m.model.layers:  # random codes and exponents in place of quantizing random floats (13 GB peaks)
        for proj in (layer.mlp.experts.gate_proj, layer.mlp.experts.up_proj, layer.mlp.experts.down_proj):
            key, k1, k2 = mx.random.split(key, 3)
            e, n, words = proj.weight.shape
            proj.weight = mx.random.randint(0, 2**32 - 1, (e, n, words), dtype=mx.uint32, key=k1)
            proj.scales = mx.random.randint(118, 124, proj.scales.shape, key=k2).astype(mx.uint8)
    for part in [m.model.embed_tokens, *m.model.layers, m.model.norm, m.lm_head]:  # one at a time: float weights
        mx.eval(part.parameters())  # exist only while their part is quantized
    exact_windows(m)
    return m


def main() -> None:
    from mlxspec.bench.forwards import interleaved_forwards
    from mlxspec.cache import new_cache
    from mlxspec.exactness import RowInvariance
    from mlxspec.kernels.install import install_kernels, remove_kernels

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpt_oss_cpu.json"))
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    m = model(args.layers)
    report = install_kernels(m, activations="q8")
    kept = {p: why for p, why in report["layers"]["kept"].items()}
    cache = new_cache(m)
    for c in range(0, args.context, 256):
        m(mx.random.randint(0, 50000, (1, min(256, args.context - c))), cache=cache)
        mx.eval([x.state for x in cache])
    variants = {"mlx": lambda: remove_kernels(m), "kernels": lambda: install_kernels(m, activations="q8")}
    times = interleaved_forwards(m, cache, variants, (1, 8), args.repeats, vocab=50000)
    out = {"machine": platform.processor() or platform.machine(), "mlx": mx.__version__, "layers": args.layers,
           "context": args.context, "command": f"python benchmarks/bench_gpt_oss_cpu.py --layers {args.layers} "
           f"--context {args.context} --repeats {args.repeats}", "kept_layers": len(kept),
           "ms": {v: {r: round(statistics.median(ts) * 1e3, 2) for r, ts in t.items()} for v, t in times.items()}}
    out["speedup"] = {r: round(out["ms"]["mlx"][r] / out["ms"]["kernels"][r], 1) for r in (1, 8)}
    install_kernels(m, activations="q8")
    out["row_invariant_to_8"] = RowInvariance(m).holds(8)
    print(json.dumps(out, indent=1))
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
