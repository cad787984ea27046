"""Custom kernels for the verify path: few rows times a quantized matrix, few-row attention, pointwise ops.

    from mlxspec.kernels import install_kernels, remove_kernels, status
    report = install_kernels(model)    # per model: every family that passed its self-check on this device
    remove_kernels(model)              # MLX's ops again in this model
    status()                           # every family tried: active or not, why, timings (for `mlxspec doctor`)

Files: registry.py (one record per kernel family and backend: load, self-check, status), first_run.py (a
GPU's kernels run first in a child process, once per device and version: a kernel that kills its process
turns its family off, not the daemon), mlx_rows.py (Metal: verify rows with the bits of MLX's own one-row qmm,
built from MLX's shipped kernel headers), install.py
(the per-model entry), hooks.py (per-model routing of mlx-lm's module-level functions), timing.py
(kernel vs MLX's op, cached per device and MLX version), reference.py (the pure-MLX definitions and
tolerances, q8_reference for int8 activations), cpu/ + build.py + cpu.py (the MLX C++ extension, built
on first use and cached; cpu/qmm_q8_kernel.h: matmuls with int8 activations, the `qmm-q8` family),
gpu_source.py + gpu.py (Metal and CUDA qmm and dense kernels through mx.fast; gpu_codegen.py spells
the program MLX generates), gpu_attention_source.py + gpu_attention.py (Metal and CUDA few-row
attention), layers.py (quantized and dense layer swaps), attention.py (few-row attention),
pointwise.py (RMSNorm/RoPE/SwiGLU), accept*.py (fused acceptance on a GPU; opt-in with
MLXSPEC_FUSED_ACCEPT=1 until measured on a device).
"""

from . import accept, attention, pointwise, registry
from .attention import restore_attention, use_attention_kernel
from .build import KernelUnavailable
from .install import install_kernels, installed, remove_kernels
from .layers import KernelQuantizedEmbedding, KernelQuantizedLinear, restore_layers, use_kernels
from .pointwise import restore_pointwise, use_pointwise_kernels
from .registry import status

__all__ = [
    "KernelQuantizedEmbedding",
    "KernelQuantizedLinear",
    "KernelUnavailable",
    "accept",
    "attention",
    "install_kernels",
    "installed",
    "pointwise",
    "registry",
    "remove_kernels",
    "restore_attention",
    "restore_layers",
    "restore_pointwise",
    "status",
    "use_attention_kernel",
    "use_kernels",
    "use_pointwise_kernels",
]
