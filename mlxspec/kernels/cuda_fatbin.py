"""Compressed fatbins: a stored kernel handed to MLX in a fraction of its bytes.

MLX's precompiled_cuda_kernel copies the binary it is given and hashes all of it at every launch (to find
its loaded module): ~0.37 us a KB on an H200 (bench_gpu's source-size probe, fifth device session), so
~9 us a call for the one-row FMA qmm's 24 KB cubin and ~31 us for its 16-row build's 83 KB. The CUDA
driver loads a fatbin wherever it loads a cubin (cuModuleLoadDataEx), and nvFatbin compresses the cubin
inside it: 6.8 and 15 KB for those two (NVRTC 13.0, sm_90). The driver unpacks it once, when MLX loads
the module; the code is the cubin's, byte for byte (tests/kernels/test_cuda_fatbin.py unpacks it with
cuobjdump).

    packer = Fatbin(cuda_cache.load_library("libnvfatbin", homes))   # KernelUnavailable where there is none
    image = packer.pack(cubin, "sm_90")     # PTX (an architecture NVRTC has no SASS for) is returned as is
"""

from __future__ import annotations

import ctypes
from .build import KernelUnavailable

ELF = b"\x7fELF"  # a cubin's first bytes


class Fatbin:
    """nvFatbin through ctypes: one cubin -> a fatbin holding it compressed."""

    OPTIONS = ("-64", "-compress-all", "-compress-mode=size")  # small cubins too; the smallest image

    def __init__(self, library: ctypes.CDLL):
        self.lib = library
        vp, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        library.nvFatbinCreate.argtypes = [ctypes.POINTER(vp), ctypes.POINTER(cp), sz]
        library.nvFatbinAddCubin.argtypes = [vp, ctypes.c_char_p, sz, cp, cp]
        library.nvFatbinSize.argtypes = [vp, ctypes.POINTER(sz)]
        library.nvFatbinGet.argtypes = [vp, ctypes.c_void_p]
        library.nvFatbinDestroy.argtypes = [ctypes.POINTER(vp)]

    def pack(self, binary: bytes, arch: str) -> bytes:
        """The fatbin of a cubin for `arch` (sm_90); anything else (PTX) as it came."""
        if not binary.startswith(ELF):
            return binary
        lib, handle = self.lib, ctypes.c_void_p()
        options = (ctypes.c_char_p * len(self.OPTIONS))(*[o.encode() for o in self.OPTIONS])
        _check(lib.nvFatbinCreate(ctypes.byref(handle), options, len(self.OPTIONS)), "nvFatbinCreate")
        try:
            _check(lib.nvFatbinAddCubin(handle, binary, len(binary), arch.removeprefix("sm_").encode(), b"mlxspec"),
                   "nvFatbinAddCubin")
            size = ctypes.c_size_t()
            _check(lib.nvFatbinSize(handle, ctypes.byref(size)), "nvFatbinSize")
            image = ctypes.create_string_buffer(size.value)
            _check(lib.nvFatbinGet(handle, image), "nvFatbinGet")
            return image.raw
        finally:
            lib.nvFatbinDestroy(ctypes.byref(handle))


def _check(result: int, what: str) -> None:
    if result != 0:
        raise KernelUnavailable(f"{what} failed: nvFatbin error {result}")

