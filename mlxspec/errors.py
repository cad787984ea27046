"""Errors a caller can cause and fix: each carries a one-line message fit for a user.

MlxspecError is the one family of the caller's mistakes: the daemon answers it with a 4xx and
the CLI with one line. Anything else (a bare ValueError from MLX's shape checks included) is a
bug of ours: logged with its traceback, answered with a 500.
"""


class MlxspecError(Exception):
    """Base of the errors the CLI and daemon report as a clean message, not a traceback."""


class ModelLoadError(MlxspecError):
    """A model reference that cannot be resolved or loaded (missing, offline, unsupported)."""


class ModelNotFoundError(MlxspecError):
    """A model name the store (mlxspec's or Ollama's) does not have (HTTP 404)."""


class PromptError(MlxspecError, ValueError):
    """A prompt the engine cannot run: empty, or longer than the context window."""


class IncompatibleDraftError(MlxspecError):
    """A draft whose tokenizer differs from the target's: its tokens would mean other text."""
