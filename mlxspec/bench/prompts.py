"""Prompt sets: JSON files in benchmarks/prompts/, each saying where its prompts came from.

    {"name": ..., "source": "where these prompts come from",
     "prompts": [{"id": ..., "category": ..., "messages": [{"role": "user", "content": ...}]},
                 {"id": ..., "category": ..., "text": "raw text to continue"}]}

`messages` go through the model's chat template (a model without one gets the contents joined);
`text` is encoded as is. `--prompts` takes a set's name (a file in benchmarks/prompts/), `all`
(every category set), or a path to such a file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MlxspecError

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "prompts"
CATEGORY_SETS = ("input_grounded", "code", "prose", "chat")


@dataclass
class Prompt:
    id: str
    category: str
    messages: list[dict] | None = None
    text: str | None = None

    def token_ids(self, tokenizer) -> list[int]:
        if self.text is not None:
            return list(tokenizer.encode(self.text))
        if getattr(tokenizer, "has_chat_template", False):
            return list(tokenizer.apply_chat_template(self.messages, add_generation_prompt=True))
        return list(tokenizer.encode("\n\n".join(m["content"] for m in self.messages)))


@dataclass
class PromptSet:
    name: str
    source: str
    prompts: list[Prompt] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"name": self.name, "source": self.source, "ids": [p.id for p in self.prompts]}


def available_sets(directory: Path = PROMPTS_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.json")) + ["all"] if directory.is_dir() else []


def load_prompt_set(ref: str, directory: Path = PROMPTS_DIR) -> PromptSet:
    if ref == "all":
        sets = [load_prompt_set(name, directory) for name in CATEGORY_SETS]
        return PromptSet("all", "; ".join(f"{s.name}: {s.source}" for s in sets), [p for s in sets for p in s.prompts])
    path = Path(ref).expanduser()
    if not (path.suffix == ".json" and path.is_file()):
        path = directory / f"{ref}.json"
    if not path.is_file():
        known = ", ".join(available_sets(directory)) or f"none: {directory} is missing"
        raise MlxspecError(f"prompt set {ref!r} not found: use a JSON file or one of {known}")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise MlxspecError(f"prompt set {path}: not valid JSON ({e})") from None
    return _parse(data, path)


def _parse(data, path: Path) -> PromptSet:
    if not isinstance(data, dict) or not data.get("source"):
        raise MlxspecError(f"prompt set {path}: needs an object with a 'source' saying where its prompts came from")
    if "prompts" not in data:  # the older {"source", category: [user prompts]} layout
        data = {**data, "prompts": [
            {"id": f"{cat}-{i}", "category": cat, "messages": [{"role": "user", "content": text}]}
            for cat, items in data.items() if isinstance(items, list) for i, text in enumerate(items)
        ]}
    prompts = []
    for i, p in enumerate(data["prompts"]):
        ok = isinstance(p, dict) and (isinstance(p.get("text"), str) or _valid_messages(p.get("messages")))
        if not ok:
            raise MlxspecError(f"prompt set {path}: prompt {i} needs 'text' or a list of 'messages'")
        prompts.append(Prompt(str(p.get("id", i)), str(p.get("category", "other")), p.get("messages"), p.get("text")))
    if not prompts:
        raise MlxspecError(f"prompt set {path}: no prompts")
    return PromptSet(str(data.get("name", path.stem)), str(data["source"]), prompts)


def _valid_messages(messages) -> bool:
    return isinstance(messages, list) and bool(messages) and all(
        isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in messages
    )
