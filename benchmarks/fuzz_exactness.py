"""Fuzz exactness: speculation against plain decoding over thousands of random requests.

    python benchmarks/fuzz_exactness.py [--cases 2000] [--seed 0] [--minutes 20] [--emulate-gpu [cuda|metal]]
                                        [--without FAMILY] [--architectures] [--mlx-lm TYPES] [--out FILE]

Engines: tiny random llama and qwen2 models (tests/model_factory.py) and stories260K where ../shared has it, each
with the prompt-lookup drafter, a draft model that often disagrees (same tokenizer, other weights), early exit and
an untrained EAGLE head on the model quantized to 4 bits (its favourites trees make draft_width > 1 run
tree rounds); with --architectures also hybrid (gated delta net, Mamba-2), sliding-window, sink and MoE models with
prompt lookup (an MoE one quantized too: its experts through the gather qmm); --mlx-lm deepseek_v3,falcon_h1,...
adds those of tests/mlx_lm_architectures.py's table (any mlx-lm model type it configures) with prompt lookup.
A case draws a prompt (random words with repeated phrases, so lookup finds matches; one in ten long enough to run
as a prompt chunk) and options: draft length 1-8, adaptive or not, draft trees (width 2-3), max_tokens, a stop
string cut from plain decoding's own text, a repeat penalty, logprobs, a context window a few tokens past the
prompt, JSON output. The property:

- greedy: speculation's tokens, text, finish reason, stop string and logprobs == plain decoding's (the same
  engine and options with draft_length 0), bit for bit;
- seeded sampling (temperature, top-k/top-p/min-p): speculation gives the same tokens twice (reproducible).

Writes the counts, the drafted/accepted totals (that speculation really ran) and every mismatch with its case
(enough to replay it) to --out (default benchmarks/results/fuzz_exactness.json). Exit status 1 on a mismatch.

--emulate-gpu [cuda|metal] runs it all on an emulated GPU (tests/kernels/gpu_emulation.py: the kernels' wiring with
row-invariant stand-ins, compiled decoding steps, and MLX's matmul, quantized and gather matmuls, attention and
conv drifting with the row count, as a GPU's do), the engines in exact mode: a path of any request that still reaches one of
MLX's row-sensitive ops in a verify pass shows as a mismatch, and every speculative run must report `exact`.
--without FAMILY (repeatable) takes a kernel family away, as where it fails on a device: then a run may differ from
plain decoding only if it says `exact: false` (counted as `flagged`); one that differs and does not is a mismatch.
The twenty-third session's run of this kind (~5,700 greedy comparisons, then a script outside the repo) found
structured output cut short under lookup drafting (fixed in aa1cdc9).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]  # this checkout's mlxspec, the tests' model factory

from mlxspec.engine import Engine  # noqa: E402
from mlxspec.options import GenerateOptions  # noqa: E402
from mlx_lm_architectures import architecture_dir  # noqa: E402
from model_factory import ARCHITECTURES, make_model_dir, random_head  # noqa: E402

STORIES = HERE.parent.parent / "shared" / "models" / "stories260K"
WORDS = ("the cat sat on a mat and then it ran to the old red door where one small bird sang all day "
         "while we read some long books about far away hills { } : , \" 1 2 3").split()
DRAFTERS = ("lookup", "draft-model", "early-exit", "eagle")


EAGLE_QUANTIZE = "q4"  # tree passes run on the CPU where the target's blocks fuse (4/8-bit layers)
QUANTIZED_TOO = ("qwen3_moe",)  # --architectures: also quantized (groups of 32: each expert layer), for the gather qmm
MOE_QUANTIZE = "q4g32"


def random_eagle_head(model_dir: Path, out: Path) -> Path:
    """An untrained EAGLE head for the model quantized as EAGLE_QUANTIZE: exactness must not depend on training,
    and its favourites trees (draft_width > 1) run tree rounds, which only learned heads draft."""
    from mlxspec.loading import load

    return random_head(load(str(model_dir), quantize=EAGLE_QUANTIZE).model, out)


def engines(root: Path, stories: bool, kernels=None, architectures: bool = False, mlx_lm: tuple = ()) -> dict[str, Engine]:
    """name -> engine: each model with each drafter (the draft model: same tokenizer and shape, other weights;
    EAGLE: a random head); with `architectures`, model_factory.ARCHITECTURES's (hybrid, sliding windows, sinks, MoE)
    with prompt lookup too; `mlx_lm`: these model types of tests/mlx_lm_architectures.py's table with prompt lookup."""
    chosen = {"kernels": kernels} if kernels else {}  # else the engine's default
    models = {"llama": make_model_dir(root / "llama", "llama", seed=0),
              "qwen2": make_model_dir(root / "qwen2", "qwen2", seed=2, scale=1.0)}
    drafts = {"llama": make_model_dir(root / "llama-other", "llama", seed=1),
              "qwen2": make_model_dir(root / "qwen2-other", "qwen2", seed=3, scale=1.0)}
    if stories and STORIES.exists():
        models["stories260K"] = STORIES
    out = {}
    for name, path in models.items():
        for drafter in DRAFTERS:
            if drafter == "draft-model" and name not in drafts:
                continue
            draft = str(drafts[name]) if drafter == "draft-model" else None
            quantize = EAGLE_QUANTIZE if drafter == "eagle" else None
            if drafter == "eagle":
                drafter = f"eagle:{random_eagle_head(path, root / f'{name}-eagle')}"
            out[f"{name}/{drafter.split(':')[0]}"] = Engine.load(str(path), drafter=drafter, draft=draft, quantize=quantize,
                                                                 **chosen)
    for name, make in ARCHITECTURES.items() if architectures else ():
        path = str(make(root / name))
        out[f"{name}/lookup"] = Engine.load(path, drafter="lookup", **chosen)
        if name in QUANTIZED_TOO:
            out[f"{name}-{MOE_QUANTIZE}/lookup"] = Engine.load(path, drafter="lookup", quantize=MOE_QUANTIZE, **chosen)
    for model_type in mlx_lm:
        out[f"{model_type}/lookup"] = Engine.load(str(architecture_dir(root / model_type, model_type)), drafter="lookup",
                                                  **chosen)
    return out


LONG_PROMPTS = 0.1  # share of prompts of 50-160 words: more rows than a decoding pass has (a prompt chunk: passes.py)
MAX_PROMPT_TOKENS = 400  # the tiny models hold 512 positions; a longer draw is replaced by a short one


def prompt(rng: random.Random, long: bool = False) -> str:
    """Random words, a phrase of them repeated now and then (lookup's matches)."""
    phrase = rng.choices(WORDS, k=rng.randint(2, 6))
    words, most = [], rng.randint(50, 160) if long else 0
    while len(words) < (most or rng.randint(3, 40)):
        words += phrase if rng.random() < 0.3 else [rng.choice(WORDS)]
    return " ".join(words)


def request_text(rng: random.Random, engine: Engine) -> str:
    """A prompt for `engine`: now and then a long one (its prompt runs as a chunk, on a GPU through MLX's ops)."""
    text = prompt(rng, long=rng.random() < LONG_PROMPTS)
    return text if len(engine.encode(text)) <= MAX_PROMPT_TOKENS else prompt(rng)


def draw(rng: random.Random, prompt_tokens: int) -> dict:
    """A case's options (GenerateOptions fields, and `format`), greedy or seeded sampling."""
    case = {"draft_length": rng.randint(1, 8), "adaptive": rng.random() < 0.4, "max_tokens": rng.randint(1, 48)}
    if rng.random() < 0.3:
        case["draft_width"] = rng.randint(2, 3)
    if rng.random() < 0.25:
        case |= {"repeat_penalty": round(rng.uniform(1.05, 1.6), 2), "repeat_last_n": rng.choice([-1, 0, 4, 64])}
    if rng.random() < 0.3:
        case["logprobs"] = rng.randint(0, 3)
    if rng.random() < 0.2:
        case["num_ctx"] = prompt_tokens + rng.randint(1, 12)  # the window ends the answer
    if rng.random() < 0.15:
        case["format"] = "json"
    if rng.random() < 0.3:
        case |= {"temperature": round(rng.uniform(0.3, 1.5), 2), "seed": rng.randrange(2**32)}
        case |= rng.choice([{}, {"top_k": rng.randint(1, 20)}, {"top_p": round(rng.uniform(0.3, 1.0), 2)},
                            {"min_p": round(rng.uniform(0.0, 0.3), 2)}])
    return case


def run(engine: Engine, text: str, case: dict) -> dict:
    """One generation: its tokens, text, finish, stop string, logprobs and speculation counters."""
    fields = {k: v for k, v in case.items() if k != "format"}
    events = list(engine.generate(text, GenerateOptions(**fields), format=case.get("format")))
    last = events[-1]
    return {"tokens": [t for e in events for t in e.tokens], "text": "".join(e.text for e in events),
            "finish": last.finish_reason, "stop_string": last.stop_string,
            "logprobs": [dataclasses.astuple(lp) for e in events for lp in e.text_logprobs],
            "drafted": last.stats.drafted, "accepted": last.stats.accepted, "tree_rounds": last.stats.tree_rounds,
            "exact": last.stats.exact}


def check(engine: Engine, text: str, case: dict, rng: random.Random, exact: bool = False,
          flagged: bool = False) -> tuple[str | None, dict]:
    """(what differs or None, the speculative run). Greedy: against plain decoding; sampling: against itself.
    exact: the speculative run must also report `exact` (its verify rows measured equal to one-row steps).
    flagged: a run that reports exact=False may differ (a kernel family is missing), one that does not may not."""
    why, spec = _compare(engine, text, case, rng)
    if why is not None and flagged and spec["exact"] is False:
        spec["flagged"] = why
        return None, spec
    if why is None and exact and spec["drafted"] and spec["exact"] is not True:
        why = f"the run reports exact={spec['exact']}"
    return why, spec


def _compare(engine: Engine, text: str, case: dict, rng: random.Random) -> tuple[str | None, dict]:
    if case.get("temperature"):
        first, again = run(engine, text, case), run(engine, text, case)
        return (None if first["tokens"] == again["tokens"] else "seeded sampling not reproducible"), first
    plain = run(engine, text, {**case, "draft_length": 0})
    if plain["text"].strip() and rng.random() < 0.3:  # a stop string plain decoding's text contains
        start = rng.randrange(len(plain["text"]))
        case["stop"] = [plain["text"][start : start + rng.randint(1, 4)]]
        plain = run(engine, text, {**case, "draft_length": 0})
    spec = run(engine, text, case)
    for key in ("tokens", "text", "finish", "stop_string", "logprobs"):
        if spec[key] != plain[key]:
            return f"{key} differ from plain decoding's", spec
    return None, spec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=20.0, help="stop after this long, whatever --cases says")
    ap.add_argument("--no-stories", action="store_true", help="tiny random models only")
    ap.add_argument("--architectures", action="store_true", help="also hybrid, sliding-window, sink and MoE models "
                    "(tests/model_factory.py ARCHITECTURES) with prompt lookup")
    ap.add_argument("--mlx-lm", default="", metavar="TYPES", help="also these mlx-lm model types (comma-separated; "
                    "tests/mlx_lm_architectures.py builds them) with prompt lookup")
    ap.add_argument("--emulate-gpu", nargs="?", const="cuda", choices=("cuda", "metal"), default=None,
                    help="on an emulated GPU of this backend's wiring (default cuda; tests/kernels/gpu_emulation.py)")
    ap.add_argument("--without", action="append", default=[], metavar="FAMILY",
                    help="with --emulate-gpu: this kernel family (qmm, gather-qmm, dense, sdpa) unavailable, as where "
                         "it fails on a device; runs may then differ from plain decoding only where they say exact=false")
    ap.add_argument("--out", type=Path, default=None, help="default results/fuzz_exactness.json "
                    "(fuzz_exactness_emulated_gpu.json with --emulate-gpu)")
    args = ap.parse_args()
    if args.without and not args.emulate_gpu:
        ap.error("--without needs --emulate-gpu")
    args.out = args.out or HERE / "results" / f"fuzz_exactness{'_emulated_gpu' if args.emulate_gpu else ''}.json"
    with emulated_gpu(args.emulate_gpu, tuple(args.without)) if args.emulate_gpu else contextlib.nullcontext():
        return fuzz(args)


@contextlib.contextmanager
def emulated_gpu(backend: str = "cuda", without: tuple = ()):
    """The engines built inside see an emulated GPU with `backend`'s kernel wiring (as
    tests/kernels/test_gpu_emulated_exactness.py's), the families `without` names unavailable."""
    import mlx.core as mx
    import pytest

    sys.path.insert(0, str(HERE.parent / "tests" / "kernels"))
    from gpu_emulation import emulate_gpu

    patch, default = pytest.MonkeyPatch(), mx.default_device()
    mx.set_default_device(mx.cpu)
    try:
        emulate_gpu(patch, backend, without)
        yield
    finally:
        from mlxspec.kernels import registry

        patch.undo()
        registry.reset()
        mx.set_default_device(default)


def provenance() -> dict:
    """What a result file needs to be read later: the command, commit, machine and versions, the date."""
    import os
    import platform
    import subprocess
    from importlib.metadata import version

    import mlx.core as mx

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"command": " ".join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]]), "commit": commit,
            "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, MLX {mx.__version__}, "
                       f"mlx-lm {version('mlx-lm')}", "date": time.strftime("%Y-%m-%d")}


def fuzz(args) -> int:
    rng, start, made = random.Random(args.seed), time.time(), provenance()  # the commit that runs, not a later one
    report = {"emulated_gpu": args.emulate_gpu, "without": args.without, "architectures": args.architectures,
              "mlx_lm": args.mlx_lm,
              "seed": args.seed, "cases": 0, "flagged": 0, "greedy": 0, "sampled": 0, "drafted": 0, "accepted": 0,
              "tree_rounds": 0, "by_engine": {}, "mismatches": []}
    with tempfile.TemporaryDirectory() as tmp:
        pool = engines(Path(tmp), not args.no_stories, "exact" if args.emulate_gpu else None, args.architectures,
                       tuple(t for t in args.mlx_lm.split(",") if t))
        names = sorted(pool)
        while report["cases"] < args.cases and time.time() - start < args.minutes * 60:
            name = rng.choice(names)
            engine = pool[name]
            text = request_text(rng, engine)
            case = draw(rng, len(engine.encode(text)))
            why, spec = check(engine, text, case, rng, exact=bool(args.emulate_gpu) and not args.without,
                              flagged=bool(args.without))
            report["flagged"] += "flagged" in spec
            report["cases"] += 1
            report["sampled" if case.get("temperature") else "greedy"] += 1
            report["drafted"] += spec["drafted"]
            report["accepted"] += spec["accepted"]
            report["tree_rounds"] += spec["tree_rounds"]
            report["by_engine"][name] = report["by_engine"].get(name, 0) + 1
            if why:
                report["mismatches"].append({"engine": name, "prompt": text, "case": case, "why": why})
                print(f"MISMATCH {name}: {why}: {json.dumps(case)} prompt={text!r}", flush=True)
            if report["cases"] % 100 == 0:
                print(f"{report['cases']} cases, {len(report['mismatches'])} mismatches, "
                      f"{time.time() - start:.0f} s", flush=True)
    report["seconds"] = round(time.time() - start, 1)
    report |= made
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{report['cases']} cases ({report['greedy']} greedy, {report['sampled']} sampled), drafted "
          f"{report['drafted']}, accepted {report['accepted']}, tree rounds {report['tree_rounds']}, "
          f"{report['flagged']} differing with exact=false, {len(report['mismatches'])} mismatches; wrote {args.out}")
    return 1 if report["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
