"""On GPUs: a block's q/k/v projections as one matmul launch, its gate/up projections as another.

    joined = join_projections(model, device)   # after use_kernels: how many groups now launch once
    unjoin_projections(model)                  # each part computes its own rows again

mlx-lm's blocks call q_proj(x), k_proj(x), v_proj(x) on one x (and gate_proj(x), up_proj(x)). The
parts stay modules; their parameters become row slices (views) of one concatenated matrix, and the
first part called with an x computes all their rows in one kernel launch that the others slice
(`SharedProjection`, keyed on that x). A GPU launch costs ~10 us of host work; a llama block then
launches 4 matmuls, not 7. Exactness is unchanged: plain steps and verify rows take the same path,
and a column's arithmetic in the kernels does not depend on the other columns. The joined shape
gets its own kernel check and choice (registry.kernel_for_layer); a group whose parts differ in
layout is left alone.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .layers import KernelQuantizedLinear
from .registry import kernel_for_layer

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class SharedProjection:
    """Several projections' rows in one matrix: y = qmm(x, W).T over all of them, computed once per x."""

    def __init__(self, qmm, weight: mx.array, scales: mx.array, biases: mx.array | None, group_size: int, bits: int,
                 mode: dict, kernel: str = ""):
        self.qmm, self.weight, self.scales, self.biases, self.kernel = qmm, weight, scales, biases, kernel
        self.group_size, self.bits, self.mode = group_size, bits, mode
        self._last = (None, None)  # (x, y): one attribute, so a reader never pairs one call's x with another's y

    def __call__(self, x: mx.array) -> mx.array:
        last_x, y = self._last
        if last_x is not x:  # the first part called with this x: one launch for every part
            y = self.qmm(x, self.weight, self.scales, self.biases, self.group_size, self.bits, **self.mode)
            self._last = (x, y)
        return y


def join_projections(model: nn.Module, device: mx.Device | None = None) -> int:
    """Join each block's q/k/v and gate/up kernel layers (same layout, same input) into one launch each."""
    count = 0
    for _, module in model.named_modules():
        for names in GROUPS:
            parts = [getattr(module, name, None) for name in names]
            if _joinable(parts) and _join(parts, device):
                count += 1
    return count


def unjoin_projections(model: nn.Module) -> None:
    """Each part computes its own rows again (its parameters stay views of the joined matrix)."""
    for _, module in model.named_modules():
        if isinstance(module, KernelQuantizedLinear):
            module._shared = module._rows = None


def _joinable(parts: list) -> bool:
    if not all(type(p) is KernelQuantizedLinear and p._shared is None and p._pack == 1 and not p._bias_of_scale
               for p in parts):
        return False
    first = parts[0]
    layout = (first.group_size, first.bits, first._mode, first["weight"].shape[1], first["scales"].dtype,
              "biases" in first)
    return all((p.group_size, p.bits, p._mode, p["weight"].shape[1], p["scales"].dtype, "biases" in p) == layout
               for p in parts)


def _join(parts: list[KernelQuantizedLinear], device) -> bool:
    first = parts[0]
    keys = ["weight", "scales"] + (["biases"] if "biases" in first else [])
    joined = {key: mx.concatenate([p[key] for p in parts]) for key in keys}
    n, k = joined["weight"].shape[0], first["weight"].shape[1] * 32 // first.bits
    qmm, why = kernel_for_layer(n, k, first.group_size, first.bits, first["scales"].dtype, device,
                                mode=first._mode.get("mode", "affine"))
    if qmm is None:  # the joined shape failed its check here: the parts keep their own launches
        return False
    mx.eval(joined)
    shared = SharedProjection(qmm, joined["weight"], joined["scales"], joined.get("biases"), first.group_size,
                              first.bits, first._mode, why)
    start = 0
    for p in parts:
        rows = p["weight"].shape[0]
        for key in keys:  # views into the joined arrays: the separate copies are freed
            p[key] = joined[key][start : start + rows]
        p._shared, p._rows = shared, slice(start, start + rows)  # (a tuple would register as a child)
        start += rows
    mx.eval([p.parameters() for p in parts])
    return True
