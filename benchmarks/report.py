"""Writing a benchmark's report: date and machine added, a summary printed, JSON written."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path


def write_report(report: dict, out: str, hide: tuple[str, ...] = ()) -> None:
    """Print `report` without the bulky `hide` keys, and write all of it to `out`."""
    report.update(date=time.strftime("%Y-%m-%d"),
                  machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}")
    print(json.dumps({k: v for k, v in report.items() if k not in hide}, indent=1))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")
