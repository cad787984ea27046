"""Every mlx-lm architecture as mlxspec serves it: does speculation keep plain decoding's tokens, and say so?

    python benchmarks/sweep_architectures.py [--only a,b] [--no-gpu] [--drafter lookup|early-exit|draft-model]
                                             [--out FILE]

For each model file of the installed mlx-lm that tests/mlx_lm_architectures.py can configure (a tiny random model,
2-4 layers, a real tokenizer), float and 4-bit:
- cpu (or "device" where MLX's default device is a GPU: the real kernels and ops there): greedy plain decoding vs the
  prompt-lookup drafter (--drafter: another; draft-model drafts with the model itself, early-exit with its first
  layers) at draft lengths 2 and 5 (fixed): the same 24 tokens, some drafted, and `exact: true`; and plain decoding
  through compiled step graphs (a GPU's default: step_graph.py) against steps built each time (mlx-lm's caches):
  "same tokens" (and whether a few passes' logits are the model's own on mlx-lm's caches bit for bit, or how close),
  "differ" (a bug: the compiled steps compute another model), or why they were off; and "features": requests with
  logprobs (the same values) and with a JSON schema (the same tokens), drafting against plain; and "reuse": requests
  sharing part of those before them (a shorter prefix, an extension with the answer, the prompt with its last token
  changed) on those engines (the prefix cache rewound, extended, or back to its checkpoint): drafting against plain,
  and on this CPU against fresh engines (a GPU's prompt chunks change their bits with their rows, a reused prefix too);
- gpu (unless --no-gpu): the same engines built on an emulated GPU (tests/kernels/gpu_emulation.py: the kernels'
  CUDA wiring with row-invariant stand-ins, MLX's row-sensitive ops drifting with the row count) in exact mode:
  do 2..8-row verify passes equal one-row steps (exactness.RowInvariance), a draft length 5 run's tokens and flag,
  and plain decoding compiled against built each step there (the GPU kernels' reading of compiled steps' buffers).
A row is "exact" where the tokens match and the flag says so, "flagged" where the engine measured its rows differing
and said `exact: false` (honest, not exact), "differs" where tokens differ under `exact: true` (a bug), "refused"
where loading the drafter was refused with a reason (a caller's error: early exit on a model it cannot cut), or the
error.
Writes every row and the counts to --out (default benchmarks/results/architectures.json) and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests"), str(HERE)]

import mlx.core as mx  # noqa: E402
from fuzz_exactness import emulated_gpu, provenance  # noqa: E402
from mlx_lm_architectures import SKIPPED, architecture_dir, mlx_lm_model_types  # noqa: E402
from mlxspec.engine import Engine  # noqa: E402
from mlxspec.errors import MlxspecError  # noqa: E402
from mlxspec.options import GenerateOptions  # noqa: E402

PROMPT = "the cat sat on the mat and the cat sat on the mat and the"
DEVICE = "cpu" if mx.default_device() == mx.cpu else "device"  # where the first check runs (on a GPU machine: there)
LENGTHS = (2, 5)
SECOND = "the cat sat on the mat and the dog ran to the door and the dog"  # PROMPT's first words, then others
SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 40}}, "required": ["story"]}


def tokens(engine: Engine, format=None, prompt: str = PROMPT, **options) -> tuple[list[int], object]:
    events = list(engine.generate(prompt, GenerateOptions(max_tokens=24, temperature=0, **options), format=format))
    return [t for e in events for t in e.tokens], events[-1].stats


def logprobs(engine: Engine) -> list[tuple]:
    """Each emitted token's logprob and its 3 most likely alternatives, as a request with logprobs gets them."""
    events = engine.generate(PROMPT, GenerateOptions(max_tokens=24, temperature=0, logprobs=3, draft_length=3,
                                                     adaptive=False))
    return [(p.token, p.logprob, tuple(p.top)) for e in events for p in e.logprobs]


def features(plain: Engine, drafted: Engine) -> str:
    """Requests beyond plain text, drafting vs plain: logprobs (each token's and the top 3: the same values) and
    structured output (SCHEMA: the same tokens; its 40 characters keep a random model writing, where "json" alone
    lets it close the object at once)."""
    differ = []
    if logprobs(drafted) != logprobs(plain):
        differ.append("logprobs")
    if tokens(drafted, format=SCHEMA, draft_length=3, adaptive=False)[0] != tokens(plain, format=SCHEMA)[0]:
        differ.append("json schema")
    if differ and (plain.steps.off is None) != (drafted.steps.off is None):  # each engine checks its own compiled steps
        return (f"not comparable ({', '.join(differ)} differ): compiled steps {'on' if plain.steps.off is None else 'off'}"
                f" for plain decoding, {'on' if drafted.steps.off is None else 'off'} for drafting")
    return "same" if not differ else f"differ: {', '.join(differ)}"


def verdict(want: list[int], got: list[int], stats) -> str:
    if stats.drafted == 0:
        return "no drafts"
    if got == want:
        return "exact" if stats.exact else "flagged"
    return "flagged" if not stats.exact else "differs"


def speculation(path: Path, quantize: str | None, kernels=None, lengths=LENGTHS, drafter: str = "lookup",
                against_fresh: bool = DEVICE == "cpu") -> dict:
    """Plain vs `drafter`'s drafting at each length: {"k2": verdict, ..., "features": features()}."""
    plain = Engine.load(str(path), quantize=quantize, kernels=kernels)
    want, _ = tokens(plain)
    draft = {"draft": str(path), "draft_quantize": quantize} if drafter == "draft-model" else {}
    drafted = Engine.load(str(path), drafter=drafter, quantize=quantize, kernels=kernels, **draft)
    out = {}
    for k in lengths:
        got, stats = tokens(drafted, draft_length=k, adaptive=False)
        out[f"k{k}"] = verdict(want, got, stats)
    out["features"] = features(plain, drafted)
    out["reuse"] = reuse(path, dict(quantize=quantize, kernels=kernels), plain, drafted, against_fresh)
    if not drafted.speculable:
        out["note"] = drafted.info.get("speculation", "speculation off")
    return out


def reuse(path: Path, load: dict, plain: Engine, drafted: Engine, against_fresh: bool) -> str:
    """Requests that share part of what came before, on engines that hold their cache (PrefixCache): does drafting
    keep plain decoding's tokens there, and (against_fresh: where prompt chunks compute every row alike, as this
    CPU's ops do; a GPU's change their bits with the rows, so a reused prefix does too) are they a fresh engine's?
    Three in a row: the first words of the requests before (a rewind into the prompt); that prompt, its answer and
    more (an extension); that prompt with its last token changed (back to where the prompt ended: a recurrent state's
    checkpoint)."""
    fresh = lambda prompt: tokens(Engine.load(str(path), **load), prompt=prompt)[0]  # noqa: E731
    first = plain.tokenizer.encode(SECOND)
    extended = first + fresh(first) + plain.tokenizer.encode(" and the cat")
    prompts = [first, extended, extended[:-1] + [extended[-2]]]
    got = {name: [tokens(engine, prompt=p, **options) for p in prompts] for name, engine, options in
           (("plain", plain, {}), ("drafting", drafted, dict(draft_length=3, adaptive=False)))}
    ids = {name: [t for t, _ in runs] for name, runs in got.items()}
    differ = ["drafting vs plain"] if ids["drafting"] != ids["plain"] else []
    if against_fresh and ids["plain"] != [fresh(p) for p in prompts]:
        differ.append("plain vs fresh engines")
    if differ:
        return f"differ: {', '.join(differ)}"
    reused = "/".join(str(stats.cached_tokens) for _, stats in got["plain"])
    return f"same (prompt tokens reused: {reused} of {'/'.join(str(len(p)) for p in prompts)})"


@contextlib.contextmanager
def compile_setting(value: str):
    """MLXSPEC_COMPILE=value for the engines loaded inside (Engine.load reads it)."""
    before = os.environ.get("MLXSPEC_COMPILE")
    os.environ["MLXSPEC_COMPILE"] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ["MLXSPEC_COMPILE"]
        else:
            os.environ["MLXSPEC_COMPILE"] = before


def compiled(path: Path, quantize: str | None, kernels=None) -> str:
    """Plain decoding through compiled step graphs vs built each step: the same tokens? and the logits of a few
    passes (1, 3, 1, 2 rows after a 20-token prompt) against the model's own on mlx-lm's caches: the same bits?"""
    runs = {}
    for setting in ("0", "1"):
        with compile_setting(setting):
            engine = Engine.load(str(path), quantize=quantize, kernels=kernels)
        runs[setting] = tokens(engine)[0]
    if engine.steps.off:
        return engine.steps.off
    if runs["1"] != runs["0"]:
        return "differ"
    return f"same tokens, {compiled_logits(engine.target.model, engine.steps)}"


def compiled_logits(model, steps) -> str:
    from mlx_lm.models.cache import make_prompt_cache

    eager, traced = make_prompt_cache(model), make_prompt_cache(model)
    prompt = mx.random.randint(0, 200, (1, 20), key=mx.random.key(0))
    model(prompt, cache=eager), model(prompt, cache=traced)
    worst = 0.0
    for i, rows in enumerate((1, 3, 1, 2)):
        x = mx.random.randint(0, 200, (1, rows), key=mx.random.key(i + 1))
        want, got = model(x, cache=eager).astype(mx.float32), steps(x, traced).astype(mx.float32)
        worst = max(worst, (mx.abs(want - got).max() / mx.maximum(mx.abs(want).max(), 1e-30)).item())
    return "same bits" if worst == 0 else f"logits within {worst:.2g} of their largest"


def gpu_rows(path: Path, quantize: str | None, drafter: str = "lookup") -> dict:
    engine = Engine.load(str(path), quantize=quantize, kernels="exact")
    if not engine.speculable:
        return {"rows": "not checked: speculation is off for this model"} | speculation(path, quantize, "exact", (5,),
                                                                                          drafter, False)
    failures = {} if engine.rows.holds(8) else engine.rows.failures()
    out = {"rows": "equal" if not failures else f"differ from {min(failures)} rows: {failures[min(failures)]}"}
    out |= speculation(path, quantize, kernels="exact", lengths=(5,), drafter=drafter, against_fresh=False)
    return out | ({"compiled": compiled(path, quantize, "exact")} if drafter == "lookup" else {})


def sweep_one(model_type: str, root: Path, gpu: bool, drafter: str = "lookup") -> dict:
    if model_type in SKIPPED:
        return {"skipped": SKIPPED[model_type]}
    try:
        path = architecture_dir(root / model_type, model_type)
    except KeyError as e:
        return {"skipped": f"no config: {e.args[0]}"}
    except Exception as e:  # mlx-lm's model code on a config it does not expect
        return {"skipped": f"does not build from the table's config: {type(e).__name__}: {str(e)[:160]}"}
    row = {}
    for quantize in (None, "q4"):
        label = quantize or "float"
        try:
            row[f"{DEVICE} {label}"] = speculation(path, quantize, drafter=drafter)
            if drafter == "lookup":  # the drafter does not enter it: once per model
                row[f"{DEVICE} {label}"]["compiled"] = compiled(path, quantize)
            if gpu:
                with emulated_gpu():
                    row[f"gpu {label}"] = gpu_rows(path, quantize, drafter)
        except MlxspecError as e:  # the caller's request refused with a reason (a drafter this model cannot take)
            return {"refused": str(e)[:200]}
        except Exception as e:
            row[f"error {label}"] = f"{type(e).__name__}: {str(e)[:200]} ({traceback.format_exc().splitlines()[-3].strip()[:120]})"
            break
    return row


def summary(rows: dict) -> dict:
    counts: dict[str, int] = {}
    for row in rows.values():
        if "skipped" in row or "refused" in row:
            key = "skipped" if "skipped" in row else "refused"
        elif any(k.startswith("error") for k in row):
            key = "error"
        else:
            verdicts = {v for part in row.values() for k, v in part.items() if k.startswith("k")}
            verdicts |= {"differs" for part in row.values() if part.get("compiled") == "differ"
                         or any(part.get(check, "").startswith("differ") for check in ("features", "reuse"))}
            key = "differs" if "differs" in verdicts else "flagged" if "flagged" in verdicts else (
                "no drafts" if "no drafts" in verdicts else "exact")
        counts[key] = counts.get(key, 0) + 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated model types (default: every mlx-lm model file)")
    parser.add_argument("--no-gpu", action="store_true", help="skip the emulated GPU")
    parser.add_argument("--drafter", default="lookup", choices=("lookup", "early-exit", "draft-model"))
    parser.add_argument("--out", help="default benchmarks/results/architectures.json (architectures_DRAFTER.json)")
    args = parser.parse_args()
    suffix = "" if args.drafter == "lookup" else f"_{args.drafter.replace('-', '_')}"
    args.out = args.out or str(HERE / "results" / f"architectures{suffix}.json")
    types = args.only.split(",") if args.only else mlx_lm_model_types()
    rows, start, made = {}, time.time(), provenance()  # the commit that runs, not a later one
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in types:
            rows[model_type] = sweep_one(model_type, Path(tmp), not args.no_gpu, args.drafter)
            print(f"{model_type:24} {json.dumps(rows[model_type])}", flush=True)
    report = {"provenance": made, "drafter": args.drafter, "seconds": round(time.time() - start),
              "counts": summary(rows), "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["counts"]))
    return 1 if report["counts"].get("differs") or report["counts"].get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
