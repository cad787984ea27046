"""Engine-wide decode settings, read once where an Engine is built (never at import time).

Environment variables stay the user's switch: MLXSPEC_FUSED_ACCEPT=1 turns the fused acceptance
kernels on; MLXSPEC_PIPELINE=0 decodes plain rounds one at a time (no step queued ahead).
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

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "DecodeSettings":
        env = os.environ if environ is None else environ
        return cls(
            fused_accept=env.get("MLXSPEC_FUSED_ACCEPT", "0") == "1",
            pipeline=env.get("MLXSPEC_PIPELINE", "1") != "0",
        )
