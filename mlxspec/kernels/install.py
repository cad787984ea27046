"""Put every kernel family that applies into one model, or take them all out again: per model.

    report = install_kernels(model)    # {"backend", "layers": {...}, "attention": {...}, "pointwise": {...}}
    remove_kernels(model)              # MLX's ops again in this model (others are untouched)

Quantized layers are swapped (layers.py), on GPUs unquantized ones too (dense.py) and q/k/v and
gate/up projections joined into one launch each (projections.py), attention and
swiglu calls are routed per module (hooks.py), Gemma 2's written-out attention swapped (softcap_attention.py), on GPUs MoE routers
that multiply by a raw weight and unquantized experts run one token at a time (rowwise.py), RMSNorm and RoPE modules swapped (pointwise.py, CPU), the
delta-net layers' recurrence routed (CPU) and their convs swapped (delta.py),
and on the CPU whole blocks then fused into one primitive each (fused_layer.py). Each family uses its kernel only for
signatures that passed their self-check on this device; everything else keeps MLX's op.
"""

from __future__ import annotations

import time

import mlx.core as mx
import mlx.nn as nn

from .latent_attention import restore_latent_rows, use_latent_rows
from .attention import restore_attention, use_attention_kernel
from .delta import restore_delta, use_delta_kernel
from .dense import KernelEmbedding, KernelLinear, restore_dense, use_dense_kernels
from .fused_layer import fused, restore_fused_layers, use_fused_layers
from .layers import restore_layers, use_kernels
from .pointwise import restore_pointwise, use_pointwise_kernels
from .projections import join_projections, unjoin_projections
from .registry import device_backend_name, kernel
from .row_positions import restore_row_positions, use_row_positions
from .rowwise import restore_rowwise_gates, use_rowwise_gates
from .softcap_attention import SoftcapAttention, restore_softcap_attention, use_softcap_attention
from .ssm_steps import restore_ssm_steps, use_ssm_steps


def install_kernels(model: nn.Module, device: mx.Device | None = None, fuse: bool = True,
                    activations: str = "f32", pack: bool = True) -> dict:
    """Swap/route this model's layers to the device's kernels where they proved themselves; on the
    CPU, then fuse each block whose parts all run them into one primitive (fuse=False: keep the ops).
    activations='q8': the CPU matmuls take int8 activations (llama.cpp's arithmetic, kernels/cpu.py),
    over layers laid out for them (packing.py: codes packed, biases implied) unless pack=False
    (benchmarks compare the layouts)."""
    backend = device_backend_name(device)
    layers = use_kernels(model, gpu=True, device=device, activations=activations, pack=pack)
    # MLA layers (DeepSeek-V3, GLM-4.7-Flash) attend row by row on GPUs: swapped before attention is routed in them
    latent_rows = use_latent_rows(model) if backend != "cpu" else 0
    report = {"backend": backend, "layers": layers, "attention": use_attention_kernel(model),
              "ssm_steps": use_ssm_steps(model, gpu=backend != "cpu")}
    if not report["attention"]["error"]:  # Gemma 2's written-out attention, where the kernel takes caps
        report["attention"]["softcapped"] = use_softcap_attention(model, kernel("sdpa", backend).fn)  # Mamba-2 mixers: verify rows one token at a time, on any device
    if backend == "cpu":  # on GPUs MLX's RMSNorm/RoPE are one fused op each, and row-invariant (measured)
        report["pointwise"] = use_pointwise_kernels(model)
        report["delta"] = use_delta_kernel(model)  # gated delta-net layers (Qwen3.5, Qwen3-Next), where there are
        if fuse:
            report["fused"] = use_fused_layers(model)
    else:
        report["pointwise"] = {"kernel": "pointwise", "error": f"not needed on {backend}: MLX's ops are fused there"}
        report["dense"] = use_dense_kernels(model)  # unquantized layers: MLX's GPU matmul varies with M
        report["delta"] = use_delta_kernel(model)  # delta-net layers' convs: the taps in order (MLX's may vary)
        report["joined_projections"] = join_projections(model, device)  # q/k/v, gate/up: one launch each
        report["rowwise_gates"] = use_rowwise_gates(model)  # MoE routers that multiply by a raw weight, float experts
        report["row_positions"] = use_row_positions(model)  # RoPE at each row's own position: draft trees' passes
        report["latent_rows"] = latent_rows
    return report


def remove_kernels(model: nn.Module) -> None:
    """MLX's own ops again in every layer of this model."""
    restore_fused_layers(model)
    unjoin_projections(model)
    restore_layers(model)
    restore_dense(model)
    restore_attention(model)
    restore_softcap_attention(model)
    restore_rowwise_gates(model)
    restore_pointwise(model)
    restore_delta(model)
    restore_ssm_steps(model)
    restore_row_positions(model)
    restore_latent_rows(model)


def installed(model: nn.Module) -> bool:
    """Does any layer of this model run one of our kernels?"""
    from .delta import KernelCausalConv
    from .hooks import routed
    from .layers import KernelQuantizedEmbedding, KernelQuantizedLinear, KernelQuantizedSwitchLinear
    from .pointwise import KernelRMSNorm, KernelRoPE, geglu_swapped

    kinds = (KernelQuantizedLinear, KernelQuantizedEmbedding, KernelQuantizedSwitchLinear, KernelLinear, KernelEmbedding,
             KernelRMSNorm, KernelRoPE, KernelCausalConv, SoftcapAttention)
    return fused(model) or any(isinstance(m, kinds) or routed(m, "swiglu") or routed(m, "scaled_dot_product_attention")
                               or routed(m, "gated_delta_update") or routed(m, "ssm_update") or geglu_swapped(m)
               for _, m in model.named_modules())


def install_timed(model: nn.Module, device: mx.Device | None = None, fuse: bool = True,
                  activations: str = "f32", steps=None) -> dict:
    """install_kernels, and on a GPU keep them only if a one-row forward costs at most EXACT_BUDGET
    times MLX's own (measured here, interleaved; through `steps(model)`, the forward decoding will
    run, where given: timing.forward_cost_ratio). On the CPU the kernels are 5-25x faster than
    MLX's ops (benchmarks/results/kernels.txt), so they stay without a timing."""
    from .timing import EXACT_BUDGET, forward_cost_ratio

    report = install_kernels(model, device, fuse, activations)
    if report["backend"] == "cpu" or not installed(model):
        return report
    start = time.perf_counter()
    cost = forward_cost_ratio(model, lambda: install_kernels(model, device, fuse), lambda: remove_kernels(model),
                              steps=steps)
    cost["seconds"] = round(time.perf_counter() - start, 3)  # 3 installs and removals, a trace each (status: the rest)
    cost["budget"], cost["kept"] = EXACT_BUDGET, cost["ratio"] <= EXACT_BUDGET
    if cost["kept"]:
        install_kernels(model, device, fuse)
    report["timed"] = cost
    return report
