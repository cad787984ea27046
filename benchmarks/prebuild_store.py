"""Fill mlxspec's CUDA kernel store here, without a GPU, for a device session to carry.

On a CUDA device each kernel program is compiled by NVRTC at its first use on that machine (~1-3 s each) and kept in
a store keyed by the program, the architecture and NVRTC's version (mlxspec/kernels/cuda_cache.py). A device session
starts from an empty store, so its first steps spend minutes compiling. This compiles the programs its steps use
(the matmul families' builds for the layouts below: every row capacity, each K split the tensor-core timing tries, the
MoE gathers, dense rows, the acceptance kernels) with the device image's NVRTC version (13.0, fetched as pip wheels
with its headers) for sm_90, and packs the store:

    python benchmarks/prebuild_store.py                    # -> .gpu-ptx/kernel-store.tar.gz
    # device: carry .gpu-ptx in a staging call, `cp .gpu-ptx/kernel-store.tar.gz /var/tmp/stash/`;
    # benchmarks/device_check.sh unpacks it into the store, and those programs skip NVRTC there

A program the device builds that is not here compiles there as before; a stored program is self-checked on the device
like any other (the store holds cubins; each launch packs its fatbin there). Attention: the row-contiguous twins a
compiled step launches over its cache buffers (both families, the signatures below) are stored; the in-place builds
(self-checks, eager passes over cache views) read strides and go through MLX's JIT in every process.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlxspec.kernels import accept, gpu, gpu_attention  # noqa: E402
from mlxspec.kernels.build import KernelUnavailable  # noqa: E402
from mlxspec.kernels.tree_mask import tree_rows  # noqa: E402
from mlxspec.kernels.cuda_cache import CachedCudaKernel, Compiler, Nvrtc, include_paths, launch_of, probe_launch  # noqa: E402
from mlxspec.kernels.registry import _x_dtypes  # noqa: E402

F16, BF16, F32 = mx.float16, mx.bfloat16, mx.float32
# (scale dtype, group size, bits, mode) of the layers device_check's steps run
LAYOUTS = [
    (F16, 64, 4, "affine"),  # the 8B-shape forwards and ceiling, the families' models, the ops table
    (F16, 64, 6, "affine"),  # the ops table's 6-bit rows
    (mx.uint8, 32, 4, "mxfp4"),  # gpt-oss's experts, the ops table's mxfp4 rows
    (F16, 32, 4, "affine"),  # SmolLM2's Q4_1 GGUF layers (the engine and `mlxspec bench` steps)
    (F32, 32, 8, "affine"),  # its Q8_0 embedding, tied as the head
    (BF16, 64, 4, "affine"),  # kernels/first_run.py's bfloat16 model (its float16 one: the first layout)
]
GATHERS = [(F16, 64, 4, "affine"), (mx.uint8, 32, 4, "mxfp4")]  # qwen3_moe's and gpt-oss's experts
# (query heads, kv heads, head dim, dtype) of the attention layers device_check's models run
ATTENTION = [(32, 8, 128, F16), (32, 8, 64, F16), (9, 3, 64, F16), (9, 3, 64, BF16), (8, 4, 8, F32),
             (4, 2, 128, BF16)]  # the last: first_run.py's bfloat16 model
ATTENTION_ROWS = (1, 2, 4, 8, 16)  # a step, verify passes
CAPACITIES = (256, 512, 1024, 2048, 4096, 8192)  # a compiled step's cache buffers (step_graph's buckets)
WHEELS = ["nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cuda-cccl"]  # NVRTC and the headers programs include


class CompileOnly(CachedCudaKernel):
    """A cached kernel that builds each launch's program into the store and launches nothing (zeros out)."""

    def __call__(self, inputs, output_shapes, output_dtypes, grid, threadgroup, template=(), **_):
        self.prebuild([launch_of(inputs, output_dtypes, template)])
        return [mx.zeros(shape, dtype) for shape, dtype in zip(output_shapes, output_dtypes)]


def toolkit(version: str, folder: Path) -> Path:
    """NVRTC `version` and its headers from pip's wheels, unpacked under folder once: the toolkit's home."""
    home = folder / f"cuda-{version}" / "nvidia" / f"cu{version.split('.')[0]}"
    if not (home / "lib").is_dir():
        wheels = folder / f"wheels-{version}"
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                               "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
                               "--python-version", "3.12", "-d", str(wheels), *(f"{w}=={version}.*" for w in WHEELS)],
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"could not fetch NVRTC {version} from pip: {done.stderr.strip().splitlines()[-1:]}")
        for wheel in wheels.glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(folder / f"cuda-{version}")
    return home


def wrappers(compiler: Compiler) -> tuple[dict, list[CachedCudaKernel]]:
    """mlxspec's CUDA wrappers (gpu.py, accept.py) over compile-only kernels on `compiler`, and those kernels."""
    made: list[CachedCudaKernel] = []

    def make(name, input_names, output_names, source, header="", ensure_row_contiguous=True, **_):
        try:
            made.append(CompileOnly(compiler, name, input_names, output_names, source, header, ensure_row_contiguous))
        except KernelUnavailable:  # reads the strides of views: MLX's JIT on the device, nothing to store
            return lambda output_shapes, output_dtypes, **kw: [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes)]
        return made[-1]

    qmm = gpu.cuda_qmm_function(make)
    greedy, rejection = accept._kernels("cuda", cuda_maker=make)
    return {"qmm": qmm, "tensor-core": gpu.cuda_mma_qmm_function(fallback=qmm, make=make),
            "gather": gpu.cuda_gather_qmm_function(make), "dense": gpu.cuda_dense_function(make),
            "greedy": greedy, "rejection": rejection, "sdpa": gpu_attention.cuda_sdpa_function(make=make),
            "sdpa-mma": gpu_attention.cuda_sdpa_mma_function(make=make)}, made


def build(compiler: Compiler, layouts=LAYOUTS, gathers=GATHERS, dtypes=(F16, BF16, F32), attention=ATTENTION,
          chunks=(64, 128, 256), capacities=CAPACITIES) -> int:
    """Store every program of these layouts (the FMA and tensor-core qmm, each K split), gathers, dense rows and the
    acceptance kernels in `dtypes`, as the wrappers' `prepare` (what a self-check compiles) lists them, and the
    attention launches of compiled steps over these cache capacities (the FMA family, the tensor cores' builds
    walking `chunks` keys a warp: those the timing tries); how many."""
    k, _ = wrappers(compiler)
    # the probe a device process runs before any family (cuda_cache.probe): stored too, it tests the store's cubins
    # load there (else that process takes MLX's JIT for every kernel, as where the cached path cannot run)
    probe_launch(compiler, CompileOnly)
    for scale_dtype, group, bits, mode in layouts:
        for ksplit in (2, 4, 8):  # the default and the builds timing.prefer_tensor_cores tries
            k["tensor-core"].with_ksplit(ksplit).prepare(_x_dtypes(scale_dtype, mode), scale_dtype, group, bits, mode)
        k["qmm"].prepare(_x_dtypes(scale_dtype, mode), scale_dtype, group, bits, mode)
    for scale_dtype, group, bits, mode in gathers:
        k["gather"].prepare(_x_dtypes(scale_dtype, mode), scale_dtype, group, bits, mode)
    for dtype in dtypes:
        k["dense"].prepare(dtype)
        for drafts in (0, 4):  # none (their stand-in is one word) and some: the same programs
            k["greedy"](mx.zeros((drafts + 1, 64), dtype), mx.zeros((drafts,), mx.uint32))
            k["rejection"](mx.zeros((drafts + 1, 64), dtype), mx.zeros((max(drafts, 1), 64), dtype),
                           mx.zeros((drafts,), mx.uint32), mx.zeros((drafts + 1,)))
    for heads, kv_heads, dim, dtype in attention:
        for sdpa in [k["sdpa"]] + [k["sdpa-mma"].with_chunk(c) for c in chunks]:
            attend_over_buffers(sdpa, heads, kv_heads, dim, dtype, capacities)
    return len(list(compiler.folder.glob("*.bin")))  # the programs stored (launches sharing one count once)


def attend_over_buffers(sdpa, heads: int, kv_heads: int, dim: int, dtype, capacities=CAPACITIES) -> None:
    """The launches a compiled step makes over its cache buffers (`length`): each row count and capacity, draft
    trees' passes; a build that cannot compute the signature (the tensor cores: float32, head dims) is skipped."""
    if getattr(sdpa, "supports", None) and not sdpa.supports(dtype, dtype, dim, dim):
        return
    for cap in capacities:
        kv, length = mx.zeros((1, kv_heads, cap, dim), dtype), mx.array([cap // 2 + 1])
        for rows in ATTENTION_ROWS:
            q = mx.zeros((1, heads, rows, dim), dtype)
            sdpa(q, kv, kv, dim**-0.5, True, length=length)
            if rows > 1:
                sdpa(q, kv, kv, dim**-0.5, True, length=length, tree=tree_rows(tuple(range(-1, rows - 1)), cap // 2))


def load_nvrtc(version: str, downloads: Path) -> Nvrtc:
    """NVRTC `version` from pip's wheels (toolkit), its builtins library loaded first (NVRTC opens it by name)."""
    import ctypes

    home = toolkit(version, downloads)
    for builtins in (home / "lib").glob("libnvrtc-builtins.so.*"):
        ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
    nvrtc = Nvrtc(ctypes.CDLL(str(home / "lib" / f"libnvrtc.so.{version.split('.')[0]}")), include_paths([home]))
    if nvrtc.version != version:
        raise SystemExit(f"NVRTC {nvrtc.version} loaded, {version} wanted")
    return nvrtc


def pack(folder: Path, out: Path) -> None:
    """The store's files at the archive's top, as device_check.sh unpacks it into the device's store."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        for path in sorted(folder.glob("*.bin")):
            tar.add(path, arcname=path.name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvrtc", default="13.0", help="NVRTC's version on the device (its store key): 13.0 on the image")
    ap.add_argument("--arch", default="sm_90", help="the device's architecture (H100 and H200: sm_90)")
    ap.add_argument("--out", default=str(ROOT / ".gpu-ptx" / "kernel-store.tar.gz"))
    ap.add_argument("--downloads", default=str(Path(tempfile.gettempdir()) / "mlxspec-nvrtc"),
                    help="where the NVRTC wheels are fetched and unpacked (kept for the next run)")
    args = ap.parse_args(argv)
    nvrtc = load_nvrtc(args.nvrtc, Path(args.downloads))
    with tempfile.TemporaryDirectory() as folder:
        compiler, start = Compiler(nvrtc, args.arch, Path(folder)), time.perf_counter()
        programs = build(compiler)
        pack(Path(folder), Path(args.out))
    print(f"{programs} programs ({compiler.compiles} compiled, NVRTC {nvrtc.version}, {args.arch}) in "
          f"{time.perf_counter() - start:.0f} s -> {args.out} ({Path(args.out).stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
