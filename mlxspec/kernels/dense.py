"""Unquantized (fp16/bf16/fp32) linear layers through the few-row dense kernel, on GPUs.

MLX's GPU matmul changes its arithmetic with the row count (an H100 differs at every M >= 2), so an
unquantized target (or an unquantized head) breaks greedy exactness there. The dense kernel
(gpu_source.py) computes each row alike for M = 1..16. On the CPU, MLX's matmul rows are already
equal (measured by mlxspec.exactness), so nothing is swapped there.

    report = use_dense_kernels(model)   # {"swapped": {path: kernel}, "kept": {path: why}}
    restore_dense(model)
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import afm7, talkie

from . import registry
from .build import KernelUnavailable
from .passes import prompt_chunk

CHECK_ROWS = 4


def _load_dense(backend: str):
    if backend == "cpu":
        raise KernelUnavailable("not needed on the CPU: MLX's matmul rows are row-invariant there")
    from . import gpu

    fn = gpu.metal_dense_function() if backend == "metal" else gpu.cuda_dense_function()
    return fn, f"mx.fast.{backend}_kernel"


registry.register("dense", _load_dense)


def self_check(dense, n: int, k: int, dtype) -> str | None:
    """None if `dense` matches the float32 reference and each row of a 4-row call equals its 1-row call."""
    from .reference import dense_within_tolerance

    if hasattr(dense, "prepare"):  # its programs, compiled at once (cuda_cache.py)
        dense.prepare(dtype)
    kw, kx = mx.random.split(mx.random.key(n * 31 + k))
    w = (mx.random.normal((n, k), key=kw) * k**-0.5).astype(dtype)
    x = mx.random.normal((CHECK_ROWS, k), key=kx).astype(dtype)
    y = dense(x, w)
    ok, ratio = dense_within_tolerance(y, x, w)
    if not ok:
        return f"error {ratio:.3g}x the tolerance"
    for i in (0, CHECK_ROWS - 1):
        if not mx.array_equal(dense(x[i : i + 1], w)[0], y[i]).item():
            return f"row {i} of a {CHECK_ROWS}-row call differs from the 1-row call"
    return None


class KernelLinear(nn.Linear):
    """nn.Linear whose matmul is the dense kernel: y = dense(x, weight) (+ bias); prompt chunks MLX's (passes.py)."""

    def __call__(self, x: mx.array) -> mx.array:
        if prompt_chunk(x):
            return super().__call__(x)
        y = self._dense(x, self["weight"])
        return y + self["bias"] if "bias" in self else y


class KernelSplitLinear(afm7.FusedLinear):
    """AFM's FusedLinear (q, k and v as one matrix, its output split at `indices`) through the dense kernel."""

    def __call__(self, x: mx.array) -> mx.array:
        return super().__call__(x) if prompt_chunk(x) else self._dense(x, self["weight"]).split(self.indices, axis=-1)


SPLIT_OUTPUTS = {afm7.FusedLinear: KernelSplitLinear}  # its class -> the kernel's (same parameters, same names)


class KernelEmbedding(nn.Embedding):
    """nn.Embedding: lookups unchanged, `as_linear` (a tied head) through the dense kernel."""

    def as_linear(self, x: mx.array) -> mx.array:
        return super().as_linear(x) if prompt_chunk(x) else self._dense(x, self["weight"])


class KernelHeadTalkie(talkie.Model):
    """Talkie's head is a bare array (`out @ self.lm_head.T`), not a module: its forward, the head through the
    dense kernel (prompt chunks MLX's matmul)."""

    def __call__(self, inputs: mx.array, cache=None, input_embeddings: mx.array | None = None) -> mx.array:
        out = self.model(inputs, cache, input_embeddings)
        return self.lm_head_gain(out @ self.lm_head.T if prompt_chunk(out) else self._dense(out, self.lm_head))


RAW_HEADS = {talkie.Model: (KernelHeadTalkie, "lm_head")}  # model class -> (its kernel class, the head array)


def use_dense_kernels(model: nn.Module) -> dict:
    """Route this model's unquantized linear layers (and a tied unquantized head, or a bare array's: RAW_HEADS)
    through the kernel."""
    from .layers import tied_heads

    report = {"swapped": {}, "kept": {}}
    rec = registry.kernel("dense")
    heads = tied_heads(model)
    for path, m in model.named_modules():
        tied = type(m) is nn.Embedding and path in heads
        raw, split = RAW_HEADS.get(type(m)), SPLIT_OUTPUTS.get(type(m))
        if type(m) is not nn.Linear and not tied and not raw and not split:
            continue
        n, k = m[raw[1]].shape if raw else m["weight"].shape
        dtype = m[raw[1]].dtype if raw else m["weight"].dtype
        failure = rec.check((n, k, str(dtype)), lambda: self_check(rec.fn, n, k, dtype))
        if failure:
            report["kept"][f"{path}.{raw[1]}" if raw else path] = failure
            continue
        m.__class__ = raw[0] if raw else split or (KernelEmbedding if tied else KernelLinear)  # same parameters
        m._dense = rec.fn
        report["swapped"][f"{path}.{raw[1]}".lstrip(".") if raw else path] = rec.name
    return report


def restore_dense(model: nn.Module) -> None:
    for _, m in model.named_modules():
        if isinstance(m, KernelLinear):
            m.__class__ = nn.Linear
        elif isinstance(m, KernelEmbedding):
            m.__class__ = nn.Embedding
        elif type(m) in {kernel for kernel, _ in RAW_HEADS.values()} | set(SPLIT_OUTPUTS.values()):
            m.__class__ = type(m).__mro__[1]
