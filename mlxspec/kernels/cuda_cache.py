"""CUDA kernels compiled once per machine, not once per process.

MLX's `mx.fast.cuda_kernel` compiles a custom kernel with NVRTC at its first launch in each process and
keeps no disk cache for it (its own kernels it caches under MLX_PTX_CACHE_DIR): ~2 s a template
instantiation, most of the 76 s an 8B model's `install_kernels` took on an H200, again in every process.
Here the same program is compiled by NVRTC (the library MLX loads) into this device's SASS, kept under the
kernel cache folder by a hash of the program, architecture and NVRTC version, and launched with
`mx.fast.precompiled_cuda_kernel`: later processes load it in milliseconds.

    make = kernel_maker()          # mx.fast.cuda_kernel where the cached path cannot run here
    kernel = make(name=..., input_names=..., output_names=..., source=..., header=...)
    y = kernel(inputs=[...], template=[...], output_shapes=[...], output_dtypes=[...], grid=..., threadgroup=...)

The program is what MLX generates (the template arguments as constants, the body as written), with each
input's shape passed as int arguments (precompiled kernels take scalars, not MLX's Shape structs). A body
that reads strides gets those its shape implies where the kernel takes row-contiguous inputs (MLX copies any
other first); a stride reader that takes inputs as they lie (`q_strides`: known only once an array is
evaluated) keeps MLX's JIT. The path proves itself once per process on a small kernel before any family
uses it, and each family's self-check then runs on the build layers will use.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import mlx.core as mx

from .build import KernelUnavailable, cache_root
from .cuda_fatbin import Fatbin
from .gpu_codegen import CUDA_TYPES

log = logging.getLogger(__name__)

# What the bodies use of MLX's preamble: the half types and fixed-width integers. Not cooperative_groups.h
# (MLX's default header): it alone grows each binary from ~4 KB to ~80 KB, and a precompiled kernel's
# binary is handed to MLX with every call.
PREAMBLE = """#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/cstdint>
using cuda::std::int32_t;
using cuda::std::int64_t;
using cuda::std::uint8_t;
using cuda::std::uint32_t;
using cuda::std::uint64_t;
"""


class Nvrtc:
    """NVRTC through ctypes: a CUDA program -> SASS (cubin) for one architecture, or PTX where it cannot."""

    def __init__(self, library: ctypes.CDLL, includes: list[str]):
        self.lib, self.includes = library, includes
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = f"{major.value}.{minor.value}"

    def compile(self, source: str, arch: str, label: str = "program", options: tuple[str, ...] = (),
                headers: dict[str, bytes] | None = None) -> tuple[bytes, str]:
        """(cubin, log) of `source` for `arch` (sm_90); KernelUnavailable with NVRTC's log if it fails."""
        lib, prog, headers = self.lib, ctypes.c_void_p(), headers or {}
        names, texts = [n.encode() for n in headers], list(headers.values())
        _check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{label}.cu".encode(), len(names),
                                      (ctypes.c_char_p * len(names))(*texts), (ctypes.c_char_p * len(names))(*names)),
               "nvrtcCreateProgram")
        try:
            opts = [f"--gpu-architecture={arch}", *options] + [f"--include-path={p}" for p in self.includes]
            result = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts]))
            size = ctypes.c_size_t()
            _check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
            text = ctypes.create_string_buffer(size.value)
            _check(lib.nvrtcGetProgramLog(prog, text), "nvrtcGetProgramLog")
            log_text = text.value.decode(errors="replace")
            if result != 0:
                raise KernelUnavailable(f"NVRTC could not compile {label}: {log_text.strip()[:2000]}")
            kind = "CUBIN" if arch.startswith("sm_") else "PTX"
            _check(getattr(lib, f"nvrtcGet{kind}Size")(prog, ctypes.byref(size)), f"nvrtcGet{kind}Size")
            out = ctypes.create_string_buffer(size.value)
            _check(getattr(lib, f"nvrtcGet{kind}")(prog, out), f"nvrtcGet{kind}")
            return out.raw, log_text
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _check(result: int, what: str) -> None:
    if result != 0:
        raise KernelUnavailable(f"{what} failed: NVRTC error {result}")


def nvidia_roots() -> list[Path]:
    """nvidia/cu13 and nvidia/cu12 of pip's NVIDIA packages (nvidia-cuda-nvrtc & co), where installed."""
    spec = importlib.util.find_spec("nvidia")
    bases = list(spec.submodule_search_locations or []) if spec else []
    return [Path(b) / cu for b in bases for cu in ("cu13", "cu12") if (Path(b) / cu).is_dir()]


def cuda_homes(environ=os.environ) -> list[Path]:
    """Where MLX's JIT looks for the CUDA toolkit (CUDA_HOME, CUDA_PATH, /usr/local/cuda), then pip's."""
    found = [Path(environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if environ.get(v)] + [Path("/usr/local/cuda")]
    return [p for p in found if p.is_dir()] + nvidia_roots()


def include_paths(homes: list[Path]) -> list[str]:
    """MLX's order: the CCCL its wheel ships, then the toolkit's headers (and the CCCL inside them)."""
    mlx_dir = Path(importlib.util.find_spec("mlx").submodule_search_locations[0])
    paths = [mlx_dir / "include" / "cccl"] + [p for h in homes for p in (h / "include", h / "include" / "cccl", h / "cccl")]
    return [str(p) for p in paths if p.is_dir()]


def load_nvrtc(homes: list[Path]) -> ctypes.CDLL:
    """The NVRTC library: the one MLX loaded (by its soname), else from the toolkit or pip's package."""
    return load_library("libnvrtc", homes)


def load_library(stem: str, homes: list[Path]) -> ctypes.CDLL:
    """A CUDA 13 or 12 library (libnvrtc, libnvfatbin) by its soname, else from the toolkit or pip's package."""
    candidates = [f"{stem}.so.13", f"{stem}.so.12"]
    candidates += [str(p) for h in homes for d in ("lib", "lib64") for p in sorted((h / d).glob(f"{stem}.so*"))]
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise KernelUnavailable(f"{stem}.so not found")


def device_arch() -> str:
    info = mx.device_info()
    return f"sm_{info['compute_capability_major']}{info['compute_capability_minor']}"


# ---------------------------------------------------------------- the program and its launch


def program(name: str, input_names: list[str], output_names: list[str], source: str, header: str,
            input_dtypes: list, input_ndims: list[int], output_dtypes: list, template: list[tuple]) -> tuple[str, str]:
    """(entry name, full program): MLX's for this body, with shapes as int arguments after the outputs (and the
    strides of a row-contiguous launch from them)."""
    params = [f"    const {CUDA_TYPES[d]}* {n}" for n, d in zip(input_names, input_dtypes)]
    params += [f"    {CUDA_TYPES[d]}* {n}" for n, d in zip(output_names, output_dtypes)]
    declared = ""  # the shapes, strides and ndims the body reads
    for n, ndim, reads in zip(input_names, input_ndims, shape_readers(input_names, source)):
        dims = [f"{n}_shape_{i}" for i in range(ndim)]
        if reads:
            params += [f"    const __grid_constant__ int {d}" for d in dims]  # as MLX's Shape: 64 registers, not 72
            declared += f"  const int32_t {n}_shape[{max(ndim, 1)}] = {{{', '.join(dims) or '0'}}};\n"
        if f"{n}_strides" in source:  # a row-contiguous input's (CachedCudaKernel takes no other stride reader)
            declared += f"  const int64_t {n}_strides[{max(ndim, 1)}] = {{{', '.join(row_strides(dims))}}};\n"
        if f"{n}_ndim" in source:
            declared += f"  constexpr int {n}_ndim = {ndim};\n"
    consts = "".join(f"  using {k} = {CUDA_TYPES[v]};\n" if isinstance(v, mx.Dtype) else
                     f"  constexpr {'bool' if isinstance(v, bool) else 'int'} {k} = {str(v).lower()};\n"
                     for k, v in template)
    text = (f'extern "C" __global__ void ENTRY(\n' + ",\n".join(params) + ") {\n" + declared + consts
            + "\n" + source + "\n}\n")
    digest = hashlib.sha256((PREAMBLE + header + text).encode()).hexdigest()[:16]
    entry = f"{name}_{digest}"  # our kernels' names start with mlxspec_
    return entry, PREAMBLE + header + text.replace("ENTRY", entry)


def shape_readers(input_names: list[str], source: str) -> tuple[bool, ...]:
    """Which inputs' shapes the body reads, itself or through their strides (`program` declares their dimensions
    as int arguments): once per kernel, not per call (searching a 13 KB body for each input's name cost 6.5 us
    of Python a call)."""
    return tuple(f"{n}_shape" in source or f"{n}_strides" in source for n in input_names)


def row_strides(dims: list[str]) -> list[str]:
    """C expressions of a row-contiguous array's strides from its dimensions' names (int64: a KV cache's
    elements may pass 2**31)."""
    return [" * ".join(f"int64_t({d})" for d in dims[i + 1 :]) or "int64_t(1)" for i in range(len(dims))] or ["int64_t(1)"]


def shape_scalars(readers: tuple[bool, ...], inputs: list[mx.array]) -> list[int]:
    """The int arguments `program` declares: each shape-reading input's dimensions, in input order."""
    return [int(d) for reads, a in zip(readers, inputs) if reads for d in a.shape]


class CachedCudaKernel:
    """mx.fast.cuda_kernel's callable, its programs compiled once per machine (see the module docstring)."""

    stored = True  # what gpu_attention asks of a maker's kernel: is a row-contiguous twin worth making

    def __init__(self, compiler: "Compiler", name: str, input_names, output_names, source: str, header: str = "",
                 ensure_row_contiguous: bool = True):
        if not ensure_row_contiguous and any(f"{n}_strides" in source or f"{n}_ndim" in source for n in input_names):
            raise KernelUnavailable(f"{name} reads the strides of inputs as they lie: known only at evaluation")
        self.compiler, self.name, self.source, self.header = compiler, name, source, header
        self.input_names, self.output_names = list(input_names), list(output_names)
        self.ensure_row_contiguous = ensure_row_contiguous
        self._readers = shape_readers(self.input_names, source)
        self._built: dict[tuple, tuple[str, bytes]] = {}
        self._jit = None  # MLX's JIT kernel, from the first program this path could not build

    def __call__(self, inputs, output_shapes, output_dtypes, grid, threadgroup, template=(), init_value=None,
                 verbose: bool = False, stream=None):
        launch = launch_of(inputs, output_dtypes, template)
        built = None if self._jit else (self._built.get(_key(*launch)) or self._build(*launch))
        if built is None:  # MLX's JIT for every launch of this kernel from then on: one builder, the same bits
            return self._jit(inputs=inputs, output_shapes=output_shapes, output_dtypes=output_dtypes, grid=grid,
                             threadgroup=threadgroup, template=template, init_value=init_value, stream=stream)
        entry, binary = built
        return mx.fast.precompiled_cuda_kernel(
            name=entry, compiled_source=binary, inputs=inputs, output_shapes=output_shapes, output_dtypes=output_dtypes,
            scalars=shape_scalars(self._readers, inputs), grid=grid, threadgroup=threadgroup,
            init_value=init_value, ensure_row_contiguous=self.ensure_row_contiguous, stream=stream)

    def prebuild(self, launches: list[tuple]) -> None:
        """Compile the programs of these launches, each (input dtypes, input ndims, output dtypes, template),
        at once on threads (NVRTC runs outside the GIL): a family's first self-check needs several (row
        capacities, dtypes), ~2 s each one after another. Failures are left to the launch itself."""
        todo = {_key(*launch): launch for launch in launches if _key(*launch) not in self._built}
        if self._jit is not None or not todo:
            return
        def attempt(launch):
            try:
                return self._compile(launch)
            except (KernelUnavailable, KeyError):
                return None

        with ThreadPoolExecutor(min(len(todo), os.cpu_count() or 1)) as pool:
            for key, result in zip(todo, pool.map(attempt, todo.values())):
                if result is not None:
                    self._built[key] = result

    def _compile(self, launch: tuple) -> tuple[str, bytes]:
        """(entry, binary) of one launch (input dtypes, input ndims, output dtypes, template), stored or compiled."""
        entry, text = program(self.name, self.input_names, self.output_names, self.source, self.header, *launch)
        return entry, self.compiler.launchable(self.compiler.binary(entry, text))

    def _build(self, input_dtypes, input_ndims, output_dtypes, template) -> tuple[str, bytes] | None:
        """This launch's (entry, binary), compiled or read from the store; None: MLX's JIT takes the kernel over."""
        launch = (input_dtypes, input_ndims, output_dtypes, template)
        try:
            self._built[_key(*launch)] = self._compile(launch)
            return self._built[_key(*launch)]
        except (KernelUnavailable, KeyError) as e:  # a dtype without a CUDA name here, a program NVRTC refuses
            if self._built:
                raise  # launches already ran the cached build: switching now would mix two builds' bits
            log.warning("mlxspec: %s through MLX's JIT (%s)", self.name, str(e).splitlines()[0][:200])
            self._jit = mx.fast.cuda_kernel(name=self.name, input_names=self.input_names, output_names=self.output_names,
                                            source=self.source, header=self.header,
                                            ensure_row_contiguous=self.ensure_row_contiguous)
            return None


def launch_of(inputs, output_dtypes, template) -> tuple:
    """A launch's (input dtypes, input ndims, output dtypes, template): what picks its program."""
    return [a.dtype for a in inputs], [a.ndim for a in inputs], list(output_dtypes), list(template)


def _key(input_dtypes, input_ndims, output_dtypes, template) -> tuple:
    return tuple(template), tuple(input_dtypes), tuple(input_ndims), tuple(output_dtypes)


class Compiler:
    """NVRTC plus the on-disk store: binary(entry, program) compiles a program once per machine;
    launchable(binary) is what a launch hands MLX: with a `packer` (cuda_fatbin.Fatbin) a compressed fatbin,
    3.5-5.5x fewer bytes for MLX to copy and hash at every launch, else the stored binary itself."""

    def __init__(self, nvrtc: Nvrtc, arch: str, folder: Path, packer=None):
        self.nvrtc, self.arch, self.folder, self.packer = nvrtc, arch, folder, packer
        self.compiles = 0  # programs compiled by this process (the rest came from the store)
        self._lock = threading.Lock()  # prebuild compiles on threads

    def launchable(self, binary: bytes) -> bytes:
        return binary if self.packer is None else self.packer.pack(binary, self.arch)

    def binary(self, entry: str, text: str) -> bytes:
        key = hashlib.sha256(f"{text}\n{self.arch}\nnvrtc {self.nvrtc.version}".encode()).hexdigest()[:16]
        path = self.folder / f"{entry}_{self.arch}_{key}.bin"
        if path.exists():
            return path.read_bytes()
        try:
            binary, _ = self.nvrtc.compile(text, self.arch, entry)
        except KernelUnavailable as e:  # an architecture this NVRTC has no SASS for: PTX, as MLX's JIT falls back
            if "gpu-architecture" not in str(e):  # not a program ptxas refuses (it would refuse the PTX at load too)
                raise
            binary, _ = self.nvrtc.compile(text, "compute_" + self.arch[3:], entry)
        with self._lock:
            self.compiles += 1
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(binary)
        tmp.replace(path)  # atomic: another process may be writing the same program
        return binary


# ---------------------------------------------------------------- choosing the path, once per process


PROBE = """  const int i = threadIdx.x;
  if (i < x_shape[0]) y[i] = x[i] * SCALE + float(x_shape[0]);"""
_MAKER: list = []  # [(maker, why)]: decided once per process


def probe_launch(compiler: Compiler, kind=None) -> tuple[mx.array, mx.array]:
    """(x, y) of the probe kernel's one launch (kind: the kernel class, CachedCudaKernel by default)."""
    kernel = (kind or CachedCudaKernel)(compiler, "probe", ["x"], ["y"], PROBE)
    x = mx.arange(40, dtype=mx.float32)
    return x, kernel(inputs=[x], template=[("SCALE", 3)], output_shapes=[(40,)], output_dtypes=[mx.float32],
                     grid=(64, 1, 1), threadgroup=(64, 1, 1))[0]


def probe(compiler: Compiler) -> None:
    """A small kernel through the cached path on this device: the result it must give, else KernelUnavailable."""
    x, y = probe_launch(compiler)
    if not mx.array_equal(y, x * 3 + 40).item():
        raise KernelUnavailable("the probe kernel gave other values")


def kernel_maker() -> tuple[Callable, str]:
    """(make, how): make(**cuda_kernel's arguments) -> a kernel. The cached path where it compiles and
    its probe runs right on this device, else mx.fast.cuda_kernel (how says why)."""
    if not _MAKER:
        try:
            if os.environ.get("MLXSPEC_CUDA_CACHE", "1") == "0":  # read once per process, at this first use
                raise KernelUnavailable("turned off by MLXSPEC_CUDA_CACHE=0")
            homes = cuda_homes()
            compiler = Compiler(Nvrtc(load_nvrtc(homes), include_paths(homes)), device_arch(), cache_root() / "cuda",
                                packer(homes))
            try:
                probe(compiler)
            except Exception as e:  # a driver that will not load the fatbin: the cubins themselves
                if compiler.packer is None:
                    raise
                log.info("mlxspec: CUDA kernels as cubins (the fatbin probe: %s)", str(e).splitlines()[0][:200])
                compiler.packer = None
                probe(compiler)

            def make(name, input_names, output_names, source, header="", ensure_row_contiguous=True, **kw):
                try:
                    return CachedCudaKernel(compiler, name, input_names, output_names, source, header,
                                            ensure_row_contiguous)
                except KernelUnavailable:  # reads the strides of inputs as they lie: MLX's JIT
                    return mx.fast.cuda_kernel(name=name, input_names=input_names, output_names=output_names,
                                               source=source, header=header, ensure_row_contiguous=ensure_row_contiguous, **kw)

            packed = ", compressed fatbins" if compiler.packer is not None else ""
            _MAKER.append((make, f"compiled once per machine (NVRTC {compiler.nvrtc.version}, {compiler.arch}{packed})"))
        except Exception as e:  # no NVRTC, no headers, a driver that will not load it: MLX's JIT, as before
            why = f"MLX's JIT in each process ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
            log.info("mlxspec: CUDA kernels through %s", why)
            _MAKER.append((lambda **kw: mx.fast.cuda_kernel(**kw), why))
    return _MAKER[0]


def packer(homes: list[Path]) -> Fatbin | None:
    """nvFatbin where this machine has it (the CUDA toolkit's, pip's nvidia-nvfatbin), else None: cubins."""
    try:
        return Fatbin(load_library("libnvfatbin", homes))
    except (KernelUnavailable, AttributeError) as e:  # AttributeError: a library without nvFatbin's functions
        log.info("mlxspec: CUDA kernels as cubins (%s)", e)
        return None


def cuda_kernel(**kw):
    """mx.fast.cuda_kernel(**kw), compiled once per machine where this device allows (kernel_maker)."""
    return kernel_maker()[0](**kw)


def detail() -> str:
    """For a family's status: how its CUDA programs are compiled and loaded."""
    return kernel_maker()[1]
