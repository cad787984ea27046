"""What /api/show, /api/tags and /api/ps say about a model: from the loaded engine, or from its
files on disk (config.json, tokenizer_config.json) without loading the weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..engine import Engine
from ..loading import text_config
from ..ollama_store import is_reference as is_ollama
from ..store import Manifest, local_path
from .prompts import FIM_TOKENS, supports_insert
from .harmony import is_harmony
from .tool_calls import shows_tools


@dataclass
class Facts:
    architecture: str = "unknown"
    format: str = "safetensors"  # or 'gguf'
    context_length: int | None = None
    parameters: int | None = None
    parameter_size: str = ""
    quantization: str = ""
    hidden_size: int | None = None
    num_layers: int | None = None
    chat_template: str | None = None
    added_vocab: set[str] = field(default_factory=set)
    gguf_conversion: dict | None = None  # a GGUF's tensors: which loaded exactly, the error of the rest

    def capabilities(self, manifest: Manifest) -> list[str]:
        caps = ["completion"]
        if supports_insert(manifest.template, self.added_vocab):
            caps.append("insert")
        template = manifest.template or self.chat_template
        if shows_tools(template):  # clients (Zed, Open WebUI) offer tools only to models that list it
            caps.append("tools")
        if template and ("enable_thinking" in template or is_harmony(template)):  # gpt-oss always thinks
            caps.append("thinking")
        return caps

    def details(self, manifest: Manifest) -> dict:
        return {
            "parent_model": "",
            "format": self.format,
            "family": self.architecture,
            "families": [self.architecture],
            "parameter_size": self.parameter_size,
            "quantization_level": _LEVELS.get(self.quantization, self.quantization.upper()) if not manifest.quantize
            else manifest.quantize.upper(),
        }

    def model_info(self, name: str) -> dict:
        arch = self.architecture
        info = {"general.architecture": arch, "general.basename": name.split(":")[0]}
        for key, value in (
            ("general.parameter_count", self.parameters),
            (f"{arch}.context_length", self.context_length),
            (f"{arch}.embedding_length", self.hidden_size),
            (f"{arch}.block_count", self.num_layers),
        ):
            if value is not None:
                info[key] = value
        return info


_LEVELS = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}  # Ollama's spelling


def weights_format(ref: str) -> str:
    """'gguf' for a .gguf file or an Ollama model, else 'safetensors'."""
    return "gguf" if ref.lower().endswith(".gguf") or is_ollama(ref) else "safetensors"


def from_engine(engine: Engine, manifest: Manifest) -> Facts:
    info, tok = engine.info, engine.tokenizer
    template = getattr(tok, "chat_template", None)
    return Facts(
        architecture=info.get("architecture", "unknown"),
        format=weights_format(manifest.target),
        context_length=info.get("context_length"),
        parameters=info.get("parameters"),
        parameter_size=info.get("parameter_size", ""),
        quantization=str(info.get("quantization") or ""),
        hidden_size=info.get("hidden_size"),
        num_layers=info.get("num_layers"),
        chat_template=template if isinstance(template, str) else None,
        added_vocab=set(tok.get_added_vocab()),
        gguf_conversion=info.get("gguf_conversion"),
    )


def from_disk(manifest: Manifest, tokenizer: bool = True) -> Facts | None:
    """Facts from a model directory already on disk; None for GGUF files and missing weights."""
    path = local_path(manifest.target)
    if path is None or not (path / "config.json").is_file():
        return None
    config = text_config(_read_json(path / "config.json"))
    quant = config.get("quantization")
    facts = Facts(
        architecture=config.get("model_type", "unknown"),
        context_length=config.get("max_position_embeddings"),
        quantization=f"q{quant['bits']}" if isinstance(quant, dict) and "bits" in quant else str(config.get("torch_dtype", "")),
        hidden_size=config.get("hidden_size"),
        num_layers=config.get("num_hidden_layers"),
    )
    if tokenizer:
        tok_config = _read_json(path / "tokenizer_config.json")
        facts.chat_template = _chat_template(path, tok_config)
        added = [t.get("content") for t in tok_config.get("added_tokens_decoder", {}).values() if isinstance(t, dict)]
        facts.added_vocab = {t for t in added if isinstance(t, str)} | _fim_in_tokenizer_json(path)
    return facts


def _chat_template(path: Path, tok_config: dict) -> str | None:
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def _fim_in_tokenizer_json(path: Path) -> set[str]:
    """FIM tokens listed in tokenizer.json (some repos name added tokens only there)."""
    if not (path / "tokenizer.json").is_file():
        return set()
    text = (path / "tokenizer.json").read_text(errors="replace")
    return {t for group in FIM_TOKENS for t in group if f'"{t}"' in text}


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
