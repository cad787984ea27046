"""How much memory a model will take and how much this machine has for it: checked before a load,
so that a model too large for the machine is refused with a message instead of taking the process
(and every other loaded model) down.

    need = model_footprint(manifest, ollama)   # bytes, or None where it cannot be told before loading
    free = available_memory()                  # bytes this process may still take, or None (unknown)

A model's footprint is its weights as stored (a GGUF file, a directory's safetensors; a draft
model's too) plus HEADROOM of that for the KV cache, activations and MLX's buffers; a float model
quantized on load peaks near its stored size while it converts, so stored size is the right bound.
Available memory is the kernel's MemAvailable on Linux; on Apple Silicon, MLX's recommended
working set (the GPU's share of unified memory) less what MLX holds now.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx

from . import loading, ollama_store
from .errors import MlxspecError

HEADROOM = 0.15  # of the weights: KV cache at a few thousand tokens, activations, allocator slack
GIB = 1 << 30


class InsufficientMemoryError(MlxspecError):
    """A model larger than the memory this machine has for it (nothing else loaded would change that)."""


def reference_bytes(reference: str, ollama: ollama_store.OllamaStore | None = None) -> int | None:
    """Bytes of a model reference's weights as stored, without downloading; None if not local yet."""
    try:
        if loading.REPO_ID.match(reference) and not Path(reference).expanduser().exists():
            path = _cached_repo(reference)
        else:
            path = loading.resolve(reference, ollama=ollama)
    except (MlxspecError, OSError, ValueError):
        return None  # the load itself will say what is wrong
    if path is None:
        return None
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.glob("*.safetensors")) or None


def _cached_repo(repo_id: str) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=loading.HUB_PATTERNS))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def model_footprint(manifest, ollama: ollama_store.OllamaStore | None = None) -> int | None:
    """Bytes a manifest's target (and draft model) will hold once loaded, or None if unknown."""
    refs = [manifest.target] + ([manifest.draft] if manifest.draft and manifest.draft != manifest.target else [])
    sizes = [reference_bytes(ref, ollama) for ref in refs]
    if any(size is None for size in sizes):
        return None
    return int(sum(sizes) * (1 + HEADROOM))


def available_memory() -> int | None:
    """Bytes this process may still take, or None where this platform does not say."""
    if sys.platform.startswith("linux"):
        return _meminfo_available(Path("/proc/meminfo"))
    if mx.metal.is_available():
        info = mx.device_info()
        limit = int(info.get("max_recommended_working_set_size", 0) or info.get("memory_size", 0))
        return max(0, limit - mx.get_active_memory()) if limit else None
    return None


def _meminfo_available(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"
