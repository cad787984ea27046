"""The PNG next to the JSON: tokens/s and speedup per configuration, acceptance per draft
position, and (when draft lengths were swept) speedup against k."""

from __future__ import annotations

from pathlib import Path


def write_chart(result: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display: write a file
    import matplotlib.pyplot as plt

    sweep = {name: pts for name, pts in result["k_sweep"].items() if len(pts) > 1}
    panels = 3 if sweep else 2
    fig, axes = plt.subplots(1, panels, figsize=(6.2 * panels, 5.2), constrained_layout=True)
    _throughput(axes[0], result)
    _positions(axes[1], result)
    if sweep:
        _sweep(axes[2], sweep)
    fig.suptitle(_title(result), fontsize=10)
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _title(result: dict) -> str:
    t, m, v = result["target"], result["machine"], result["versions"]
    draft = f" + draft {Path(result['draft']['reference']).name}" if result.get("draft") else ""
    return (f"{Path(t['reference']).name}{draft} | {m['cpu']}, {m['cores']} cores, MLX {v['mlx']} ({v['backend']}) | "
            f"roofline {result['roofline']['tokens_per_second']:.0f} tok/s at {result['bandwidth']['roofline_gbs']:.0f} GB/s"
            f" | {result['date'][:10]}")


def _throughput(ax, result: dict) -> None:
    rows = result["configs"]
    labels = [r["config"] for r in rows][::-1]
    values = [r["tokens_per_second"] for r in rows][::-1]
    colors = ["#888888" if r["config"] == "plain" else "#c44e52" if not r["identical"]
              else "#4c72b0" if r["runner"] == "mlxspec" else "#dd8452" for r in rows][::-1]
    bars = ax.barh(labels, values, color=colors)
    for bar, r in zip(bars, rows[::-1]):
        mark = "" if r["identical"] else " (output differs)"
        roof = f", {100 * r['roofline_fraction']:.1f}% of roofline" if r.get("roofline_fraction") is not None else ""
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {r['speedup']:.2f}x{roof}{mark}",
                va="center", fontsize=8)
    ax.set_xlabel("decode tokens/s (label: speedup over plain, effective bandwidth / roofline)")
    ax.set_title("throughput per configuration (blue mlxspec, orange mlx-lm)", fontsize=9)
    ax.set_xlim(0, max(values + [1e-9]) * 1.6)
    ax.tick_params(axis="y", labelsize=8)


def _family(row: dict) -> str:
    return "mlx-lm speculative" if row["runner"] == "mlx-lm-speculative" else row["drafter"]


def _positions(ax, result: dict) -> None:
    """Per drafter: its longest fixed k (solid) and adaptive (dashed), so the panel stays legible."""
    rows = [r for r in result["configs"] if r["acceptance_per_position"]]
    longest = {}
    for r in rows:
        if not r["adaptive"] and r["k"] >= longest.get(_family(r), {"k": 0})["k"]:
            longest[_family(r)] = r
    shown = list(longest.values()) + [r for r in rows if r["adaptive"]]
    colors = {name: f"C{i}" for i, name in enumerate(dict.fromkeys(_family(r) for r in rows))}
    for r in shown:
        acc = r["acceptance_per_position"]
        ax.plot(range(1, len(acc) + 1), [100 * a for a in acc], marker="o", label=r["config"],
                color=colors[_family(r)], linestyle="--" if r["adaptive"] else "-")
    ax.set_xlabel("draft position")
    ax.set_ylabel("rounds that kept this draft (% of rounds that drafted it)")
    ax.set_ylim(0, 105)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title("acceptance per draft position", fontsize=9)
    if shown:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no speculative configuration", ha="center", transform=ax.transAxes)


def _sweep(ax, sweep: dict) -> None:
    for name, pts in sweep.items():
        ax.plot([p["k"] for p in pts], [p["speedup"] for p in pts], marker="o", label=name)
    ax.axhline(1.0, color="#888888", linestyle="--", linewidth=1)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("draft length k")
    ax.set_ylabel("speedup over plain")
    ax.set_title("speedup against draft length", fontsize=9)
    ax.legend(fontsize=7)
