"""Drafters: everything that can guess the target's next tokens behind one `propose` interface."""

from .base import Draft, Drafter, NoDrafter

__all__ = ["Draft", "Drafter", "NoDrafter"]
