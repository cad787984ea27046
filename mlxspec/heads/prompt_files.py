"""What the target answers for self-distillation: prompts, or a user's own chat logs.

    load_prompts(path=None) -> [prompt, ...]   a prompt is a string (one user turn) or a chat
                                               (messages ending with a user turn)

A file is JSON (a list, or one object) or JSON Lines, and each item is one of
    "text"                                      a prompt
    {"prompt": "text"}                          a prompt
    {"messages": [{"role", "content"}, ...]}    a chat log (OpenAI's and Ollama's shape)
    [{"role", "content"}, ...]                  the same, bare
    {"conversations": [{"from", "value"}, ...]} a ShareGPT log (human / gpt / system)
Each user turn of a chat log becomes a prompt: the chat up to and including that turn, earlier
answers as the log has them. The target then writes its own answer (recording never trains on
the logged answers: the head must learn what this target says). Tool calls and tool results are
left out; text parts of a multi-part content are joined. Repeated prompts count once.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MlxspecError

PROMPTS_FILE = Path(__file__).parent.parent / "data" / "drafter_prompts.json"
ROLES = {"system": "system", "user": "user", "assistant": "assistant", "human": "user", "gpt": "assistant"}
SKIPPED_ROLES = {"tool", "function", "ipython"}  # tool results: not what a user asked

Prompt = str | list[dict]


def load_prompts(path: str | Path | None = None) -> list[Prompt]:
    """The prompts in a file (see the module's docstring); the shipped set when no path is given."""
    path = Path(path) if path else PROMPTS_FILE
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise MlxspecError(f"cannot read prompts from {path}: {e}") from None
    items = _json_items(text, path)
    prompts, seen = [], set()
    for n, item in enumerate(items, 1):
        try:
            found = _prompts_of(item)
        except (ValueError, TypeError, KeyError) as e:
            raise MlxspecError(f"{path}: item {n}: {e}") from None
        for prompt in found:
            key = json.dumps(prompt, sort_keys=True)
            if key not in seen:
                seen.add(key)
                prompts.append(prompt)
    if not prompts:
        raise MlxspecError(f"{path}: no prompts: expected a JSON list of prompt strings or chat logs with a user turn")
    return prompts


def _json_items(text: str, path: Path) -> list:
    """A JSON list (or one object) as its items; else JSON Lines, one item per non-empty line."""
    try:
        data = json.loads(text)
        return data if isinstance(data, list) and not _is_chat(data) else [data]
    except ValueError:
        pass
    items = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                items.append(json.loads(line))
            except ValueError as e:
                raise MlxspecError(f"cannot read prompts from {path}: neither JSON nor JSON Lines (line {n}: {e})") from None
    return items


def _is_chat(data: list) -> bool:
    return bool(data) and all(isinstance(m, dict) and ("role" in m or "from" in m) for m in data)


def _prompts_of(item) -> list[Prompt]:
    if isinstance(item, str):
        if not item.strip():
            raise ValueError("an empty prompt")
        return [item]
    if isinstance(item, dict) and "prompt" in item:
        if not isinstance(item["prompt"], str):
            raise ValueError(f"\"prompt\" must be a string, not {type(item['prompt']).__name__}")
        return _prompts_of(item["prompt"])
    if isinstance(item, dict) and ("messages" in item or "conversations" in item):
        chat = item.get("messages", item.get("conversations"))
    elif isinstance(item, list):
        chat = item
    else:
        raise ValueError("expected a prompt string, {\"prompt\": ...}, {\"messages\": [...]} or {\"conversations\": [...]}")
    if not isinstance(chat, list):
        raise ValueError("a chat log's messages must be a list")
    messages = [m for m in map(_message, chat) if m is not None]
    return [messages[: i + 1] for i, m in enumerate(messages) if m["role"] == "user"]


def _message(m) -> dict | None:
    """{"role", "content"} of one logged message; None for one recording leaves out (tools)."""
    if not isinstance(m, dict):
        raise ValueError(f"a message must be an object, not {type(m).__name__}")
    role = m.get("role", m.get("from"))
    if role in SKIPPED_ROLES:
        return None
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r} (expected one of {', '.join(ROLES)})")
    content = _text(m.get("content", m.get("value")))
    if not content.strip():
        if ROLES[role] == "user":
            raise ValueError("a user message without text")
        return None  # an assistant turn that only called tools
    return {"role": ROLES[role], "content": content}


def _text(content) -> str:
    """A message's text: a string, or the text parts of a multi-part content ([{"type": "text", ...}])."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text" and
                         isinstance(p.get("text"), str))
    raise ValueError(f"a message's content must be text, not {type(content).__name__}")
