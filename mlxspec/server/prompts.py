"""Requests -> prompt token ids, with the model's chat template or the manifest's own template.

A `template` (request or manifest) is a Jinja chat template, as in Hugging Face tokenizers, or
Ollama's Go syntax, translated to one that renders as Ollama does (go_jinja.py); for
/api/generate it also sees `prompt`, `system` and `suffix`. Fill-in-the-middle (`suffix`) works
where the template uses `suffix` or the vocabulary has FIM tokens (Qwen-coder, StarCoder, SmolLM).
These functions run on the MLX thread: they need the tokenizer.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

from ..engine import Engine
from ..errors import PromptError
from ..options import GenerateOptions, context_window
from ..store import Manifest
from ..go_jinja import DEFAULT_GO_TEMPLATE, chat_source, is_go_template, to_jinja, uses_suffix
from ..renderers import renderer_of
from .requests import ApiError
from .template_limits import TemplateLimitError, limited
from .harmony import HarmonySplitter, is_harmony
from .thinking import splitter_for
from .tool_calls import detect, shows_tools

FIM_TOKENS = [
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
]
ROLES = ("system", "user", "assistant", "tool")
log = logging.getLogger(__name__)


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


def supports_insert(template: str | None, added_vocab) -> bool:
    return uses_suffix(template) or fim_tokens(added_vocab) is not None


def generate_ids(engine: Engine, manifest: Manifest, req: GeneratePrompt) -> list[int]:
    """/api/generate and /v1/completions: raw text, a template, FIM, or the chat template."""
    engine.check_ids(req.context)  # the caller's ids, before anything decodes them (a huge one overflows there)
    return req.context + _generate_ids(engine, manifest, req)


def fitted_generate_ids(engine: Engine, manifest: Manifest, req: GeneratePrompt, opts: GenerateOptions,
                        truncate: bool = True) -> list[int]:
    """generate_ids, cut to the context window as Ollama cuts a completion's prompt where `truncate` (its default):
    fitting_prompt_ids. Without it a prompt past the window is the engine's 400."""
    ids = generate_ids(engine, manifest, req)
    if not truncate:
        return ids
    limit = context_window(opts.num_ctx, engine.context_length)  # as the engine decides it
    bos = getattr(engine.tokenizer, "bos_token_id", None)
    fitted = fitting_prompt_ids(ids, limit, opts.num_keep, bos is not None and ids[:1] == [bos])
    if len(fitted) < len(ids):
        log.warning("prompt truncated to fit %d tokens: %d -> %d (num_keep %d)", limit, len(ids), len(fitted),
                    opts.num_keep)
    return fitted


def fitting_prompt_ids(ids: list[int], limit: int, num_keep: int, bos: bool) -> list[int]:
    """A prompt of `limit` tokens or more as Ollama's completionPromptForRequest (llm/llama_server.go) shifts it:
    the first num_keep tokens (all where -1; one more for a leading BOS) and the end, so that about half of what
    the kept start leaves of the window is free to answer in. Shorter prompts come back as they are."""
    if len(ids) < limit or limit <= 1:
        return ids
    keep = min((len(ids) if num_keep < 0 else num_keep) + int(bos), limit - 1)
    room = limit - max((limit - keep) // 2, 1)  # the prompt's tokens after the cut
    return ids[:keep] + ids[keep + len(ids) - room:]


def _generate_ids(engine: Engine, manifest: Manifest, req: GeneratePrompt) -> list[int]:
    if req.raw:
        return engine.encode(req.prompt)
    template = req.template or manifest.template
    system = req.system or manifest.system  # as Ollama: an empty `system` keeps the model's
    if req.suffix and not uses_suffix(template):
        fim = fim_tokens(engine.tokenizer.get_added_vocab())
        if fim is None:
            raise ApiError(400, "this model does not support insert: no fill-in-the-middle tokens nor a template using suffix")
        prefix, suffix, middle = fim
        text = f"{prefix}{req.prompt}{suffix}{req.suffix}{middle}"
        return engine.encode(text, add_special_tokens=False)
    # as Ollama: the system message, the model's MESSAGE lines (unless a context continues), the prompt
    messages = ([{"role": "system", "content": system}] if system else []) + \
        (list(manifest.messages or []) if not req.context else []) + [{"role": "user", "content": req.prompt}]
    if template:
        return render(engine, template, messages, prompt=req.prompt, system=system or "", suffix=req.suffix or "")
    if engine.tokenizer.has_chat_template:
        return _apply(engine, lambda: engine.chat_prompt(messages))
    return default_ids(engine, messages)


def default_ids(engine: Engine, messages: list[dict]) -> list[int]:
    """A model without any template: Ollama's default `{{ .Prompt }}` (template.DefaultTemplate), run once
    per turn with `{{ .Response }}` appended as its Parse does: each user turn then the assistant's reply,
    consecutive messages of a role joined by a blank line; system and tool messages are not rendered."""
    text = _apply(engine, lambda: _jinja(to_jinja(DEFAULT_GO_TEMPLATE)).render(messages=messages))
    return engine.encode(text)


def chat_template(engine: Engine, manifest: Manifest) -> str | None:
    """The chat template in force: the manifest's, else the model's own; None when neither exists."""
    if manifest.template:
        return manifest.template
    template = getattr(engine.tokenizer, "chat_template", None) if engine.tokenizer.has_chat_template else None
    if isinstance(template, dict):  # named templates: the one HF uses when tools are given
        template = template.get("tool_use") or template.get("default")
    return template if isinstance(template, str) else None


def reply_splitter(engine: Engine, manifest: Manifest, ids: list[int], think, template: str | None = None):
    """What splits the reply's text: harmony's messages for gpt-oss (always: its reasoning channel is
    never content; calls come from its commentary channel), a think block where `think` asked for the
    reasoning, else nothing (None). `template`: a request's own, in place of the model's."""
    template = template or chat_template(engine, manifest)
    if is_harmony(template):
        return HarmonySplitter()
    return splitter_for(template, engine.tokenizer.decode(ids[-8:]), think)


def chat_build(manifest: Manifest, name: str, messages: list[dict], tools: list | None, think, found,
               num_ctx: int | None = None, truncate: bool = True):
    """A chat Job's `build`: the prompt's ids, and in `found` (tool_calls.Found) the reply's call
    format, the request's tools and what splits the reply's text. `truncate` (Ollama's, default true):
    a conversation longer than the context window (num_ctx, at most the model's) loses its oldest messages."""
    def build(engine: Engine) -> list[int]:
        found.format, found.tools = tool_format(engine, manifest, name, tools), tools
        limit = context_window(num_ctx, engine.context_length) if truncate else None  # as the engine decides it
        ids = fitting_chat_ids(engine, manifest, messages, tools, think, limit)
        found.thinking = reply_splitter(engine, manifest, ids, think)
        return ids

    return build


def fitting_chat_ids(engine: Engine, manifest: Manifest, messages: list[dict], tools: list | None, think,
                     limit: int | None) -> list[int]:
    """chat_ids of the longest tail of the conversation that leaves a token of `limit` to answer, as Ollama's
    chatPrompt (server/prompt.go) truncates: the oldest messages go first, system messages stay, the last
    message always (too long alone, the engine refuses it: a 400). None: the whole conversation."""
    ids = chat_ids(engine, manifest, messages, tools, think)
    if limit is None or len(ids) < limit or len(messages) < 2:
        return ids

    def tail(i: int) -> list[int]:  # without messages[:i], but for their system messages
        kept = [m for m in messages[:i] if m.get("role") == "system"] + messages[i:]
        return chat_ids(engine, manifest, kept, tools, think)

    lo, hi = 1, len(messages) - 1  # the first kept message: the smallest that fits (a binary search: each
    best = tail(hi)                # try renders the template, and fewer messages never make a longer prompt)
    while lo < hi and len(best) < limit:
        mid = (lo + hi) // 2
        ids = tail(mid)
        if len(ids) < limit:
            hi, best = mid, ids
        else:
            lo = mid + 1
    if len(best) < limit:
        log.info("chat truncated to fit %d tokens: the oldest %d of %d messages left out", limit, hi, len(messages))
    return best


def tool_format(engine: Engine, manifest: Manifest, name: str, tools: list | None) -> str | None:
    """The call format of a chat request offering `tools` (None: none, or calls stay text). A model
    whose template never shows it the tools is refused as Ollama refuses it (no `.Tools` there): 400
    "NAME does not support tools", so that a client falls back to tools described in text rather
    than hearing the model call none. A template that shows them in a call format mlxspec does not
    parse is served, its calls left in the text."""
    if not tools:
        return None
    template = chat_template(engine, manifest)
    if not shows_tools(template):
        raise ApiError(400, f"{name} does not support tools")
    return detect(template)


def chat_ids(
    engine: Engine, manifest: Manifest, messages: list[dict], tools: list | None = None, think: bool | str | None = None
) -> list[int]:
    """/api/chat and /v1/chat/completions: the conversation through the chat template. As Ollama: the
    model's MESSAGE lines come first, and its system message when the request does not start with one."""
    first = messages[0]["role"] if messages else None
    messages = list(manifest.messages or []) + messages
    if manifest.system and first != "system":
        messages = [{"role": "system", "content": manifest.system}] + messages
    template = chat_template(engine, manifest)
    extra = {"tools": tools} if tools else {}
    extra.update(think_variables(template, think))
    if not manifest.template and not engine.tokenizer.has_chat_template:  # a base model: Ollama's default
        # (the tokenizer may have a renderer of its own without template text: hence not `template`)
        return default_ids(engine, messages)
    if manifest.template:
        return render(engine, manifest.template, messages, **extra)
    return _apply(engine, lambda: engine.chat_prompt(messages, **extra))


def think_variables(template: str | None, think: bool | str | None) -> dict:
    """`think` for templates that know it: Qwen3-style `enable_thinking`, gpt-oss `reasoning_effort` (a level;
    `true` is Ollama's default, medium). Turning thinking off where a template has no switch is a no-op (as
    Ollama); asking for it is a 400."""
    if think is None:
        return {}
    template = template or ""
    if "reasoning_effort" in template and (isinstance(think, str) or (think is True and "enable_thinking" not in template)):
        return {"reasoning_effort": think if isinstance(think, str) else "medium"}  # true: Ollama's default level
    if "enable_thinking" in template:
        return {"enable_thinking": bool(think)}
    if not think:
        return {}
    raise ApiError(400, "think: this model's chat template has no thinking switch (enable_thinking); leave think out")


def _jinja(source: str):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment(extensions=[loopcontrols]).from_string(source)


def render(engine: Engine, template: str, messages: list[dict], **variables) -> list[int]:
    """Token ids of `messages` through a chat template given as text (Jinja, or Go translated to Jinja).
    A trailing assistant message: a Jinja template continues it; Ollama's Go templates and renderers
    decide themselves, as in Ollama (a per-turn template stops after `.Response`; Gemma 4's opens a new turn)."""
    ollamas = is_go_template(template) or renderer_of(template) is not None
    try:
        source = chat_source(template)  # GoTemplateError (a 400) when outside the subset mlxspec translates
    except RecursionError:  # {{ if }} in {{ if }} ... thousands deep: the translator recurses per level
        raise ApiError(400, "template error: its blocks nest too deeply") from None
    return _apply(engine, lambda: engine.chat_prompt(messages, source, prefill=False if ollamas else None, **variables))


def _apply(engine: Engine, fn):
    """Render a template; its failures are the caller's: the template (request or create) or the
    messages it was given. Jinja passes Python's own errors through ({{ 1/0 }}, {{ prompt + 1 }},
    {{ 'a'.index('b') }}, {{ 'a' * 10**13 }}, a macro calling itself, a filter's assertion): any error
    that comes out of Jinja, compiling or running the template, is the template's."""
    from jinja2 import TemplateError

    try:
        return limited(fn)
    except PromptError as e:  # e.g. a template that hides the assistant message it was to continue
        raise ApiError(400, str(e)) from None
    except TemplateLimitError as e:
        raise ApiError(400, f"template error: {e}") from None
    except (TemplateError, ArithmeticError, LookupError, TypeError) as e:
        raise ApiError(400, f"template error: {type(e).__name__}: {e}") from None
    except Exception as e:  # noqa: BLE001  # ours (a tokenizer's, transformers') unless Jinja raised it
        if not _from_jinja(e):
            raise
        why = ("it asked for more memory than there is" if isinstance(e, MemoryError) else
               "it nests or recurses too deeply" if isinstance(e, RecursionError) else str(e)[:200])
        raise ApiError(400, f"template error: {type(e).__name__}: {why}") from None


def _from_jinja(e: BaseException) -> bool:
    """Did `e` come from compiling or running a template: a frame of the template's own code ("<template>"
    once Jinja rewrote the traceback) or of Jinja's (its compiler, its filters) on the way?"""
    tb = e.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == "<template>" or f"{os.sep}jinja2{os.sep}" in code.co_filename:
            return True
        tb = tb.tb_next
    return False


def check_messages(messages, openai: bool = False) -> list[dict]:
    """Validate chat messages (on the event loop, before queueing); returns plain dicts."""
    if not isinstance(messages, list):
        raise ApiError(400, "messages must be a list")
    out, names = [], {}  # names: OpenAI tool_call_id -> function name
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ApiError(400, f"messages[{i}] must be an object")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES + (("developer",) if openai else ()):
            raise ApiError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}")
        if openai and isinstance(content, list):
            content = _text_parts(content, i)
        if content is None and (m.get("tool_calls") or not openai):  # Ollama reads a missing content as "" (its
            content = ""                                               # client drops empty ones)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string")
        if m.get("images"):
            raise ApiError(400, "this model does not support images")
        msg = {"role": "system" if role == "developer" else role, "content": content}
        for key in ("tool_name", "name", "tool_call_id", "thinking"):
            if m.get(key) is not None:
                if not isinstance(m[key], str):
                    raise ApiError(400, f"messages[{i}].{key} must be a string")
                msg[key] = m[key]
        if m.get("tool_calls") is not None:
            msg["tool_calls"] = _tool_calls(m["tool_calls"], i)
            names.update({c["id"]: c["function"]["name"] for c in msg["tool_calls"] if "id" in c})
        if role == "tool" and "tool_name" not in msg and "tool_call_id" in msg and msg["tool_call_id"] in names:
            msg["tool_name"] = names[msg["tool_call_id"]]  # OpenAI names the call by id; Ollama by tool_name
        out.append(msg)
    return out


def _tool_calls(calls, i: int) -> list[dict]:
    """An assistant's earlier calls, as HF chat templates expect them: {"function": {"name",
    "arguments": <object>}} (OpenAI sends the arguments as JSON text), plus OpenAI's id and type."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise ApiError(400, f"{where} must be a list")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(400, f"{where}[{j}] must be {{\"function\": {{\"name\": ..., \"arguments\": ...}}}}")
        args = fn.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                raise ApiError(400, f"{where}[{j}].function.arguments is not valid JSON") from None
        if not isinstance(args, dict):
            raise ApiError(400, f"{where}[{j}].function.arguments must be an object")
        for k in ("id", "type"):  # null: as if absent
            if call.get(k) is not None and not isinstance(call[k], str):
                raise ApiError(400, f"{where}[{j}].{k} must be a string")
        out.append({**{k: call[k] for k in ("id", "type") if call.get(k) is not None},
                    "function": {"name": fn["name"], "arguments": args}})
    return out


def _text_parts(parts: list, i: int) -> str:
    """OpenAI content parts: text only."""
    texts = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            what = "this model does not support images" if isinstance(part, dict) and "image" in str(part.get("type")) else "only text parts are supported"
            raise ApiError(400, f"messages[{i}].content: {what}")
        texts.append(part["text"])
    return "".join(texts)
