"""GGUF files in Hugging Face repos, named as Ollama names them: `hf.co/ORG/REPO[:QUANT]`.

    hf.co/unsloth/Qwen3.5-9B-GGUF:Q4_K_M   -> the repo's Qwen3.5-9B-Q4_K_M.gguf
    hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF -> its Q4_K_M file (Ollama's default), else a near one

The quantization is matched case-insensitively against the end of each file name (`-Q4_K_M.gguf`,
`.Q4_1.gguf`, unsloth's `-UD-Q4_K_XL.gguf` as UD-Q4_K_XL); vision projectors (mmproj) are never the model. The file comes
through huggingface-hub into its usual cache, so a second load needs no network; a file split into
parts (`-00001-of-00003.gguf`) is refused, since the loader reads one file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .errors import ModelLoadError

REFERENCE = re.compile(r"^(?:hf\.co|huggingface\.co)/(?P<repo>[\w.-]+/[\w.-]+)(?::(?P<quant>[\w.-]+))?$", re.IGNORECASE)
# Ollama's default is Q4_K_M; where a repo lacks it, the nearest in size and quality first.
PREFERRED = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q4_0", "Q4_1", "Q5_K_S", "Q6_K", "Q8_0")
SPLIT = re.compile(r"-\d{5}-of-(\d{5})\.gguf$", re.IGNORECASE)


def is_reference(text: str) -> bool:
    return bool(REFERENCE.match(text.strip()))


def parse(reference: str) -> tuple[str, str | None]:
    """'hf.co/org/repo:Q4_K_M' -> ('org/repo', 'Q4_K_M'); no tag or 'latest' -> (repo, None)."""
    m = REFERENCE.match(reference.strip())
    if m is None:
        raise ModelLoadError(f"{reference!r} is not hf.co/ORG/REPO[:QUANT]")
    quant = m["quant"]
    return m["repo"], None if quant is None or quant.lower() == "latest" else quant


def quant_of(filename: str) -> str | None:
    """The quantization a GGUF file name ends with ('Qwen3.5-9B-UD-Q4_K_XL.gguf' -> 'UD-Q4_K_XL'), upper-cased."""
    stem = SPLIT.sub(".gguf", Path(filename).name)
    m = re.search(r"[-._]((?:UD-)?[A-Z0-9_]+)\.gguf$", stem, re.IGNORECASE)
    return m[1].upper() if m else None


def choose(files: list[str], quant: str | None, repo: str) -> str:
    """The model file a reference names among a repo's files."""
    models = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in Path(f).name.lower())
    if not models:
        raise ModelLoadError(f"hf.co/{repo} holds no GGUF model file")
    by_quant: dict[str, list[str]] = {}
    for f in models:
        by_quant.setdefault(quant_of(f) or "", []).append(f)
    if quant is not None:
        picked = by_quant.get(quant.upper())
        if picked is None:
            have = ", ".join(sorted(q for q in by_quant if q)) or "none named"
            raise ModelLoadError(f"hf.co/{repo} has no {quant} GGUF (it has: {have})")
    else:
        picked = next((by_quant[q] for q in PREFERRED if q in by_quant), models[:1])
    name = sorted(picked, key=len)[0]
    split = SPLIT.search(name)
    if split:
        raise ModelLoadError(f"hf.co/{repo}: {Path(name).name} is split into {int(split[1])} files; mlxspec reads "
                             "one-file GGUFs (llama.cpp's gguf-split --merge joins them)")
    return name


def download(reference: str, progress: Any = None) -> Path:
    """The local path of the file a reference names, downloading it into the hub cache if needed."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    repo, quant = parse(reference)
    local = cached(reference)
    if local is not None:
        return local
    kwargs: dict[str, Any] = {"tqdm_class": progress} if progress is not None else {}
    try:
        name = choose(HfApi().list_repo_files(repo), quant, repo)
        return Path(snapshot_download(repo, allow_patterns=[name], **kwargs)) / name
    except RepositoryNotFoundError:
        raise ModelLoadError(f"model {repo!r} not found on the Hugging Face hub") from None
    except LocalEntryNotFoundError:
        raise ModelLoadError(f"cannot download {reference!r}: the Hugging Face hub is unreachable and the file "
                             "is not in its cache") from None
    except (HfHubHTTPError, OSError) as e:
        raise ModelLoadError(f"cannot download {reference!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def cached(reference: str) -> Path | None:
    """The file if the hub cache has it (no network), else None."""
    from huggingface_hub import snapshot_download

    repo, quant = parse(reference)
    try:
        root = Path(snapshot_download(repo, local_files_only=True, allow_patterns=["*.gguf"]))
        path = root / choose([str(p.relative_to(root)) for p in root.rglob("*.gguf")], quant, repo)
        return path if path.is_file() else None
    except Exception:  # not in the cache: the hub library says so in many ways
        return None
