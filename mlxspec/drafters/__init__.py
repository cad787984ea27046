"""Drafters: everything that can guess the target's next tokens behind one `propose` interface."""

from .base import Draft, Drafter, NoDrafter
from .lookup import LookupDrafter
from .model import ModelDrafter, check_compatible

DRAFTERS = ("none", "draft-model", "lookup")

__all__ = ["DRAFTERS", "Draft", "Drafter", "LookupDrafter", "ModelDrafter", "NoDrafter", "check_compatible"]
