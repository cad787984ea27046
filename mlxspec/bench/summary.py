"""From timed runs to one row per configuration: medians over repeats, then across prompts.

Per (configuration, prompt): the median over repeats of tokens/s and TTFT. Per configuration:
  - tokens/s: geometric mean over prompts of those medians (no prompt dominates by its length);
  - speedup: geometric mean over prompts of tokens/s divided by plain's on the same prompt;
  - counts (drafted, accepted, rejected, target passes): per pass over the prompt set, i.e. summed
    over prompts and averaged over repeats; rates are ratios of those totals;
  - identical: every run's tokens equal plain decoding's on the same prompt.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from .accounting import ModelBytes
from .configs import PLAIN, Config


def geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def first_mismatch(reference: list[int], tokens: list[int]) -> int | None:
    """Index of the first token that differs from the reference (None: identical)."""
    for i, (a, b) in enumerate(zip(reference, tokens)):
        if a != b:
            return i
    return None if len(reference) == len(tokens) else min(len(reference), len(tokens))


def _by(runs: list[dict], *keys: str) -> dict:
    groups = defaultdict(list)
    for r in runs:
        groups[tuple(r[k] for k in keys)].append(r)
    return groups


def per_prompt_medians(runs: list[dict]) -> dict:
    """(config, prompt) -> {'tps': median tokens/s, 'ttft': median TTFT of the cold runs}."""
    return {
        key: {"tps": statistics.median(r["tokens_per_second"] for r in rs),
              "ttft": statistics.median(r["ttft_s"] for r in rs if r.get("cold", True))}
        for key, rs in _by(runs, "config", "prompt").items()
    }


def summarize(configs: list[Config], runs: list[dict], categories: dict[str, str], repeats: int,
              plain_step_bytes: float, bandwidth_gbs: float) -> list[dict]:
    medians = per_prompt_medians(runs)
    prompts = list(categories)
    rows = []
    for c in configs:
        mine = [r for r in runs if r["config"] == c.label]
        if not mine:
            continue
        tps = {p: medians[(c.label, p)]["tps"] for p in prompts if (c.label, p) in medians}
        ratios = {p: tps[p] / medians[(PLAIN, p)]["tps"] for p in tps
                  if medians.get((PLAIN, p), {}).get("tps")}
        row = {
            "config": c.label, "runner": c.runner, "drafter": c.drafter, "k": c.k, "adaptive": c.adaptive,
            "tokens_per_second": round(geomean(list(tps.values())), 3),
            "speedup": round(geomean(list(ratios.values())), 3),
            "speedup_by_category": {cat: round(geomean([v for p, v in ratios.items() if categories[p] == cat]), 3)
                                    for cat in dict.fromkeys(categories[p] for p in ratios)},
            "speedup_by_prompt": {p: round(v, 3) for p, v in ratios.items()},
            "ttft_s": round(statistics.median(medians[(c.label, p)]["ttft"] for p in tps), 3),
            "identical": all(r["identical"] for r in mine),
            "mismatched_prompts": sorted({r["prompt"] for r in mine if not r["identical"]}),
            "exact": _exact(mine),
            "peak_memory_bytes": max(r["peak_memory_bytes"] for r in mine),
        }
        row.update(_counts(mine, repeats))
        eff = row["tokens_per_second"] * plain_step_bytes / 1e9
        row["effective_bandwidth_gbs"] = round(eff, 3)
        row["roofline_fraction"] = round(eff / bandwidth_gbs, 4) if bandwidth_gbs else None
        rows.append(row)
    return rows


def _exact(runs: list[dict]) -> bool | None:
    """Did the engine report every run exact (verify rows = one-row steps)? None: not reported (peers)."""
    flags = [r["stats"].get("exact") for r in runs]
    return None if any(f is None for f in flags) else all(flags)


def _counts(runs: list[dict], repeats: int) -> dict:
    total = defaultdict(float)
    drafted_pos, accepted_pos = defaultdict(int), defaultdict(int)
    for r in runs:
        s = r["stats"]
        total["drafted"] += s["drafted"]
        total["accepted"] += s["accepted"]
        total["target_passes"] += s["rounds"]
        total["generated"] += s["generated_tokens"]
        total["backoffs"] += s.get("backoffs", 0)
        total["tree_rounds"] += s.get("tree_rounds", 0)  # rounds that verified a draft tree
        total["bytes_read"] += r.get("bytes_read", 0)
        for i, n in enumerate(s["drafted_per_position"]):
            drafted_pos[i] += n
        for i, n in enumerate(s["accepted_per_position"]):
            accepted_pos[i] += n
    bytes_read = total.pop("bytes_read")
    per_pass = {k: round(v / repeats, 2) for k, v in total.items()}
    per_pass["rejected"] = round(per_pass["drafted"] - per_pass["accepted"], 2)
    return {
        **per_pass,
        "acceptance_rate": round(total["accepted"] / total["drafted"], 4) if total["drafted"] else None,
        "mean_accepted_length": round(total["generated"] / total["target_passes"], 3) if total["target_passes"] else None,
        "bytes_per_token": round(bytes_read / total["generated"]) if total["generated"] else None,
        "acceptance_per_position": [round(accepted_pos[i] / drafted_pos[i], 4) for i in sorted(drafted_pos)
                                    if drafted_pos[i]],
    }


def k_sweep(rows: list[dict]) -> dict[str, list[dict]]:
    """Per drafter (and mlx-lm speculative): speedup of each fixed draft length, in k order."""
    sweep = defaultdict(list)
    for r in rows:
        if r["k"] > 0 and not r["adaptive"]:
            name = "mlx-lm speculative" if r["runner"] == "mlx-lm-speculative" else r["drafter"]
            sweep[name].append({"k": r["k"], "speedup": r["speedup"], "tokens_per_second": r["tokens_per_second"]})
    return {name: sorted(points, key=lambda p: p["k"]) for name, points in sweep.items()}


def plain_step_bytes(target: ModelBytes, runs: list[dict]) -> float:
    """Bytes of one plain step, averaged over plain runs at their mean context length."""
    plain = [r for r in runs if r["config"] == PLAIN] or runs
    return statistics.fmean(target.step_bytes(r["prompt_tokens"] + r["generated"] / 2) for r in plain)
