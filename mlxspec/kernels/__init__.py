"""Custom kernels for the verify path: few rows times a quantized matrix, and few-row attention.

    from mlxspec.kernels import use_kernels, use_attention_kernel, status
    report = use_kernels(model)        # swap QuantizedLinear layers where the device's kernel passed its check
    use_attention_kernel()             # CPU: route mlx-lm's attention through the few-row kernel
    use_pointwise_kernels(model)       # CPU: RMSNorm, RoPE, SwiGLU in one pass each
    status()                           # what is active and why (for `mlxspec doctor`)

Files: reference.py (the pure-MLX definition and tolerance), cpu/ + build.py + cpu.py (the MLX C++
extension, built on first use and cached), gpu_source.py + gpu.py (Metal and CUDA qmm and dense
kernels through mx.fast; gpu_codegen.py spells the program MLX generates), gpu_attention_source.py +
gpu_attention.py (Metal and CUDA few-row attention), registry.py (per-device self-check), layers.py (the swap), attention.py (the attention
kernel's self-check and mlx-lm hook), pointwise.py (RMSNorm/RoPE/SwiGLU modules and hook), accept*.py (fused acceptance on a GPU: greedy and rejection
sampling in one kernel; opt-in with MLXSPEC_FUSED_ACCEPT=1 until measured on a device).
"""

from . import accept, attention, pointwise, registry
from .attention import restore_attention, use_attention_kernel
from .build import KernelUnavailable
from .layers import KernelQuantizedEmbedding, KernelQuantizedLinear, use_kernels
from .pointwise import restore_pointwise, use_pointwise_kernels


def status() -> list[dict]:
    """One entry per kernel tried in this process: active or not, and why."""
    tried = attention._state["kernel"] is not None or attention._state["error"] is not None
    tried_pointwise = pointwise._state["ext"] is not None or pointwise._state["error"] is not None
    fused = accept.status()
    return (registry.status() + ([attention.attention_status()] if tried else [])
            + ([pointwise.pointwise_status()] if tried_pointwise else []) + ([fused] if fused else []))


__all__ = [
    "KernelQuantizedEmbedding",
    "KernelQuantizedLinear",
    "KernelUnavailable",
    "restore_attention",
    "restore_pointwise",
    "status",
    "use_attention_kernel",
    "use_kernels",
    "use_pointwise_kernels",
]
