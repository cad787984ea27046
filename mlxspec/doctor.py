"""`mlxspec doctor`: what this machine gives MLX, and what to fix.

    report = doctor()          # a dict (JSON-able)
    print(render(report))      # the text the CLI prints

Backend, versions, memory, custom kernels, and the BLAS MLX's CPU backend calls, with fp32 GEMM
GFLOP/s in this process and with the alternative (the optimized BLAS preloaded, or not) measured
in a child process, so the gain of preloading is shown, not asserted.
"""

from __future__ import annotations

import dataclasses
import importlib
import os

from .bench import blas as blas_mod
from .bench import blas_preload
from .bench.hardware import available_memory_bytes, machine_facts, mlx_facts
from .settings import DecodeSettings
from .versions import version_problems

GB = 1e9


def kernel_status(load: bool = False) -> dict:
    """What mlxspec.kernels says about itself, through whichever status function it offers.

    Kernels load with a model, so a fresh process has none; `load` builds (first use) and
    self-checks the device's kernels on typical shapes (SmolLM2's FFN: 1536 x 576, 4-bit g32, also
    timed against MLX's op at 1 and 8 rows, cached per device; on the CPU also its attention and
    RMSNorm/RoPE/SwiGLU).
    """
    if load:
        _load_kernels()
    for module_name in ("mlxspec.kernels", "mlxspec.kernels.registry"):
        try:
            module = importlib.import_module(module_name)
        except Exception as e:  # a half-built kernels package must not break the doctor
            return {"available": False, "detail": f"not available ({_first_line(e)})"}
        for name in ("status", "report", "kernel_status", "active_kernels"):
            fn = getattr(module, name, None)
            if callable(fn):
                try:
                    value = _jsonable(fn())
                except Exception as e:
                    return {"available": False, "detail": f"{module_name}.{name}() failed: {_first_line(e)}"}
                return {"available": True, "source": f"{module_name}.{name}()", "status": value, "loaded": load}
    return {"available": False, "detail": "not available (mlxspec.kernels offers no status function)"}


def _load_kernels() -> None:
    try:
        import mlx.core as mx

        timing = importlib.import_module("mlxspec.kernels.timing")
        timing.time_qmm(1536, 576, 32, 4, mx.float16)  # self-check, then time against MLX's op (cached)
        if mx.default_device().type == mx.cpu:  # attention and pointwise kernels are CPU-only
            importlib.import_module("mlxspec.kernels.attention").check_signature(9, 3, 64, 64)
            importlib.import_module("mlxspec.kernels.pointwise").check_typical()
            importlib.import_module("mlxspec.kernels.fused_layer").check_typical()
            registry = importlib.import_module("mlxspec.kernels.registry")  # int8 activations: which path, checked
            registry.kernel_for_layer(1536, 576, 32, 4, mx.float16, mx.cpu, activations="q8")
    except Exception:  # status() then reports what failed, or the kernels are simply absent
        pass


def gemm_comparison(report: dict) -> dict:
    """GFLOP/s here, and with the other BLAS choice (measured in a child process)."""
    here = {"library": report["library"], "kind": report["kind"], "gflops": blas_mod.gemm_gflops()}
    env = dict(os.environ)
    if os.environ.get("LD_PRELOAD") and report["kind"] != "reference":
        env.pop("LD_PRELOAD")
        env.pop(blas_preload.PRELOADED_ENV, None)
        label = "without the preload"
    elif report["kind"] == "reference" and report.get("optimized_installed"):
        env = blas_preload.preload_env(report["optimized_installed"], env)
        label = "with the optimized BLAS preloaded"
    else:
        return {"this_process": here}
    env[blas_preload.MODE_ENV] = "off"
    other = blas_mod.measure_in_subprocess(env)
    return {"this_process": here, "alternative": {**(other or {"gflops": None}), "label": label}}


def doctor(measure: bool = True, kernels: bool = True, settings: DecodeSettings | None = None) -> dict:
    """`settings`: the engine settings to report (default: read from the environment, as an Engine would)."""
    settings = settings or DecodeSettings.from_env()
    versions = mlx_facts()
    machine = machine_facts()
    blas = blas_mod.blas_report()
    report = {
        "backend": versions["backend"],
        "device": versions["device"],
        "versions": {k: versions[k] for k in ("mlx", "mlx_lm", "mlxspec")} | {"python": machine["python"]},
        "machine": machine,
        "memory": {"total_bytes": machine["memory_bytes"], "available_bytes": available_memory_bytes(),
                   "gpu_bytes": versions.get("gpu_memory_bytes")},
        "kernels": kernel_status(load=kernels),
        "compiled_steps": settings.compile_steps(),
        "blas": blas,
        "blas_preload": dataclasses.asdict(blas_preload.plan()),
    }
    if measure and versions["backend"] == "cpu":
        report["gemm"] = gemm_comparison(blas)
    report["problems"] = problems(report)
    return report


def problems(report: dict) -> list[str]:
    out = []
    if report["backend"] == "cpu" and report["machine"]["os"].startswith("Darwin"):
        out.append("MLX runs on the CPU on a Mac: install mlx with Metal (pip install mlx) on Apple Silicon")
    if report["blas"].get("advice"):
        out.append(report["blas"]["advice"])
    out += version_problems()  # MLX / mlx-lm / transformers outside pyproject.toml's tested ranges
    families = report["kernels"].get("status")
    for entry in families if isinstance(families, list) else []:
        if str(entry.get("kernel", "")).endswith("-first-run") and not entry.get("active"):
            out.append(f"mlxspec's GPU kernels failed their first run on this device ({entry.get('reason')}): those "
                       "families run MLX's ops; please report it with `mlxspec doctor --json`")
    return out


def _gb(n) -> str:
    return f"{n / GB:.1f} GB" if n else "unknown"


def render(report: dict) -> str:
    v, m, mem, b = report["versions"], report["machine"], report["memory"], report["blas"]
    lines = [
        f"backend:   {report['backend']} ({report['device']})",
        f"versions:  MLX {v['mlx']}, mlx-lm {v['mlx_lm']}, mlxspec {v['mlxspec']}, Python {v['python']}",
        f"machine:   {m['cpu']}, {m['cores']} cores, {m['os']} {m['arch']}"
        + (f", {' '.join(m['cpu_flags'])}" if m["cpu_flags"] else ""),
        f"memory:    {_gb(mem['total_bytes'])} total, {_gb(mem['available_bytes'])} available"
        + (f", GPU working set {_gb(mem['gpu_bytes'])}" if mem.get("gpu_bytes") else ""),
        f"kernels:   {_render_kernels(report['kernels'])}",
        "steps:     " + ("decoding passes replay compiled step graphs (MLXSPEC_COMPILE=0: built each step)"
                         if report["compiled_steps"] else
                         "decoding passes are built each step (MLXSPEC_COMPILE=1: compiled step graphs)"),
        f"BLAS:      {b['kind']} ({b['library']})" + (" - the slow reference BLAS" if b["reference"] else ""),
    ]
    if b.get("preloaded_by_mlxspec"):
        lines.append(f"           preloaded by mlxspec at start-up ({blas_preload.MODE_ENV}=off to disable)")
    elif report["blas_preload"]["action"] == "preload":
        lines.append(f"           the mlxspec command preloads {report['blas_preload']['library']} at start-up")
    gemm = report.get("gemm")
    if gemm:
        here = gemm["this_process"]
        lines.append(f"fp32 GEMM: {here['gflops']:.1f} GFLOP/s here ({here['kind']})")
        alt = gemm.get("alternative")
        if alt:
            value = f"{alt['gflops']:.1f} GFLOP/s" if alt.get("gflops") else "could not be measured"
            lines.append(f"           {value} {alt['label']} ({alt.get('kind', '?')})")
    lines += [f"problem:   {p}" for p in report["problems"]] or ["problems:  none found"]
    return "\n".join(lines)


def _render_kernels(k: dict) -> str:
    if not k["available"]:
        return k["detail"]
    status = k["status"]
    if not status:
        return "none active" + ("" if k.get("loaded") else " in this process (they load with a model)")
    if isinstance(status, list):
        return "; ".join(_kernel_line(s) for s in status)
    if isinstance(status, dict):
        return "; ".join(f"{name}: {value}" for name, value in status.items())
    return str(status)


def _kernel_line(entry) -> str:
    if not isinstance(entry, dict):
        return str(entry)
    state = "active" if entry.get("active") else "inactive"
    detail = f" ({entry['detail']})" if entry.get("detail") else ""
    reason = f": {entry['reason']}" if entry.get("reason") else ""
    if not reason and ("passed" in entry or "failed" in entry):  # attention / pointwise: per-signature checks
        passed, failed = len(entry.get("passed") or []), len(entry.get("failed") or {})
        reason = f": self-check passed on {passed} signature(s)" + (f", failed on {failed}" if failed else "")
    if entry.get("error"):
        reason = f": {str(entry['error']).splitlines()[0]}"
    timings = "".join(f"; {sig}: {t['kernel_us']:.0f} us vs MLX {t['mlx_us']:.0f} us"
                      for sig, t in (entry.get("timings") or {}).items())
    if "groups_experts" in entry:  # the MoE gather: verify rows grouped by expert, or one expert read per row
        timings += "; verify rows grouped by expert" if entry["groups_experts"] else "; grouping off (self-check)"
    if "trees" in entry:  # the GPU attention: draft trees' passes, unless its tree rows failed their self-check
        timings += "; takes draft trees" if entry["trees"] else "; draft trees off (self-check)"
    spent = entry.get("seconds") or {}  # where this family's first use went (a build, compiles, timings)
    if sum(spent.values()) >= 0.1:
        timings += "; first use " + ", ".join(f"{what} {t:.1f} s" for what, t in spent.items())
    return f"{entry.get('kernel', '?')} {state}{detail}{reason}{timings}"


def _jsonable(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__

