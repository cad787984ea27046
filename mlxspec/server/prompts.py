"""Requests -> prompt token ids, with the model's chat template or the manifest's own template.

A `template` (request or manifest) is a Jinja chat template, as in Hugging Face tokenizers; for
/api/generate it also sees `prompt`, `system` and `suffix`. Fill-in-the-middle (`suffix`) works
where the template uses `suffix` or the vocabulary has FIM tokens (Qwen-coder, StarCoder, SmolLM).
These functions run on the MLX thread: they need the tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engine import Engine
from ..store import Manifest
from .requests import ApiError
from .template_limits import TemplateLimitError, limited

FIM_TOKENS = [
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
]
ROLES = ("system", "user", "assistant", "tool")


@dataclass
class GeneratePrompt:
    prompt: str
    system: str | None = None
    template: str | None = None
    suffix: str | None = None
    raw: bool = False
    context: list[int] = field(default_factory=list)


def fim_tokens(added_vocab) -> tuple[str, str, str] | None:
    """The (prefix, suffix, middle) special tokens this vocabulary has, if any."""
    return next((t for t in FIM_TOKENS if all(x in added_vocab for x in t)), None)


def _uses_suffix(template: str | None) -> bool:
    return bool(template and "suffix" in template)


def supports_insert(template: str | None, added_vocab) -> bool:
    return _uses_suffix(template) or fim_tokens(added_vocab) is not None


def generate_ids(engine: Engine, manifest: Manifest, req: GeneratePrompt) -> list[int]:
    """/api/generate and /v1/completions: raw text, a template, FIM, or the chat template."""
    return req.context + _generate_ids(engine, manifest, req)


def _generate_ids(engine: Engine, manifest: Manifest, req: GeneratePrompt) -> list[int]:
    if req.raw:
        return engine.encode(req.prompt)
    template = req.template or manifest.template
    system = req.system if req.system is not None else manifest.system
    if req.suffix and not _uses_suffix(template):
        fim = fim_tokens(engine.tokenizer.get_added_vocab())
        if fim is None:
            raise ApiError(400, "this model does not support insert: no fill-in-the-middle tokens nor a template using suffix")
        prefix, suffix, middle = fim
        text = f"{prefix}{req.prompt}{suffix}{req.suffix}{middle}"
        return engine.encode(text, add_special_tokens=False)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": req.prompt}]
    if template:
        return render(engine, template, messages, prompt=req.prompt, system=system or "", suffix=req.suffix or "")
    if engine.tokenizer.has_chat_template:
        return _apply(engine, lambda: engine.chat_prompt(messages))
    return engine.encode(f"{system}\n\n{req.prompt}" if system else req.prompt)  # a base model: plain text


def chat_ids(engine: Engine, manifest: Manifest, messages: list[dict], tools: list | None = None) -> list[int]:
    """/api/chat and /v1/chat/completions: the conversation through the chat template."""
    if manifest.system and not any(m["role"] == "system" for m in messages):
        messages = [{"role": "system", "content": manifest.system}] + messages
    extra = {"tools": tools} if tools else {}
    if manifest.template:
        return render(engine, manifest.template, messages, **extra)
    if not engine.tokenizer.has_chat_template:
        raise ApiError(400, "this model has no chat template: use /api/generate, or create it with a template")
    return _apply(engine, lambda: engine.chat_prompt(messages, **extra))


def render(engine: Engine, template: str, messages: list[dict], **variables) -> list[int]:
    """Token ids of `messages` through a Jinja chat template given as text."""
    tok = engine.tokenizer
    return _apply(
        engine,
        lambda: list(tok.apply_chat_template(messages, chat_template=template, add_generation_prompt=True, **variables)),
    )


def _apply(engine: Engine, fn):
    """Render a template; its failures are the caller's: the template (request or create) or the
    messages it was given. Jinja passes Python's own errors through ({{ 1/0 }}, {{ prompt + 1 }})."""
    from jinja2 import TemplateError

    try:
        return limited(fn)
    except TemplateLimitError as e:
        raise ApiError(400, f"template error: {e}") from None
    except (TemplateError, ArithmeticError, LookupError, TypeError) as e:
        raise ApiError(400, f"template error: {type(e).__name__}: {e}") from None


def check_messages(messages, openai: bool = False) -> list[dict]:
    """Validate chat messages (on the event loop, before queueing); returns plain dicts."""
    if not isinstance(messages, list):
        raise ApiError(400, "messages must be a list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ApiError(400, f"messages[{i}] must be an object")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES + (("developer",) if openai else ()):
            raise ApiError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}")
        if openai and isinstance(content, list):
            content = _text_parts(content, i)
        if content is None and m.get("tool_calls"):
            content = ""
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string")
        if m.get("images"):
            raise ApiError(400, "this model does not support images")
        msg = {"role": "system" if role == "developer" else role, "content": content}
        for key in ("tool_calls", "tool_name", "name", "tool_call_id"):
            if m.get(key) is not None:
                msg[key] = m[key]
        out.append(msg)
    return out


def _text_parts(parts: list, i: int) -> str:
    """OpenAI content parts: text only."""
    texts = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ApiError(400, f"messages[{i}].content: only text parts are supported")
        texts.append(part["text"])
    return "".join(texts)
