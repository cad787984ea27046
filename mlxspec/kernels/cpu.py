"""The CPU kernel: MLX extension built from cpu/ on first use (see build.py).

    qmm = cpu_qmm_function()            # raises KernelUnavailable (with the reason) if it cannot
    y = qmm(x, w, scales, biases, group_size=32, bits=4)      # x (..., K) -> (..., N)
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from .build import KernelUnavailable, load_cpu_extension

SUPPORTED_BITS = (4, 8)
ISA_NAMES = {0: "generic", 1: "avx512", 2: "avx2", 3: "neon"}


ACTIVATIONS = ("f32", "q8")  # what the CPU matmuls multiply the weights by
ACTIVATION_SETTINGS = ("auto", *ACTIVATIONS)  # Engine.load(activations=...) / MLXSPEC_ACTIVATIONS


def cpu_qmm_function(isa: int = -1, activations: str = "f32") -> Callable[..., mx.array]:
    """The kernel as a function of (x, w, scales, biases, group_size, bits); isa=-1 picks the best.

    activations='q8': x is rounded to int8 per 32-element block and multiplied by the codes in
    integer dot products (qmm_q8_kernel.h, llama.cpp's arithmetic), else x is used in fp32.
    mode='mxfp4' (gpt-oss; q8 only): e2m1 codes with their uint8 exponents (biases unused).
    pack > 1 (q8 only): w's codes are packed in groups of that many columns; bias_of_scale != 0 (q8
    only): biases are that times the scales, and not read (packing.py)."""
    ext = load_cpu_extension()
    if isa >= 0 and not ext.isa_compiled(isa):
        raise KernelUnavailable(f"the {ISA_NAMES.get(isa, isa)} path is not compiled in on this CPU")
    q8 = activations == "q8"

    def qmm(x: mx.array, w: mx.array, scales: mx.array, biases: mx.array | None, group_size: int, bits: int,
            mode: str = "affine", pack: int = 1, bias_of_scale: float = 0.0) -> mx.array:
        scales, biases, e2m1 = _layout(scales, biases, mode, q8)
        return ext.qmm(x, w, scales, biases, group_size, bits, isa, q8=q8, e2m1=e2m1, pack=pack,
                       bias_of_scale=bias_of_scale, stream=mx.cpu)

    qmm.isa = ISA_NAMES.get(ext.best_isa() if isa < 0 else isa, str(isa))
    qmm.activations = activations
    return qmm


def cpu_gather_qmm_function(isa: int = -1, activations: str = "f32") -> Callable[..., mx.array]:
    """The kernel for mixture-of-experts layers: (x (P, K), w (E, N, .), scales, biases, indices (P,),
    group_size, bits, mode) -> (P, N), row p times expert indices[p], each row as a one-row qmm computes it."""
    ext = load_cpu_extension()
    if isa >= 0 and not ext.isa_compiled(isa):
        raise KernelUnavailable(f"the {ISA_NAMES.get(isa, isa)} path is not compiled in on this CPU")
    q8 = activations == "q8"

    def gather_qmm(x, w, scales, biases, indices, group_size: int, bits: int, mode: str = "affine") -> mx.array:
        scales, biases, e2m1 = _layout(scales, biases, mode, q8)
        indices = mx.contiguous(indices)  # a view (Kimi Linear's top-k is a slice): the kernel reads it packed
        return ext.gather_qmm(x, w, scales, biases, indices, group_size, bits, isa, q8=q8, e2m1=e2m1, stream=mx.cpu)

    return gather_qmm


def _layout(scales: mx.array, biases: mx.array | None, mode: str, q8: bool) -> tuple:
    """(scales, biases, e2m1) as the extension takes them: mxfp4 (int8 activations only) passes its
    uint8 exponents, which the kernel reads in place (no float copy), as both."""
    if mode == "affine":
        return scales, biases, False
    if mode != "mxfp4" or not q8:
        raise ValueError(f"the CPU kernel takes mode {mode!r} only with int8 activations ('mxfp4' with q8)")
    return scales, scales, True


def q8_path() -> str:
    """The int8-activation path this CPU runs: 'avx512-vnni', 'avx2' or 'portable' (a lane-by-lane
    emulation: exact, slow); 'unavailable' without the extension."""
    try:
        return str(load_cpu_extension().q8_path())
    except KernelUnavailable:
        return "unavailable"


def q8_fast() -> bool:
    """Do int8 activations run on AVX-512 VNNI dot products here (where they beat fp32: measured)?"""
    return q8_path() == "avx512-vnni"


def cpu_supports(group_size: int, bits: int) -> str | None:
    """None when the CPU kernel handles this layout, else why not."""
    if bits not in SUPPORTED_BITS:
        return f"{bits}-bit weights (the CPU kernel does 4 and 8)"
    if group_size % 32:
        return f"group size {group_size} (the CPU kernel needs a multiple of 32)"
    return None


def cpu_sdpa_function(isa: int = -1) -> Callable[..., mx.array]:
    """Few-row attention: (q (B, H, M, D), k, v (B, KV, T, D), scale, causal, window=0, sinks=None, length=None,
    softcap=0) -> (B, H, M, Dv); window > 0: causal rows see only their last `window` keys (a sliding-window
    layer); sinks (H,): one extra logit per head in each row's softmax, with no value (gpt-oss); softcap > 0:
    scores capped as Gemma 2 caps them."""
    ext = load_cpu_extension()
    if isa >= 0 and not ext.isa_compiled(isa):
        raise KernelUnavailable(f"the {ISA_NAMES.get(isa, isa)} path is not compiled in on this CPU")

    def sdpa(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool, window: int = 0,
             sinks: mx.array | None = None, length: mx.array | None = None, softcap: float = 0.0) -> mx.array:
        if sinks is not None:
            sinks = mx.contiguous(sinks.astype(mx.float32))
        return ext.sdpa(q, k, v, scale, causal, isa, window=window, sinks=sinks, length=length, softcap=softcap,
                        stream=mx.cpu)

    sdpa.isa = ISA_NAMES.get(ext.best_isa() if isa < 0 else isa, str(isa))
    sdpa.windows = sdpa.sinks = sdpa.mixed = True  # takes `window`, gpt-oss's `sinks`, float32 q over a float16 cache
    sdpa.lengths = True  # takes `length`: keys [0, length) of a longer buffer (a compiled step's cache)
    sdpa.softcaps = True  # takes `softcap`: scores capped as softcap * tanh(s / softcap) (Gemma 2)
    return sdpa
