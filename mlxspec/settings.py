"""Engine-wide decode settings, read once where an Engine is built (never at import time).

Environment variables stay the user's switch: MLXSPEC_FUSED_ACCEPT=1 turns the fused acceptance
kernels on; MLXSPEC_PIPELINE=0 decodes plain rounds one at a time (no step queued ahead);
MLXSPEC_COMPILE=1/0 runs decoding passes through compiled step graphs (step_graph.py) or not
(unset: where the model runs on a GPU, whose steps are short enough for graph building to show).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class DecodeSettings:
    # The fused GPU acceptance kernels are opt-in until measured on a device (they self-check either way).
    fused_accept: bool = False
    # Plain decoding queues each step before reading the previous token.
    pipeline: bool = True
    # Decoding passes replay compiled graphs (step_graph.py): True, False, or None = on a GPU only.
    compiled_steps: bool | None = None

    def compile_steps(self, device: "mx.Device | None" = None) -> bool:
        """Do decoding passes on `device` (default: MLX's default) run through compiled step graphs?"""
        if self.compiled_steps is not None:
            return self.compiled_steps
        import mlx.core as mx

        return (device or mx.default_device()).type == mx.DeviceType.gpu

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "DecodeSettings":
        env = os.environ if environ is None else environ
        return cls(
            fused_accept=env.get("MLXSPEC_FUSED_ACCEPT", "0") == "1",
            pipeline=env.get("MLXSPEC_PIPELINE", "1") != "0",
            compiled_steps={"1": True, "0": False}.get(env.get("MLXSPEC_COMPILE", "")),
        )
