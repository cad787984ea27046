"""Compile every CUDA program mlxspec generates with NVRTC, the compiler MLX's cuda_kernel JIT runs,
for real NVIDIA architectures, on a machine without a GPU. It reports compile errors, registers,
spills, occupancy and the SASS instruction mix of each kernel's hot loop.

    python benchmarks/cuda_static.py                      # sm_90 (H100), stand-in MLX headers
    python benchmarks/cuda_static.py --mlx-headers        # MLX's own JIT headers (from the mlx-cuda wheel)
    python benchmarks/cuda_static.py --arch sm_80 --arch sm_90 --sass --json benchmarks/results/cuda_static.json

This is static evidence, not timing. A source that fails here would fail in `mx.fast.cuda_kernel` on
the device. Spills and a high register count cost occupancy. The loop's instruction mix per weight
bounds the issue rate. Only a device measures speed (benchmarks/bench_gpu.py).

Needs nvidia-cuda-nvrtc, nvidia-cuda-runtime and nvidia-cuda-cccl (the [dev] extra on Linux x86_64).
--sass also needs nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (pip). --mlx-headers takes
utils.cuh and its includes from the libmlx.so of the mlx-cuda-13 wheel matching the installed MLX,
fetched once with `pip download` (~90 MB) into ~/.cache/mlxspec/cuda-static. Without it, a
stand-in utils.cuh declares what MLX's does for these programs (Shape, Strides, the fp16/bf16 types).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import re
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parents[1]))
from mlxspec.kernels import (accept_source, cuda_cache, gpu_attention_mma_source, gpu_attention_source,  # noqa: E402
                             gpu_mma_source, gpu_source)
from mlxspec.kernels.build import KernelUnavailable  # noqa: E402
from mlxspec.kernels.cuda_fatbin import Fatbin  # noqa: E402
from mlxspec.kernels.reference import output_dtype  # noqa: E402

CACHE = Path.home() / ".cache" / "mlxspec" / "cuda-static"
PREFIX = "mlx/backend/cuda/device/"
STAND_IN_UTILS = """#pragma once
// Stand-in for MLX's JIT utils.cuh: the includes and types the generated programs rely on.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cuda/std/limits>
#include <cuda/std/tuple>
#define MAX_NDIM 10
#define WARP_SIZE 32
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, MAX_NDIM>;
using Strides = cuda::std::array<int64_t, MAX_NDIM>;
}  // namespace mlx::core::cu
"""
REGISTERS_PER_SM, MAX_WARPS_PER_SM = 65536, 64  # sm_80 / sm_90


# ---------------------------------------------------------------- the toolchain (pip's NVIDIA packages)


def nvidia_root() -> Path | None:
    """nvidia/cu13 of the nvidia-* pip packages (with NVRTC), or None."""
    return next((r for r in cuda_cache.nvidia_roots() if (r / "lib" / "libnvrtc.so.13").exists()), None)


def include_paths(root: Path) -> list[str]:
    paths = [root / "include", root / "include" / "cccl"]
    return [str(p) for p in paths if p.exists()]


@dataclass
class Compiled:
    label: str
    arch: str
    error: str | None = None
    kernels: dict = field(default_factory=dict)  # short name -> {"registers", "spill_bytes", "stack", "warps_per_sm"}
    sass: dict = field(default_factory=dict)  # short name -> instruction mix of the hot loop
    cubin: bytes | None = field(default=None, repr=False)


class Nvrtc:
    """The runtime compiler (kernels/cuda_cache.py's, through ctypes): source -> cubin plus ptxas' resource report."""

    def __init__(self, root: Path, headers: dict[str, bytes], cccl: Path | None = None):
        includes = ([str(cccl)] if cccl else []) + include_paths(root)  # MLX's order: its cccl, then CUDA's
        self.core = cuda_cache.Nvrtc(ctypes.CDLL(str(root / "lib" / "libnvrtc.so.13")), includes)
        self.headers = headers

    def compile(self, label: str, source: str, arch: str = "sm_90") -> Compiled:
        try:
            cubin, text = self.core.compile(source, arch, label, options=("--ptxas-options=-v",), headers=self.headers)
        except KernelUnavailable as e:
            return Compiled(label, arch, error=str(e))
        return Compiled(label, arch, kernels=parse_ptxas(text), cubin=cubin)


def short_name(mangled: str) -> str:
    """'custom_kernel_mlxspec_qmm_rows_..._16' out of mlx::core::cu's mangled name."""
    m = re.search(r"2cu(\d+)(custom_kernel_\w+)", mangled)
    return m.group(2)[: int(m.group(1))] if m else mangled


def warps_per_sm(registers: int) -> int:
    per_warp = math.ceil(max(registers, 1) / 8) * 8 * 32  # allocated per warp in units of 8 registers per thread
    return min(MAX_WARPS_PER_SM, REGISTERS_PER_SM // per_warp)


def parse_ptxas(log: str) -> dict:
    """{kernel: registers, spill bytes, stack, register-limited warps per SM} from ptxas -v."""
    out, current = {}, None
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '([^']+)'", line):
            current = out.setdefault(short_name(m.group(1)), {})
        elif current is not None and (m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            current["stack"], current["spill_bytes"] = int(m.group(1)), int(m.group(2)) + int(m.group(3))
        elif current is not None and (m := re.search(r"Used (\d+) registers", line)):
            current["registers"] = int(m.group(1))
            current["warps_per_sm"] = warps_per_sm(current["registers"])
    return out


# ---------------------------------------------------------------- MLX's own JIT headers


def mlx_headers() -> tuple[dict[str, bytes], Path]:
    """utils.cuh, complex.cuh and config.h as MLX's JIT passes them to NVRTC (strings in libmlx.so of
    the mlx-cuda-13 wheel of the installed MLX version), and the CCCL include folder that wheel ships."""
    version = mx.__version__.split(".dev")[0]
    folder = CACHE / version
    wheels = list(folder.glob("mlx_cuda_13-*.whl"))
    if not wheels:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_35_x86_64",
                        "-d", str(folder), f"mlx-cuda-13=={version}"], check=True)
        wheels = list(folder.glob("mlx_cuda_13-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        data = z.read("mlx/lib/libmlx.so")
        cccl = folder / "mlx" / "include" / "cccl"
        if not cccl.exists():
            z.extractall(folder, [n for n in z.namelist() if n.startswith("mlx/include/cccl/")])
    strings = [s for s in re.findall(rb"\x00(// Copyright[^\x00]{100,})", data)]
    found = {
        "utils.cuh": [s for s in strings if b"using Shape =" in s and b"#pragma once" in s],
        "config.h": [s for s in strings if b"#define MAX_NDIM" in s],
        "complex.cuh": [s for s in strings if b"using complex64_t" in s],
    }
    missing = [name for name, hits in found.items() if len(hits) != 1]
    if missing:
        raise RuntimeError(f"libmlx.so {version}: could not single out {missing} among its JIT sources")
    return {PREFIX + name: hits[0] for name, hits in found.items()}, cccl


def stand_in_headers() -> dict[str, bytes]:
    return {PREFIX + "utils.cuh": STAND_IN_UTILS.encode()}


# ---------------------------------------------------------------- every CUDA program mlxspec generates


MMA_BUILDS = ((1, 1), (2, 1), (1, 2), (1, 8))  # (16-column tiles, 8-row tiles): a step, wider, 16 rows, prefill


def programs(rows: tuple[int, ...] = (1, 2, 4, 8, 16)) -> dict[str, str]:
    """label -> the full CUDA program `mx.fast.cuda_kernel` would compile, one per family and layout
    (qmm and dense at each row capacity in `rows`)."""
    f16, bf16, f32 = mx.float16, mx.bfloat16, mx.float32
    out = {}
    qmm_layouts = [(f16, f16, 64, 4, "affine"), (bf16, bf16, 64, 4, "affine"), (f32, f16, 32, 4, "affine"),
                   (f16, f16, 64, 8, "affine"), (f16, f16, 64, 2, "affine"), (f16, f16, 64, 3, "affine"),
                   (f32, f32, 32, 5, "affine"), (f32, f32, 32, 6, "affine"), (bf16, mx.uint8, 32, 4, "mxfp4")]
    for x, s, g, bits, mode in qmm_layouts:
        tag = f"{str(x).split('.')[-1]} q{bits} g{g} {mode}"
        _, out[f"qmm {tag}"] = gpu_source.cuda_source(x, s, output_dtype(x, s), g, bits, mode, rows=rows)
        _, out[f"gather {tag}"] = gpu_source.cuda_source(x, s, output_dtype(x, s), g, bits, mode, gather=True)
        _, out[f"grouped {tag}"] = gpu_source.cuda_source(x, s, output_dtype(x, s), g, bits, mode, gather="grouped",
                                                          rows=rows)
    for x, g, bits in ((f16, 64, 4), (bf16, 128, 4), (f16, 32, 8), (f16, 32, 6), (bf16, 32, 5)):  # tensor cores
        tag = f"{str(x).split('.')[-1]} q{bits} g{g}"
        _, out[f"qmm-mma {tag}"] = gpu_mma_source.cuda_source(x, x, x, g, bits, builds=MMA_BUILDS)
    for w in (f16, bf16, f32):
        _, out[f"dense {str(w).split('.')[-1]}"] = gpu_source.cuda_dense_source(w, w, w, rows=rows)
    for q, kv, sinks in ((f16, f16, False), (bf16, bf16, True), (f32, f32, False), (f32, f16, True)):
        label = f"sdpa q {str(q).split('.')[-1]} kv {str(kv).split('.')[-1]}" + (" sinks" if sinks else "")
        dpl = 2 if sinks else 8  # sinks: gpt-oss's head dim 64 (the 8-dims-a-lane build compiles ~3x longer)
        _, out[label] = gpu_attention_source.program("cuda", q, sinks=sinks, kv_dtype=kv, dpl=dpl)
    _, out["sdpa q float16 kv float16 one head a warp"] = gpu_attention_source.program("cuda", f16, heads=1)
    for heads in (1, 4):  # head dim 128 (4 dims a lane), as Llama's: what the wrapper compiles for such models
        _, out[f"sdpa q float16 kv float16 D128 {heads} heads a warp"] = gpu_attention_source.program(
            "cuda", f16, heads=heads, dpl=4)
        _, out[f"sdpa q float16 kv float16 D128 {heads} heads a warp, 16 value rows in flight"] = (  # PACK 2: bench's
            gpu_attention_source.program("cuda", f16, heads=heads, dpl=4, pack=2))  # ours-batch16
    for dtype, d, dv in ((f16, 128, 128), (bf16, 128, 128), (f16, 64, 64)):  # tensor cores: Llama's heads, gpt-oss's
        label = f"sdpa-mma {str(dtype).split('.')[-1]} D{d}"
        _, out[label] = gpu_attention_mma_source.program(dtype, d, dv, sinks=d == 64)
    for kind in (accept_source.GREEDY, accept_source.REJECTION):
        for dtype in (f32, f16):
            _, out[f"accept {kind} {str(dtype).split('.')[-1]}"] = accept_source.cuda_source(kind, dtype)
    return out


def compile_all(nvrtc: Nvrtc, archs: list[str], only: str = "", threads: int = 2,
                rows: tuple[int, ...] = (1, 2, 4, 8, 16), labels: list[str] | None = None) -> list[Compiled]:
    """Compile the programs whose label contains `only` (or those named in `labels`) for each arch."""
    chosen = {k: v for k, v in programs(rows).items() if (k in labels if labels is not None else only in k)}
    jobs = [(label, src, arch) for label, src in chosen.items() for arch in archs]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda job: nvrtc.compile(*job), jobs))


# ---------------------------------------------------------------- SASS: the hot loop's instruction mix


def sass_functions(cubin: bytes, bin_dir: Path) -> dict[str, list[tuple[int, str]]]:
    """{kernel: [(address, instruction)]} disassembled by cuobjdump (which runs nvdisasm)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        env = {"PATH": str(bin_dir)}
        text = subprocess.run([str(bin_dir / "cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                              check=True, env=env).stdout
    out, current = {}, None
    for line in text.splitlines():
        if m := re.search(r"Function : (\S+)", line):
            current = out.setdefault(short_name(m.group(1)), [])
        elif current is not None and (m := re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+([^;]+);", line)):
            current.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def opcode(instruction: str) -> str:
    words = instruction.split()
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def loops(code: list[tuple[int, str]], least: int = 64) -> list[dict]:
    """The instruction mix of each outermost loop (a backward branch's span) of at least `least`
    instructions, in address order (the qmm kernels have two: wide x loads, and one by one)."""
    spans = []
    for i, (address, ins) in enumerate(code):
        if opcode(ins) == "BRA" and (m := re.search(r"0x([0-9a-f]+)", ins)) and int(m.group(1), 16) <= address:
            start = next((j for j, (a, _) in enumerate(code) if a == int(m.group(1), 16)), None)
            if start is not None and i - start + 1 >= least:
                spans.append((start, i))
    outer = [(a, b) for a, b in spans if not any(c <= a and b <= d and (c, d) != (a, b) for c, d in spans)]
    out = []
    for a, b in sorted(outer):
        body = [opcode(ins) for _, ins in code[a : b + 1]]
        mix = {op: body.count(op) for op in sorted(set(body), key=lambda o: -body.count(o))}
        out.append({"instructions": len(body), "mix": mix})
    return out


def add_sass(results: list[Compiled], bin_dir: Path) -> None:
    for r in results:
        if r.cubin:
            r.sass = {name: loops(code) for name, code in sass_functions(r.cubin, bin_dir).items()}


# ---------------------------------------------------------------- binaries as the kernel store keeps them

LAUNCH_US_PER_KB = 0.37  # MLX hashes a precompiled kernel's binary at every launch (H200, fifth device session)


def stored_binaries(nvrtc: Nvrtc, arch: str = "sm_90", only: str = "") -> list[tuple[str, int, int | None]]:
    """(label, cubin bytes, compressed fatbin bytes) of the binaries kernels/cuda_cache.py keeps for the hottest
    launches: one program per template instantiation; each launch hands MLX the fatbin where nvFatbin is
    installed (kernels/cuda_fatbin.py; None here without it), else the cubin. `only`: the labels containing it."""
    try:
        packer = Fatbin(cuda_cache.load_library("libnvfatbin", cuda_cache.nvidia_roots()))
    except KernelUnavailable:
        packer = None
    f16, f32, u32 = mx.float16, mx.float32, mx.uint32
    qmm_in = [f16, u32, f16, f16]
    cases = []
    for x, g, rows in ((f16, 64, 1), (f16, 64, 16), (f32, 32, 1), (f32, 32, 16)):  # f32 x: GGUF models' activations
        cases.append((f"qmm (FMA) {str(x).split('.')[-1]} x, q4 g{g}, {rows} row(s)", gpu_source.NAME, gpu_source.INPUTS,
                      gpu_source.CUDA_BODY, gpu_source.CUDA_HEADER, [x] + qmm_in[1:], [x],
                      gpu_source.template_args(x, f16, output_dtype(x, f16), g, 4, "affine", rows)))
    for tiles, rt in ((1, 1), (2, 2)):
        cases.append((f"qmm (tensor cores) float16 x, q4 g64, {tiles} tile(s) x {8 * rt} rows", gpu_mma_source.NAME,
                      gpu_mma_source.INPUTS, gpu_mma_source.BODY, gpu_mma_source.HEADER, qmm_in, [f16],
                      gpu_mma_source.template_args(f16, f16, f16, 64, 4, tiles, 8 * rt)))
    out = []
    for label, name, inputs, body, header, dtypes, out_dtypes, targs in (c for c in cases if only in c[0]):
        _, text = cuda_cache.program(name, inputs, ["y"], body, header, dtypes, [2] * len(inputs), out_dtypes, targs)
        cubin = nvrtc.compile(label, text, arch).cubin
        packed = len(packer.pack(cubin, arch)) if cubin and packer else None
        out.append((label, len(cubin) if cubin else -1, packed))
    return out


def binaries_table(sizes: list[tuple[str, int, int | None]]) -> str:
    rows = ["| stored program | cubin KB | fatbin KB | copied and hashed per launch, us (at 0.37 us/KB): cubin, fatbin |",
            "|---|---|---|---|"]
    for label, n, packed in sizes:
        fat = (f"{packed / 1024:.1f}", f"{packed / 1024 * LAUNCH_US_PER_KB:.1f}") if packed else ("-", "-")
        rows.append(f"| {label} | {n / 1024:.1f} | {fat[0]} | {n / 1024 * LAUNCH_US_PER_KB:.1f}, {fat[1]} |")
    return "\n".join(rows)


# ---------------------------------------------------------------- report


def table(results: list[Compiled]) -> str:
    rows = ["| program | arch | kernel | registers | spill bytes | warps/SM (registers) | main loop: instructions, mix |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if r.error:
            rows.append(f"| {r.label} | {r.arch} | COMPILE ERROR | | | | {r.error.splitlines()[0][:80]} |")
            continue
        for name, k in r.kernels.items():
            found = r.sass.get(name)  # the loop doing the most FMAs in the fewest instructions (qmm: the wide-load copy)
            loop = min(found, key=lambda lp: (-lp["mix"].get("FFMA", 0), lp["instructions"])) if found else None
            mix = ", ".join(f"{op} {n}" for op, n in list(loop["mix"].items())[:6]) if loop else ""
            loop_text = f"{loop['instructions']}: {mix}" if loop else ""
            rows.append(f"| {r.label} | {r.arch} | {name.replace('custom_kernel_', '')} | {k.get('registers')} "
                        f"| {k.get('spill_bytes')} | {k.get('warps_per_sm')} | {loop_text} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", action="append", help="sm_90 (default), sm_80, sm_100, ...")
    ap.add_argument("--only", default="", help="programs whose label contains this")
    ap.add_argument("--mlx-headers", action="store_true", help="MLX's own JIT headers (downloads the mlx-cuda wheel)")
    ap.add_argument("--sass", action="store_true", help="the hot loop's instruction mix (cuobjdump + nvdisasm)")
    ap.add_argument("--json", type=Path, help="save the results here")
    ap.add_argument("--binaries", action="store_true", help="only the stored binaries' sizes of the hottest launches")
    args = ap.parse_args()
    root = nvidia_root()
    if root is None:
        print("NVRTC not found: pip install nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cuda-cccl", file=sys.stderr)
        return 2
    headers, cccl = mlx_headers() if args.mlx_headers else (stand_in_headers(), None)
    if args.binaries:
        print(binaries_table(stored_binaries(Nvrtc(root, headers, cccl), (args.arch or ["sm_90"])[0])))
        return 0
    results = compile_all(Nvrtc(root, headers, cccl), args.arch or ["sm_90"], args.only)
    if args.sass:
        add_sass(results, root / "bin")
    print(table(results))
    if args.json:
        meta = {"mlx": mx.__version__, "headers": "mlx" if args.mlx_headers else "stand-in", "nvrtc": str(root)}
        results_json = [{k: v for k, v in asdict(r).items() if k != "cubin"} for r in results]
        args.json.write_text(json.dumps({"meta": meta, "results": results_json}, indent=1))
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
