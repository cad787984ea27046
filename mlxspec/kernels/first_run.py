"""A GPU's kernels run first in a child process, once per device, MLX version and kernel sources.

A kernel that faults or hangs on a GPU can take its process down with it: MLX aborts on a Metal command
buffer error (a GPU timeout, an invalid read), and a CUDA fault leaves the process's context unusable. The
self-checks (registry.py) catch wrong results, not that. mlxspec's Metal kernels have passed every check that
runs without a Mac (the emulator, clang's syntax check), not Apple's compiler and GPU, so on a user's machine
they first run in a child process: it installs every family into two small random 4-bit models (head dims 64 and
128, float16 and bfloat16; each self-check and timing announced as it begins and ends) and runs decoding passes
of 1 and 5 rows. A family whose check was running
when the child died or timed out, or whose check met a device fault, is off on this device (its record's
error says why: `mlxspec doctor`); a death outside any check turns every GPU family off. The verdict is kept
under the kernel cache folder (first_run.json) by device, MLX version and a hash of mlxspec's kernel sources,
and in memory once per process. A child that cannot start (no verdict) is logged, not kept.

    settle("metal")    # registry.kernel calls it for a GPU backend: the verdict, applied to the registry
    python -m mlxspec.kernels.first_run [--device cpu]    # the child (cpu: the workload on this machine)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import mlx.core as mx

from . import registry
from .build import read_cached_json, write_cached_json

log = logging.getLogger("mlxspec.kernels")

TIMEOUT = 600.0  # seconds: a cold CUDA machine compiles each program once (NVRTC), stored for the parent too
FAULTS = ("cuda error", "illegal", "command buffer", "[metal]")  # a check's exception that is the device's, not a result
_settled: dict[str, dict] = {}  # cache key -> verdict, once per process
_keys: dict[str, str] = {}  # backend -> its cache key (hashing the sources once per process)
_child: list[bool] = []  # [True] in the child itself: its kernels run without a verdict


def settle(backend: str, run: Callable[[str, float], dict] | None = None) -> dict | None:
    """The verdict on this backend's kernels (cached, or a child's run now), applied to the registry; None where
    nothing runs first: the CPU (its kernels are built from source and tested here), a process whose default
    device is not a GPU (tests' stand-in GPUs), the child itself."""
    if backend == "cpu" or _child or not _on_gpu(backend):
        return None
    key = _keys.get(backend) or _keys.setdefault(backend, cache_key(backend))
    if key not in _settled:
        verdict = _read_cache().get(key)
        if verdict is None:
            log.warning("mlxspec: the %s kernels' first run on this device, in a child process (once per device "
                        "and version; up to %d s)", backend, TIMEOUT)
            verdict = (run or run_child)(backend, TIMEOUT)
            if verdict.pop("keep", True):
                _write_cache(key, verdict)
        _settled[key] = verdict
        for family, why in verdict["excluded"].items():
            registry.exclude(family, backend, why)
            registry.warn_once(f"mlxspec {backend}-{family} kernels off on this device: {why}")
    return _settled[key]


def status() -> list[dict]:
    """Each verdict this process applied, as registry.status() lists kernel families (`mlxspec doctor`)."""
    return [{"kernel": f"{key.split('|')[0]}-first-run", "active": not v["excluded"], "detail": key,
             "reason": v["detail"] + (f" (in {v['seconds']} s)" if "seconds" in v else ""), "excluded": v["excluded"]}
            for key, v in _settled.items()]


def _on_gpu(backend: str) -> bool:
    """Is `backend` this process's GPU (not a stand-in the tests name on another machine)?"""
    if mx.default_device().type != mx.gpu:
        return False
    return mx.metal.is_available() == (backend == "metal")


def cache_key(backend: str) -> str:
    """Device, MLX version and the kernel sources: a new kernel, MLX or GPU runs first again."""
    info = mx.device_info() if hasattr(mx, "device_info") else {}
    sources = hashlib.sha256()
    for path in sorted(Path(__file__).parent.rglob("*")):
        if path.suffix in (".py", ".h", ".cpp", ".metal", ".cu") and path.is_file():
            sources.update(path.read_bytes())
    name = info.get("device_name") or info.get("architecture") or "gpu"
    return f"{backend}|{name}|mlx {mx.__version__}|{sources.hexdigest()[:16]}"


def run_child(backend: str, timeout: float, command: list[str] | None = None) -> dict:
    """Run the child (default: this module's main) and read its verdict from what it printed before it ended."""
    command = command or [sys.executable, "-m", "mlxspec.kernels.first_run"]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        out, err, code, timed_out = done.stdout, done.stderr, done.returncode, False
    except subprocess.TimeoutExpired as e:  # killed: what it printed until then says where it stood
        out, err, code, timed_out = _text(e.stdout), _text(e.stderr), None, True
    verdict = interpret(out.splitlines(), code, timed_out, err, timeout)
    verdict["seconds"] = round(time.perf_counter() - start, 1)
    return verdict


def interpret(lines: list[str], code: int | None, timed_out: bool, stderr: str = "", timeout: float = TIMEOUT) -> dict:
    """{excluded: family -> why, detail, keep}: the families the child's run turned off, from its event lines
    ({"begin": [family, signature]}, {"end": [family, signature, failure]}, {"done": true}) and how it ended."""
    excluded, running, began, finished = {}, [], False, False  # running: the begun, unended events, innermost last
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a library's own print
        if not isinstance(event, dict):
            continue
        if "begin" in event:
            running.append(event["begin"])
            began = True
        elif "end" in event and running:
            family, signature, failure = event["end"]
            running.pop()
            if failure and any(f in failure.lower() for f in FAULTS):
                excluded[_family(family)] = f"a device fault in its first run here ({signature}: {failure[:200]})"
        finished = finished or event.get("done") is True
    if finished and code == 0:
        return {"excluded": excluded, "detail": "the first run passed" if not excluded else "device faults", "keep": True}
    how = (f"timed out after {timeout:.0f} s" if timed_out else
           f"died ({_signal_name(-code)})" if code is not None and code < 0 else f"exited with {code}")
    if not began and not timed_out and (code or 0) > 0:  # it could not start its work: nothing learned about kernels
        tail = stderr.strip().splitlines()[-1:] or [""]
        log.warning("mlxspec: the kernels' first-run child %s before any kernel ran: %s", how, tail[0][:300])
        return {"excluded": {}, "detail": f"the child {how} before any kernel ran", "keep": False}
    if running and running[-1][0] != "forward":
        family, signature = running[-1][:2]
        excluded[family] = f"its first run here {how} (during its self-check on {signature})"
    else:  # in a pass, a layer swap, between checks: every family ran there
        excluded[registry.EVERY] = f"the kernels' first run here {how} outside any self-check"
    return {"excluded": excluded, "detail": how, "keep": True}


def _family(name: str) -> str:
    return registry.EVERY if name == "forward" else name  # a pass runs every family: which one is unknown


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _read_cache() -> dict:
    return read_cached_json("first_run.json")


def _write_cache(key: str, verdict: dict) -> None:
    if not write_cached_json("first_run.json", _read_cache() | {key: verdict}):  # read-only: for this process only
        log.info("mlxspec: first-run verdict not kept (the kernel cache folder is read-only)")


# ---------------------------------------------------------------- the child


def _emit(**event) -> None:
    print(json.dumps(event, default=str), flush=True)  # flushed: a death right after still leaves it read


MODELS = [(256, mx.float16), (512, mx.bfloat16)]  # (hidden size, dtype): head dims 64 and 128, the common ones


def _tiny_model(hidden: int, dtype):
    """A random 2-layer llama, 4-bit g64 (an unquantized head: the dense kernel), 4 query heads over 2 kv heads:
    every GPU family's layer kinds at small shapes."""
    import mlx.nn as nn
    from mlx_lm.models import llama

    args = llama.ModelArgs(model_type="llama", hidden_size=hidden, num_hidden_layers=2, intermediate_size=2 * hidden,
                           num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=512,
                           tie_word_embeddings=False)
    mx.random.seed(0)
    model = llama.Model(args)
    model.set_dtype(dtype)
    nn.quantize(model, group_size=64, bits=4, class_predicate=lambda path, m: isinstance(m, nn.Linear) and "lm_head" not in path)
    mx.eval(model.parameters())
    return model


def _passes(model) -> None:
    """Decoding passes with the kernels in: a prompt, one-row steps, a 5-row verify pass."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(mx.arange(40)[None] % 512, cache=cache))
    for rows in (1, 1, 5):
        mx.eval(model(mx.arange(rows)[None], cache=cache))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="mlxspec's GPU kernels' first run (a child of settle)")
    ap.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    args = ap.parse_args(argv)
    _child.append(True)
    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    registry.watch(lambda phase, family, signature, failure=None: _emit(**{phase: [family, str(signature)] + (
        [failure] if phase == "end" else [])}))
    from .accept import fused_accept_available
    from .install import install_kernels

    steps = [("accept", fused_accept_available)]
    for hidden, dtype in MODELS:
        model = _tiny_model(hidden, dtype)
        steps[-1:-1] = [(f"install {hidden} {dtype}", lambda m=model: install_kernels(m)),
                        (f"passes {hidden} {dtype}", lambda m=model: _passes(m))]
    for label, step in steps:
        _emit(begin=["forward", label])
        try:
            step()
            failure = None
        except Exception as e:  # reported, as a self-check's: the parent decides what a fault is
            failure = registry.one_line(e)
        _emit(end=["forward", label, failure])
    _emit(done=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
