"""The result as text: a terminal table (aligned columns) or Markdown (for benchmarks/results/)."""

from __future__ import annotations

MB = 1e6


def _count(x: float) -> str:
    """Counts averaged over repeats: whole numbers as such, others to one decimal."""
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def _fmt(value, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


def grid(headers: list[str], rows: list[list[str]], markdown: bool = False) -> str:
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    def line(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


CONFIG_HEADERS = ["config", "tok/s", "speedup", "TTFT s", "accept", "tok/pass", "drafted/acc/rej",
                  "passes", "same as plain", "exact", "peak MB", "MB/token", "eff. GB/s", "x roofline"]


def config_rows(result: dict) -> list[list[str]]:
    out = []
    for r in result["configs"]:
        counts = "/".join(_count(r[k]) for k in ("drafted", "accepted", "rejected")) if r["drafted"] else "-"
        same = "yes" if r["identical"] else "NO: " + ",".join(r["mismatched_prompts"])
        out.append([
            r["config"], _fmt(r["tokens_per_second"], ".2f"), _fmt(r["speedup"], ".2f") + "x",
            _fmt(r["ttft_s"], ".2f"),
            _fmt(r["acceptance_rate"] * 100, ".0f") + "%" if r["acceptance_rate"] is not None else "-",
            _fmt(r["mean_accepted_length"], ".2f"), counts, _count(r["target_passes"]), same,
            {True: "yes", False: "no"}.get(r.get("exact"), "-"),
            _fmt(r["peak_memory_bytes"] / MB, ".0f"),
            _fmt(r["bytes_per_token"] / MB if r["bytes_per_token"] else None, ".1f"),
            _fmt(r["effective_bandwidth_gbs"], ".2f"), _fmt(r["roofline_fraction"], ".3f"),
        ])
    return out


def category_table(result: dict, markdown: bool = False) -> str:
    cats = list(dict.fromkeys(c for r in result["configs"] for c in r["speedup_by_category"]))
    rows = [[r["config"]] + [_fmt(r["speedup_by_category"].get(c), ".2f") for c in cats] for r in result["configs"]]
    return grid(["speedup by category"] + cats, rows, markdown)


def position_table(result: dict, markdown: bool = False) -> str | None:
    rows = [[r["config"]] + [f"{100 * a:.0f}%" for a in r["acceptance_per_position"]]
            for r in result["configs"] if r["acceptance_per_position"]]
    if not rows:
        return None
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    return grid(["acceptance per draft position"] + [str(i + 1) for i in range(width - 1)], rows, markdown)


def header_lines(result: dict) -> list[str]:
    m, v, bw, roof = result["machine"], result["versions"], result["bandwidth"], result["roofline"]
    t = result["target"]
    draft = f", draft {result['draft']['reference']}" if result.get("draft") else ""
    blas = result.get("blas") or {}
    return [
        f"target {t['reference']} ({t['info'].get('parameter_size')}, {t['info'].get('quantization')}){draft}",
        f"prompts: {result['prompts']['name']} ({len(result['prompts']['ids'])}), max {result['spec']['max_tokens']} "
        f"tokens, repeats: {result['spec']['repeats']}, greedy; {result['date']}",
        f"machine: {m['cpu']}, {m['cores']} cores, {m['os']}; MLX {v['mlx']} ({v['backend']}), mlx-lm {v['mlx_lm']}, "
        f"mlxspec {v['mlxspec']}" + (f"; BLAS {blas.get('kind')}" if blas else ""),
        f"memory bandwidth {bw['roofline_gbs']:.1f} GB/s on the {bw.get('device', 'cpu')} (host copy "
        f"{bw['copy_gbs']:.1f}, read {bw['read_gbs']:.1f}, MLX on the device {bw.get('mlx_copy_gbs') or 0:.1f}); "
        f"one plain step reads {roof['plain_step_bytes'] / MB:.1f} MB -> roofline {roof['tokens_per_second']:.1f} tok/s",
    ]


def render(result: dict, markdown: bool = False) -> str:
    sep = "\n\n"
    parts = [("\n".join(f"- {h}" for h in header_lines(result)) if markdown else "\n".join(header_lines(result))),
             grid(CONFIG_HEADERS, config_rows(result), markdown), category_table(result, markdown)]
    positions = position_table(result, markdown)
    if positions:
        parts.append(positions)
    return sep.join(parts)
