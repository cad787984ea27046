"""The gated delta rule of Qwen3.5 / Qwen3-Next on the CPU in one pass over the state a token (cpu/delta.cpp).

mlx-lm's gated_delta_update runs a Metal kernel on Apple GPUs and, on the CPU, five ops per token, each
a pass over the (value heads x 128 x 128) float32 state: with the matmul kernels on, those passes and
the layer's short conv (MLX's grouped conv) were most of a Qwen3.5-0.8B-shaped decoding step
(benchmarks/results/step.md). The kernel reads and writes each state row once a token, the tokens of
a call in order, so a verify pass's rows equal one-row steps bit for bit; the conv (KernelCausalConv)
adds each output's taps in order, likewise the same for any row count.

    report = use_delta_kernel(model)   # route the model's gated_delta_update calls (hooks.py), swap their convs
    restore_delta(model)

A call goes to the kernel on the CPU device, for float32 inputs without a mask (one sequence), at head
sizes that passed the self-check against mlx-lm's ops in this process; anything else runs mlx-lm's.
On GPUs mlx-lm's own kernel runs the recurrence (its tokens in order); the conv (registry family "conv")
is then the taps in order as MLX elementwise ops in float32, since MLX's GPU convolutions may pick their
algorithm by the input's length, so that a verify pass's rows could differ from one-row steps.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from . import registry
from .build import KernelUnavailable, load_cpu_extension
from .hooks import route_functions, unroute_functions

NAME = "gated_delta_update"
TOL = 2.0**-18  # |kernel - mlx-lm| <= TOL * max|mlx-lm|: sums of the same products, in another order


def _load(backend: str):
    if backend != "cpu":
        raise KernelUnavailable(f"the gated delta kernel is CPU-only ({backend}: mlx-lm has its own GPU kernel)")
    return load_cpu_extension(), "gated_delta"


registry.register("delta", _load)


def _record() -> registry.KernelRecord:
    return registry.kernel("delta", "cpu")


def mlx_lm_gated_delta_update():
    from mlx_lm.models import gated_delta

    return gated_delta.gated_delta_update


def kernel_gated_delta_update(q, k, v, a, b, A_log, dt_bias, state=None, mask=None, *, use_kernel=True,
                              lower_bound=None, allow_neg_eigval=False):
    """mlx-lm's gated_delta_update (same arguments, same result up to summation order), through the kernel
    where it applies."""
    arrays = (q, k, v, a, b) + (() if state is None else (state,))
    usable = (mask is None and lower_bound is None and not allow_neg_eigval and mx.default_device().type == mx.cpu
              and a.shape == b.shape == v.shape[:3]  # a decay per head (Kimi Linear's is per channel: mlx-lm's ops)
              and all(x.dtype == mx.float32 for x in arrays) and _record().error is None)
    if usable:
        sizes = (q.shape[-2], v.shape[-2], q.shape[-1], v.shape[-1])
        usable = _record().check(("gated_delta", *sizes), lambda: _self_check(*sizes)) is None
    if not usable:
        return mlx_lm_gated_delta_update()(q, k, v, a, b, A_log, dt_bias, state, mask, use_kernel=use_kernel,
                                           lower_bound=lower_bound, allow_neg_eigval=allow_neg_eigval)
    if state is None:
        state = mx.zeros((q.shape[0], *v.shape[-2:], q.shape[-1]), dtype=mx.float32)  # (B, Hv, Dv, Dk), as mlx-lm
    return _kernel(q, k, v, a, b, A_log, dt_bias, state)


def _self_check(Hk: int, Hv: int, Dk: int, Dv: int) -> str | None:
    """Against mlx-lm's ops over 5 tokens (decays and corrections of every size), and token by token."""
    keys = mx.random.split(mx.random.key(11), 8)
    q, k = (mx.random.normal((1, 5, Hk, Dk), key=keys[i]) * Dk**-0.5 for i in (0, 1))
    v = mx.random.normal((1, 5, Hv, Dv), key=keys[2])
    a, b = mx.random.normal((1, 5, Hv), key=keys[3]), mx.random.normal((1, 5, Hv), key=keys[4])
    A_log, dt = mx.random.uniform(-1.0, 1.0, (Hv,), key=keys[5]), mx.random.normal((Hv,), key=keys[6])
    state = mx.random.normal((1, Hv, Dv, Dk), key=keys[7])
    y, s = _kernel(q, k, v, a, b, A_log, dt, state)
    from mlx_lm.models.gated_delta import compute_g, gated_delta_ops

    y_ref, s_ref = gated_delta_ops(q, k, v, compute_g(A_log, a, dt), mx.sigmoid(b), state)
    if not (_close(y, y_ref) and _close(s, s_ref)):
        return "disagrees with mlx-lm's gated_delta_ops"
    ys, s1 = [], state
    for t in range(5):
        yt, s1 = _kernel(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], a[:, t : t + 1], b[:, t : t + 1], A_log, dt, s1)
        ys.append(yt)
    if not (mx.array_equal(mx.concatenate(ys, axis=1), y).item() and mx.array_equal(s1, s).item()):
        return "a call's tokens differ from one-token calls"
    return None


def _close(got: mx.array, ref: mx.array) -> bool:
    return got.shape == ref.shape and bool((mx.abs(got - ref) <= TOL * mx.abs(ref).max()).all().item())


def _kernel(q, k, v, a, b, A_log, dt_bias, state):
    """(y, state) through the kernel: the decay g and the correction weight beta computed as mlx-lm does."""
    from mlx_lm.models.gated_delta import compute_g

    g, beta = compute_g(A_log, a, dt_bias), mx.sigmoid(b)  # (B, T, Hv) each
    return tuple(_record().fn.gated_delta(*(mx.contiguous(x) for x in (q, k, v, g, beta, state)), stream=mx.cpu))


def _load_conv(backend: str):
    if backend == "cpu":
        ext = load_cpu_extension()
        return (lambda x, w: ext.causal_conv(mx.contiguous(x), mx.contiguous(w[..., 0]), stream=mx.cpu)), "causal_conv"
    return taps_conv, "taps in order (MLX elementwise ops, float32)"


registry.register("conv", _load_conv)


def taps_conv(x: mx.array, weight: mx.array) -> mx.array:
    """(B, T + K - 1, C) through a depthwise (C, K, 1) kernel -> (B, T, C): each output its K taps added in
    order, in float32: elementwise ops only, so an output's arithmetic never depends on T."""
    taps, rows = weight.shape[1], x.shape[1] - weight.shape[1] + 1
    x32, w32 = x.astype(mx.float32), weight[..., 0].astype(mx.float32)  # (C, K)
    y = x32[:, :rows] * w32[:, 0]
    for j in range(1, taps):
        y = y + x32[:, j : j + rows] * w32[:, j]
    return y.astype(x.dtype)


class KernelCausalConv(nn.Module):
    """A depthwise nn.Conv1d without padding (delta-net layers, Mamba mixers, LFM2's short convs...; a bias added
    after, as nn.Conv1d adds it) through the "conv" family: the CPU kernel (float32), or on GPUs the taps
    in order; MLX's conv where its check failed."""

    def __init__(self, weight: mx.array, bias: mx.array | None = None):
        super().__init__()
        self.weight = weight
        if bias is not None:
            self.bias = bias

    def __call__(self, x: mx.array) -> mx.array:
        channels, taps = self.weight.shape[:2]
        rec = registry.kernel("conv")
        usable = rec.error is None and (rec.backend != "cpu" or x.dtype == self.weight.dtype == mx.float32)
        signature = ("causal_conv", channels, taps, str(x.dtype))
        if usable and rec.check(signature, lambda: _check_conv(rec.fn, channels, taps, x.dtype)) is None:
            y = rec.fn(x, self.weight)
        else:
            y = mx.conv1d(x, self.weight, groups=channels)
        return y + self["bias"] if "bias" in self else y


def _check_conv(conv, channels: int, taps: int, dtype: mx.Dtype) -> str | None:
    """Against the float32 grouped conv (reference.conv_reference, on the CPU) over 6 rows (within a
    rounding of `dtype`), and row by row."""
    from .reference import conv_reference

    keys = mx.random.split(mx.random.key(12), 2)
    x = mx.random.normal((2, 6 + taps - 1, channels), key=keys[0]).astype(dtype)
    w = mx.random.normal((channels, taps, 1), key=keys[1]).astype(dtype)
    y, ref = conv(x, w), conv_reference(x, w)
    tolerance = TOL if dtype == mx.float32 else 2.0**-7  # half types: a rounding of the output
    if not (y.shape == ref.shape and bool((mx.abs(y - ref) <= tolerance * mx.abs(ref).max()).all().item())):
        return "disagrees with the float32 conv1d"
    rows = mx.concatenate([conv(x[:, t : t + taps], w) for t in range(6)], axis=1)
    return None if mx.array_equal(rows, y).item() else "rows depend on the row count"


def _depthwise(m: nn.Module) -> bool:
    w = getattr(m, "weight", None) if type(m) is nn.Conv1d else None
    return (w is not None and w.ndim == 3 and w.shape[2] == 1 and m.groups == w.shape[0]
            and m.padding == 0 and m.stride == 1 and m.dilation == 1)


def use_delta_kernel(model: nn.Module) -> dict:
    """Route the model's gated_delta_update calls (Qwen3.5's and Qwen3-Next's GatedDeltaNet) to the kernel
    (on the CPU), and swap every depthwise causal conv of the model for KernelCausalConv (on any device)."""
    on_cpu = registry.device_backend_name() == "cpu"
    error = _record().error if on_cpu else "CPU-only: mlx-lm's own kernel runs the recurrence here"
    report = {"kernel": "delta", "routed": 0, "convs": 0, "error": error}
    if error is None:
        report["routed"] = route_functions(model, {NAME: (mlx_lm_gated_delta_update(), kernel_gated_delta_update)})
    for _, m in model.named_modules():  # delta nets, Mamba mixers, LFM2's short convs, PLaMo 2's, Jamba's
        for name, child in list(m.children().items()):
            if _depthwise(child):
                setattr(m, name, KernelCausalConv(child.weight, child.get("bias")))
                report["convs"] += 1
    return report


def restore_delta(model: nn.Module) -> None:
    for _, m in model.named_modules():
        for name, child in list(m.children().items()):
            if isinstance(child, KernelCausalConv):
                w, bias = child.weight, child.get("bias")
                conv = nn.Conv1d(w.shape[0], w.shape[0], w.shape[1], groups=w.shape[0], bias=bias is not None)
                conv.weight = w
                if bias is not None:
                    conv.bias = bias
                setattr(m, name, conv)
    unroute_functions(model, [NAME])
