"""Fused acceptance: one kernel per round turns target rows + drafts into [n, next] (source: accept_source.py).

    n, nxt = fused_greedy_accept(logits, drafts)         # drop-in for verify.greedy_accept
    n, nxt = fused_rejection_accept(p, drafts, q, key)   # drop-in for verify.rejection_accept

Both return lazy mx arrays like verify.py's functions. The kernel runs only on a GPU device (Metal or
CUDA through mx.fast) where it passed its self-check (accept_check.py) in this process; otherwise
these are verify.py's functions. No CPU kernel: there the pure-MLX ops cost about 0.23 ms (greedy)
and 1.2 ms (sampling) per round against 20-60 ms forwards, so there is nothing to win.

Rejection sampling uses the same uniforms as the reference for acceptance (so n is identical for the
same key) and draws next by inverse CDF with one more uniform from the reference's draw key, instead
of Gumbel-max: the same distribution, not the same token.
"""

from __future__ import annotations

from typing import Callable

import mlx.core as mx

from ..verify import _match_vocab, greedy_accept, rejection_accept  # _match_vocab: q as the reference pads it
from . import accept_source as src
from .accept_check import self_check
from .build import KernelUnavailable
from . import registry
from .registry import device_backend_name


def _load_accept(backend: str):
    if backend == "cpu":
        raise KernelUnavailable("CPU: the MLX ops already cost ~1 ms a round; no kernel")
    return _kernels(backend), f"mx.fast.{backend}_kernel"


registry.register("accept", _load_accept)


def _record(device: mx.Device | None = None) -> registry.KernelRecord:
    return registry.kernel("accept", device_backend_name(device))


def fused_accept_available(device: mx.Device | None = None) -> bool:
    """True if the fused kernels are built and passed their self-check on this device (checked once)."""
    rec = _record(device)
    return rec.check(("greedy+rejection",), lambda: self_check(*rec.fn)) is None


def fused_greedy_accept(logits: mx.array, drafts: mx.array) -> tuple[mx.array, mx.array]:
    """verify.greedy_accept, in one launch where the kernel is proven: the same (n, next), bit for bit."""
    if logits.ndim != 2 or logits.shape[0] != drafts.shape[0] + 1 or not fused_accept_available():
        return greedy_accept(logits, drafts)
    out = _record().fn[0](logits, drafts)
    return out[0], out[1].astype(mx.uint32)


def fused_rejection_accept(
    p: mx.array, drafts: mx.array, q: mx.array | None, key: mx.array
) -> tuple[mx.array, mx.array]:
    """verify.rejection_accept, in one launch where proven: the same n for the same key, next equally distributed."""
    k = drafts.shape[0]
    if p.ndim != 2 or p.shape[0] != k + 1 or not fused_accept_available():
        return rejection_accept(p, drafts, q, key)
    u = round_uniforms(key, k)
    if q is None:  # deterministic drafter: one-hot rows, as the reference builds them
        q = mx.put_along_axis(mx.zeros((k, p.shape[-1]), p.dtype), drafts.astype(mx.int32)[:, None],
                              mx.array(1.0, p.dtype), axis=-1)
    elif q.shape[-1] != p.shape[-1]:
        q = _match_vocab(q, p.shape[-1])
    out = _record().fn[1](p, q.astype(p.dtype), drafts, u)
    return out[0], out[1].astype(mx.uint32)


def round_uniforms(key: mx.array, k: int) -> mx.array:
    """(k+1,) uniforms: k for acceptance exactly as verify.rejection_accept draws them, one for the draw."""
    accept_key, draw_key = mx.random.split(key)
    return mx.concatenate([mx.random.uniform(shape=(k,), key=accept_key), mx.random.uniform(shape=(1,), key=draw_key)])


def _kernels(name: str, cuda_maker: Callable | None = None) -> tuple[Callable, Callable]:
    """(greedy, rejection) raw calls of the device's JIT kernels; KernelUnavailable where there is no such GPU.
    cuda_maker: mx.fast.cuda_kernel's stand-in for CUDA (benchmarks/prebuild_store.py: compile only, no GPU)."""
    if name == "metal" and mx.metal.is_available():
        make = lambda kind: mx.fast.metal_kernel(  # noqa: E731
            name=src.NAMES[kind], input_names=src.INPUTS[kind], output_names=src.OUTPUTS,
            source=src.metal_body(kind), header=src.METAL_HEADER)
    elif name == "cuda" and (cuda_maker is not None or hasattr(mx, "cuda") and mx.cuda.is_available()):
        from .cuda_cache import cuda_kernel

        make = lambda kind: (cuda_maker or cuda_kernel)(  # noqa: E731
            name=src.NAMES[kind], input_names=src.INPUTS[kind], output_names=src.OUTPUTS,
            source=src.cuda_body(kind), header=src.CUDA_HEADER)
    else:
        raise KernelUnavailable(f"no {name} device")
    return _greedy_call(make(src.GREEDY)), _rejection_call(make(src.REJECTION))


def _launch(kernel, inputs: list[mx.array], dtype) -> mx.array:
    return kernel(inputs=inputs, template=[("T", dtype)], grid=src.GRID, threadgroup=src.THREADGROUP,
                  output_shapes=[(2,)], output_dtypes=[mx.int32])[0]


def _greedy_call(kernel) -> Callable[[mx.array, mx.array], mx.array]:
    def greedy(logits: mx.array, drafts: mx.array) -> mx.array:
        d = drafts.astype(mx.uint32) if drafts.size else mx.zeros((1,), mx.uint32)  # k = 0: never read
        return _launch(kernel, [logits, d], logits.dtype)

    return greedy


def _rejection_call(kernel) -> Callable[..., mx.array]:
    def rejection(p: mx.array, q: mx.array, drafts: mx.array, u: mx.array) -> mx.array:
        if drafts.size == 0:  # k = 0: q and drafts are never read, but a launch wants real buffers
            q, drafts = mx.zeros((1, p.shape[-1]), p.dtype), mx.zeros((1,), mx.uint32)
        return _launch(kernel, [p, q, drafts.astype(mx.uint32), u.astype(mx.float32)], p.dtype)

    return rejection
