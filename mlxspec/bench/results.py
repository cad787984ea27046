"""Writing a result: JSON for machines, a PNG chart beside it, optionally a Markdown report."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MlxspecError
from .table import render


def write_result(result: dict, json_path: str | Path, chart: bool = True, markdown: bool = False) -> list[Path]:
    """Write JSON (and PNG / Markdown with the same stem); returns the files written."""
    path = Path(json_path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
    except OSError as e:
        raise MlxspecError(f"cannot write {path}: {e.strerror or e}") from None
    written = [path]
    if chart and chart_available():  # without matplotlib the JSON still stands
        from .chart import write_chart

        written.append(write_chart(result, path.with_suffix(".png")))
    if markdown:
        md = path.with_suffix(".md")
        md.write_text(markdown_report(result))
        written.append(md)
    return written


def chart_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def markdown_report(result: dict) -> str:
    cmd = result.get("command") or "mlxspec bench"
    notes = "\n".join(f"- {n}" for n in result.get("notes", []))
    return (f"# mlxspec bench: {Path(result['target']['reference']).name}\n\n"
            f"Command: `{cmd}`\n\n{render(result, markdown=True)}\n\n"
            + (f"## Notes\n{notes}\n\n" if notes else "")
            + "Definitions: see `definitions` in the JSON beside this file.\n")
