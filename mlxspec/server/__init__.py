"""The daemon: Ollama's and OpenAI's HTTP APIs over the engine (aiohttp)."""

from .app import make_app, serve
from .state import Settings

__all__ = ["Settings", "make_app", "serve"]
