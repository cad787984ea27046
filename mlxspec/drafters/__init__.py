"""Drafters: everything that can guess the target's next tokens behind one `propose` interface."""

from .base import Draft, Drafter, NoDrafter
from .lookup import LookupDrafter
from .model import ModelDrafter, check_compatible
from .selfdraft import EarlyExitDrafter

# Names a user can ask for; early-exit takes a layer count: "early-exit:12" (default: half).
DRAFTERS = ("none", "draft-model", "lookup", "early-exit")

__all__ = [
    "DRAFTERS",
    "Draft",
    "Drafter",
    "EarlyExitDrafter",
    "LookupDrafter",
    "ModelDrafter",
    "NoDrafter",
    "check_compatible",
]
