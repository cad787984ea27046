"""What machine this is: chip / CPU, cores, memory, OS, and MLX's version and backend.

Everything here is cheap except `mlx_facts` (imports MLX). Each fact degrades to None rather than
raising: a report with a missing line beats no report.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def cpu_name() -> str:
    """'Apple M2 Pro', 'AMD EPYC', ... (falls back to the architecture)."""
    if sys.platform == "darwin":
        name = _run(["sysctl", "-n", "machdep.cpu.brand_string"])
        if name:
            return name
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """SIMD extensions that matter for MLX's CPU kernels (Linux x86; empty elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "amx_tile") if f in flags]
    except OSError:
        pass
    return []


def total_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        out = _run(["sysctl", "-n", "hw.memsize"])
        return int(out) if out and out.isdigit() else None


def available_memory_bytes() -> int | None:
    """What the daemon checks a model's footprint against (mlxspec.footprint.available_memory)."""
    from ..footprint import available_memory

    return available_memory()


def machine_facts() -> dict:
    return {
        "cpu": cpu_name(),
        "cpu_flags": cpu_flags(),
        "cores": os.cpu_count(),
        "memory_bytes": total_memory_bytes(),
        "os": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "python": platform.python_version(),
    }


def backend() -> str:
    """'metal', 'cuda' or 'cpu': where MLX runs its default device."""
    import mlx.core as mx

    if mx.default_device() == mx.gpu:
        if mx.metal.is_available():
            return "metal"
        cuda = getattr(mx, "cuda", None)
        if cuda is not None and cuda.is_available():
            return "cuda"
        return "gpu"
    return "cpu"


def mlx_facts() -> dict:
    import mlx.core as mx

    facts = {
        "mlx": mx.__version__,
        "mlx_lm": package_version("mlx-lm"),
        "mlxspec": package_version("mlxspec"),
        "backend": backend(),
        "device": str(mx.default_device()),
        "metal_available": bool(mx.metal.is_available()),
    }
    if facts["metal_available"]:
        try:
            info = mx.metal.device_info()
            facts["gpu"] = info.get("device_name") or info.get("architecture")
            facts["gpu_memory_bytes"] = info.get("memory_size")
        except Exception:  # older MLX: no device_info
            pass
    return facts


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
