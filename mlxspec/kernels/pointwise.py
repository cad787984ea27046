"""RMSNorm, RoPE, SwiGLU and GeGLU on the CPU in one pass each: the per-token ops between the matmuls.

MLX's CPU backend builds these from generic ops (rope ~50 us a call, sigmoid ~10 ns an element):
with the matmul kernels on, they were half of a SmolLM2 forward, and SwiGLU grew 6x from one row
to eight. cpu/pointwise.cpp computes each as MLX defines it (mlx/fast.cpp's fallbacks, mlx-lm's
swiglu) in one pass per row.

    report = use_pointwise_kernels(model)   # swap nn.RMSNorm / nn.RoPE modules, route mlx-lm's swiglu
    restore_pointwise(model)                # MLX's own ops again

A call goes to the kernel only on the CPU device, for a signature (op, dtype, sizes) that passed
its self-check against MLX's op in this process; anything else (an array offset for batched
caches, a failed check, a GPU) runs MLX's op unchanged. Everything is per model: norm and rope
modules are swapped (gemma's norms, weight stored as w - 1, with 1.0 + w), the model's MLP modules
are routed to kernel_swiglu (hooks.py), and gemma2/3's MLP instances get a class whose call runs
kernel_geglu, so other models in the process (mlx-lm's own too) keep MLX's ops.
"""

from __future__ import annotations


import mlx.core as mx
import mlx.nn as nn
import numpy as np

from . import registry
from .build import KernelUnavailable, load_cpu_extension
from .hooks import route_functions, unroute_functions

# |kernel - MLX| <= TOL * max|MLX| (MLX rounds some intermediates to the dtype, the kernel does not)
TOL = {mx.float32: 2.0**-20, mx.float16: 2.0**-9, mx.bfloat16: 2.0**-6}

def _load_pointwise(backend: str):
    if backend != "cpu":
        raise KernelUnavailable(f"RMSNorm/RoPE/SwiGLU kernels are CPU-only ({backend}: MLX's ops are row-invariant there)")
    return load_cpu_extension(), "rms_norm, rope, swiglu, geglu"


registry.register("pointwise", _load_pointwise)


def _record() -> registry.KernelRecord:
    return registry.kernel("pointwise", "cpu")


def _ext():
    rec = _record()
    return None if rec.error else rec.fn


def mlx_lm_swiglu():
    import mlx_lm.models.activations as activations

    return activations.swiglu


def _close(y: mx.array, ref: mx.array) -> bool:
    y32, r32 = y.astype(mx.float32), ref.astype(mx.float32)
    bound = TOL[ref.dtype] * mx.abs(r32).max() + 1e-30
    return y.dtype == ref.dtype and y.shape == ref.shape and bool((mx.abs(y32 - r32) <= bound).all().item())


def _rows_independent(fn, x: mx.array, *rest) -> bool:
    """Row i of a call on rows (..., M, D) equals the call on that row alone (what greedy verify needs);
    arguments shaped like x are sliced with it."""
    full = fn(x, *rest)

    def row(i):
        args = [a[..., i : i + 1, :] if a.shape == x.shape else a for a in (x, *rest)]
        return fn(*args)[..., 0, :]

    return all(mx.array_equal(row(i), full[..., i, :]).item() for i in (0, x.shape[-2] - 1))


def _check(signature: tuple, run) -> bool:
    """Run the self-check of `signature` once per process; True if the kernel may answer it."""
    return _record().check(signature, run) is None


def _usable(*arrays: mx.array) -> bool:
    return _ext() is not None and mx.default_device().type == mx.cpu and all(a.dtype in TOL for a in arrays)


def _random(shape, dtype, seed: int) -> mx.array:
    """A strided view (not contiguous), as the model hands these ops transposed projections."""
    big = mx.random.normal((*shape[:-1], shape[-1] + 3), key=mx.random.key(seed)) * 3
    return big[..., 1 : shape[-1] + 1].astype(dtype)


# ---------------------------------------------------------------- RMSNorm


class KernelRMSNorm(nn.RMSNorm):
    """nn.RMSNorm through the kernel (same weight, same eps)."""

    @classmethod
    def wrap(cls, layer: nn.RMSNorm) -> "KernelRMSNorm":
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.weight, new.eps = layer.weight, layer.eps
        return new

    def norm_weight(self) -> mx.array:
        return self["weight"]

    def __call__(self, x: mx.array) -> mx.array:
        w = self.norm_weight()
        sig = ("rms_norm", x.shape[-1], str(x.dtype), str(w.dtype), self.eps)
        if _usable(x, w) and _check(sig, lambda: _check_rms_norm(w, self.eps, x.dtype)):
            return _ext().rms_norm(x, w, self.eps, stream=mx.cpu)
        return mx.fast.rms_norm(x, w, self.eps)


# mlx-lm's gemma-family norms: the weight is stored as w - 1 and each call norms with 1.0 + weight
OFFSET_NORMS = {("mlx_lm.models.gemma", "RMSNorm"), ("mlx_lm.models.gemma2", "RMSNorm"),
                ("mlx_lm.models.gemma3_text", "RMSNorm")}


def _offset_norm(m: nn.Module) -> bool:
    return (type(m).__module__, type(m).__name__) in OFFSET_NORMS


class KernelOffsetRMSNorm(KernelRMSNorm):
    """A gemma-family norm through the kernel. 1.0 + weight is computed once, in the weight's dtype
    as the module computes it at every call (the same values), and kept out of the parameters; on
    the CPU the module's own call is ~10 graph nodes (mx.fast.rms_norm's fallback ops and the add)."""

    @classmethod
    def wrap(cls, layer: nn.Module) -> "KernelOffsetRMSNorm":
        new = super().wrap(layer)
        object.__setattr__(new, "_origin", layer)  # not a child module
        new._offset_weight = 1.0 + layer.weight  # "_": not a parameter
        mx.eval(new._offset_weight)
        return new

    def norm_weight(self) -> mx.array:
        return self._offset_weight


def _check_rms_norm(w: mx.array, eps: float, dtype) -> str | None:
    x = _random((2, 5, w.shape[0]), dtype, 1)
    w = w * (1 + 0.5 * mx.random.normal(w.shape, key=mx.random.key(2)).astype(w.dtype))
    kernel = lambda v, w: _ext().rms_norm(v, w, eps, stream=mx.cpu)  # noqa: E731
    if not _close(kernel(x, w), mx.fast.rms_norm(x, w, eps)):
        return "disagrees with mx.fast.rms_norm"
    return None if _rows_independent(kernel, x, w) else "rows depend on the row count"


# ---------------------------------------------------------------- RoPE


def inverse_frequencies(dims: int, base: float) -> mx.array:
    """exp(-i log(base) / (dims/2)) for i < dims/2, computed as mx.fast.rope's fallback does (fp32)."""
    half = dims // 2
    step = np.float32(np.log(np.float32(base))) / np.float32(half)
    return mx.exp(mx.arange(0, -half, -1, dtype=mx.float32) * mx.array(step, dtype=mx.float32))


def _period_rope(m: nn.Module) -> bool:
    """mlx-lm's Llama3RoPE, or a subclass keeping its call: mx.fast.rope over stored periods `_freqs`
    (Llama 3.x's rope scaling; mlxspec's GGUF `rope_freqs` rope is one)."""
    from mlx_lm.models.rope_utils import Llama3RoPE

    return isinstance(m, Llama3RoPE) and type(m).__call__ is Llama3RoPE.__call__


class KernelRoPE(nn.RoPE):
    """nn.RoPE (or a Llama 3 rope: frequencies from stored periods) through the kernel for integer
    offsets (a KV cache's) and one-number array offsets (a compiled step's position, step_graph.py);
    batched array offsets keep MLX's op."""

    @classmethod
    def wrap(cls, layer: nn.Module) -> "KernelRoPE":
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.dims, new.traditional = layer.dims, layer.traditional
        # a period rope is given back by restore_pointwise (a plain attribute: not a child module)
        object.__setattr__(new, "_origin", None if type(layer) is nn.RoPE else layer)
        if new._origin is None:
            new.base, new.scale, new._freqs = layer.base, layer.scale, None
            new._inv_freq = inverse_frequencies(layer.dims, layer.base)
        else:
            new.base, new.scale, new._freqs = None, 1.0, layer._freqs.astype(mx.float32)
            new._inv_freq = mx.reciprocal(new._freqs)  # theta_i = position / period_i
        mx.eval(new._inv_freq)
        new._key = new.base if new._freqs is None else hash(tuple(new._freqs.tolist()))  # what a self-check covers
        return new

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        sig = ("rope", x.shape[-1], self.dims, self.traditional, self._key, self.scale, str(x.dtype))
        one = isinstance(offset, int) or (isinstance(offset, mx.array) and offset.size == 1)
        if one and x.ndim >= 3 and _usable(x) and _check(sig, lambda: self._self_check(x)):
            return self._kernel(x, offset)
        return self._mlx(x, offset)

    def _mlx(self, x: mx.array, offset) -> mx.array:
        """MLX's op, as the wrapped module calls it."""
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=self.base, scale=self.scale,
                            offset=offset, freqs=self._freqs)

    def _kernel(self, x: mx.array, offset: int | mx.array) -> mx.array:
        if isinstance(offset, mx.array):  # read when the step runs
            return _ext().rope(x, self._inv_freq, self.dims, self.traditional, self.scale, 0, position=offset,
                               stream=mx.cpu)
        return _ext().rope(x, self._inv_freq, self.dims, self.traditional, self.scale, offset, stream=mx.cpu)

    def _self_check(self, like: mx.array) -> str | None:
        x = _random((1, 3, 6, like.shape[-1]), like.dtype, 3)
        for offset in (0, 37, 4099):
            ref = self._mlx(x, offset)
            if not _close(self._kernel(x, offset), ref):
                return f"disagrees with mx.fast.rope at offset {offset}"
        # row i of a call at offset o = a one-row call at offset o + i
        full = self._kernel(x, 37)
        for i in (0, 5):
            if not mx.array_equal(self._kernel(x[..., i : i + 1, :], 37 + i)[..., 0, :], full[..., i, :]).item():
                return "rows depend on the row count"
        if not mx.array_equal(self._kernel(x, mx.array(37)), full).item():
            return "an array offset gives other bits than the same integer offset"
        return None


# ---------------------------------------------------------------- SwiGLU


def kernel_swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """mlx-lm's swiglu(gate, x) = silu(gate) * x, through the kernel where it applies."""
    if gate.shape == x.shape and _usable(gate, x):
        sig = ("swiglu", str(gate.dtype), str(x.dtype))
        if _check(sig, lambda: _check_swiglu(gate.dtype, x.dtype)):
            return _ext().swiglu(gate, x, stream=mx.cpu)
    return mlx_lm_swiglu()(gate, x)


def kernel_geglu(gate: mx.array, x: mx.array) -> mx.array:
    """gelu_approx(gate) * x (gemma2/3's MLP), through the kernel where it applies."""
    if _usable(gate, x) and gate.shape == x.shape:
        sig = ("geglu", str(gate.dtype), str(x.dtype))
        if _check(sig, lambda: _check_geglu(gate.dtype, x.dtype)):
            return _ext().geglu(gate, x, stream=mx.cpu)
    return nn.gelu_approx(gate) * x


def _check_geglu(gate_dtype, up_dtype) -> str | None:
    g = mx.concatenate([_random((2, 3, 61), gate_dtype, 5), mx.array([[[-30.0, -9.0, 0.0, 9.0, 30.0]] * 3] * 2,
                                                                       gate_dtype)], axis=-1)  # both tails, 0
    u = _random((2, 3, 66), up_dtype, 6)
    kernel = lambda a, b: _ext().geglu(a, b, stream=mx.cpu)  # noqa: E731
    if not _close(kernel(g, u), nn.gelu_approx(g) * u):
        return "disagrees with nn.gelu_approx(gate) * up"
    return None if _rows_independent(kernel, g, u) else "rows depend on the row count"


# mlx-lm's MLPs computing down_proj(gelu_approx(gate_proj(x)) * up_proj(x)) (gemma 1's uses the erf GELU)
GEGLU_MLPS = {("mlx_lm.models.gemma2", "MLP"), ("mlx_lm.models.gemma3_text", "MLP")}
_GEGLU_FROM = "_mlxspec_geglu_from"  # class attribute of a swapped MLP class: the class it wraps
_geglu_classes: dict[type, type] = {}


def _geglu_call(self, x: mx.array) -> mx.array:
    return self.down_proj(kernel_geglu(self.gate_proj(x), self.up_proj(x)))


def geglu_swapped(m: nn.Module) -> bool:
    return hasattr(type(m), _GEGLU_FROM)


def _geglu_class(base: type) -> type:
    if base not in _geglu_classes:
        _geglu_classes[base] = type(base.__name__, (base,), {_GEGLU_FROM: base, "__module__": base.__module__,
                                                             "__call__": _geglu_call})
    return _geglu_classes[base]


def _check_swiglu(gate_dtype, up_dtype) -> str | None:
    g = _random((2, 5, 96), gate_dtype, 4) * 4  # silu's both tails: large |g| too
    u = _random((2, 5, 96), up_dtype, 5)
    kernel = lambda a, b: _ext().swiglu(a, b, stream=mx.cpu)  # noqa: E731
    if not _close(kernel(g, u), mlx_lm_swiglu()(g, u)):
        return "disagrees with mlx-lm's swiglu"
    return None if _rows_independent(kernel, g, u) else "rows depend on the row count"


# ---------------------------------------------------------------- install / restore


def use_pointwise_kernels(model: nn.Module) -> dict:
    """Swap the model's nn.RMSNorm (and gemma-family norms), nn.RoPE (and Llama 3 rope) modules, route
    its MLP modules' swiglu, and give gemma2/3's MLPs the geglu kernel."""
    from .layers import _set_module

    report = {"kernel": "pointwise", "swapped": {"rms_norm": 0, "rope": 0}, "swiglu": 0, "geglu": 0, "error": None}
    if _ext() is None:
        report["error"] = _record().error
        registry.warn_once(f"mlxspec cpu pointwise kernels unavailable: {report['error'].splitlines()[0]}", "MLX's ops")
        return report
    def swap(m: nn.Module):
        if type(m) is nn.RMSNorm:
            return KernelRMSNorm.wrap(m), "rms_norm"
        return (KernelOffsetRMSNorm.wrap(m), "rms_norm") if _offset_norm(m) else (KernelRoPE.wrap(m), "rope")

    swaps = [(p, *swap(m)) for p, m in model.named_modules()
             if type(m) in (nn.RMSNorm, nn.RoPE) or _period_rope(m) or _offset_norm(m)]
    for path, module, kind in swaps:
        _set_module(model, path, module)
        report["swapped"][kind] += 1
    report["swiglu"] = route_functions(model, {"swiglu": (mlx_lm_swiglu(), kernel_swiglu)})
    for _, m in model.named_modules():  # gemma2/3: one geglu op in place of gelu_approx and the product
        if (type(m).__module__, type(m).__name__) in GEGLU_MLPS and not geglu_swapped(m):
            m.__class__ = _geglu_class(type(m))
            report["geglu"] += 1
    return report


def restore_pointwise(model: nn.Module) -> None:
    """MLX's ops again in this model: mlx-lm's swiglu and the original norm and rope modules."""
    from .layers import _set_module

    unroute_functions(model, ["swiglu"])
    for path, m in list(model.named_modules()):
        if geglu_swapped(m):
            m.__class__ = getattr(type(m), _GEGLU_FROM)
        if isinstance(m, KernelOffsetRMSNorm):
            _set_module(model, path, m._origin)
        elif isinstance(m, KernelRMSNorm):
            plain = nn.RMSNorm(m.weight.shape[0], eps=m.eps)
            plain.weight = m.weight
            _set_module(model, path, plain)
        elif isinstance(m, KernelRoPE):
            _set_module(model, path, m._origin or nn.RoPE(m.dims, traditional=m.traditional, base=m.base, scale=m.scale))


def check_typical(dims: int = 576, head_dim: int = 64, dtype=mx.float32) -> None:
    """Self-check each op on one typical signature now (for `mlxspec doctor`); results in pointwise_status()."""
    if _ext() is None:
        return
    x = _random((1, 2, dims), dtype, 8)
    KernelRMSNorm.wrap(nn.RMSNorm(dims))(x)
    KernelRoPE.wrap(nn.RoPE(head_dim, traditional=False, base=10000.0))(_random((1, 2, 3, head_dim), dtype, 9), offset=3)
    kernel_swiglu(x, x)


def pointwise_status() -> dict:
    return _record().status()
