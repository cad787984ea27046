"""Modelfiles (Ollama's format): text -> an /api/create request, and a manifest -> text again.

    request = parse(text, base_dir)      # what `mlxspec create NAME -f Modelfile` sends, as Ollama's CLI does
    text = render(name, manifest)        # what `mlxspec show NAME --modelfile` prints; creates the same manifest

Ollama's directives (case-insensitive): FROM (a store name, a local directory or .gguf file, a
Hugging Face repo id), PARAMETER name value (every option mlxspec knows; repeated `stop` lines add
up), TEMPLATE (Go syntax as Ollama writes it, or Jinja), SYSTEM, MESSAGE role content, LICENSE.
mlxspec's own, for speculation and what its manifests hold: DRAFT (a draft model), DRAFTER (none,
draft-model, lookup, early-exit[:N], medusa:NAME, eagle:NAME, eagle3:SOURCE, mtp[:SOURCE]), DRAFT_LENGTH, QUANTIZE, DRAFT_QUANTIZE,
DESCRIPTION. ADAPTER, RENDERER and PARSER are refused by name; REQUIRES (an Ollama version) is read
and ignored. Values: the rest of the line, or "quoted", or \"\"\"on several lines\"\"\" (no escapes,
as in Ollama); `#` starts a comment line.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from .errors import MlxspecError
from .options import GenerateOptions, OptionsError

ROLES = ("system", "user", "assistant")
SINGLE = ("template", "system", "drafter", "quantize", "draft_quantize", "description")  # one value, the field's name
REFUSED = {
    "adapter": "ADAPTER (LoRA adapters) is not supported by mlxspec: merge the adapter into the weights first",
    "renderer": "RENDERER (Ollama's built-in prompt renderers) is not supported: give a TEMPLATE",
    "parser": "PARSER (Ollama's built-in output parsers) is not supported: tool calls are parsed from the template's format",
}
KNOWN = ("from", "parameter", "template", "system", "message", "license", "draft", "drafter", "draft_length",
         "quantize", "draft_quantize", "description", "requires", *REFUSED)
_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
          "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}  # Go's ParseBool


class ModelfileError(MlxspecError):
    """A Modelfile mlxspec cannot read: the message names the line and the directive."""


def parse(text: str, base_dir: str | Path = ".") -> dict:
    """The /api/create body a Modelfile stands for (without `model`); FROM and DRAFT paths (and a DRAFTER's
    source, mtp:PATH) that exist are made absolute (relative ones are relative to `base_dir`, the Modelfile's
    folder); a relative one that does not exist is a ModelfileError. Whether the CLI sends such a path or
    uploads the files it names is frontend/models.py's choice."""
    body: dict[str, Any] = {}
    params: dict[str, Any] = {}
    messages, licenses = [], []
    for line, name, args in commands(text):
        where = f"Modelfile line {line}: {name.upper()}"
        if name in REFUSED:
            raise ModelfileError(f"Modelfile line {line}: {REFUSED[name]}")
        if name in ("from", "draft"):
            key = "from" if name == "from" else "draft"
            if key in body:
                raise ModelfileError(f"{where} is given twice")
            body[key] = _reference(args, Path(base_dir), where)
        elif name == "parameter":
            key, _, value = args.partition(" ")  # commands() wrote "name value"
            _parameter(params, key, value, where)
        elif name == "message":
            role, _, content = args.partition(" ")
            if role not in ROLES:
                raise ModelfileError(f"{where} role must be one of {', '.join(ROLES)}, not {role!r}")
            messages.append({"role": role, "content": content})
        elif name == "license":
            licenses.append(args)
        elif name == "draft_length":
            if not re.fullmatch(r"[+-]?\d+", args):
                raise ModelfileError(f"{where} must be an integer, not {args!r}")
            body["draft_length"] = int(args)
        elif name == "drafter":  # eagle:PATH, medusa:PATH, mtp:PATH: a path relative to the Modelfile too
            kind, colon, arg = args.partition(":")
            body[name] = f"{kind}:{_reference(arg, Path(base_dir), where)}" if colon and arg else args
        elif name in SINGLE:
            body[name] = args
    if "from" not in body:
        raise ModelfileError("Modelfile: no FROM line")
    if params:
        try:
            GenerateOptions.from_dict(params)
        except OptionsError as e:
            raise ModelfileError(f"Modelfile PARAMETER: {e}") from None
        body["parameters"] = params
    if messages:
        body["messages"] = messages
    if licenses:
        body["license"] = licenses
    return body


def commands(text: str) -> list[tuple[int, str, str]]:
    """(line number, directive lower-cased, its value) for each directive; values unquoted. PARAMETER and
    MESSAGE values are "name value" / "role content" (the content quoted or not)."""
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    out, pos, line = [], 0, 1
    while pos < len(text):
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        raw = text[pos:end].strip(" \t")
        if not raw or raw.startswith("#"):
            pos, line = end + 1, line + 1
            continue
        m = re.match(r"([A-Za-z_]+)(?:[ \t]+|$)", raw)
        if not m or m.group(1).lower() not in KNOWN:
            raise ModelfileError(f"Modelfile line {line}: unknown directive {raw.split()[0]!r}; use FROM, PARAMETER, "
                                 "TEMPLATE, SYSTEM, MESSAGE, LICENSE, DRAFT, DRAFTER, DRAFT_LENGTH, QUANTIZE, "
                                 "DRAFT_QUANTIZE, DESCRIPTION")
        name = m.group(1).lower()
        at = text.index(raw, pos) + m.end()
        word = ""
        if name in ("parameter", "message"):  # a name or role first, then the value proper
            w = re.match(r"([^ \t\n]*)[ \t]*", text[at:])
            word, at = w.group(1), at + w.end()
            if not word:
                raise ModelfileError(f"Modelfile line {line}: {name.upper()} needs a name and a value")
        value, end = _value(text, at, line, name)
        out.append((line, name, f"{word} {value}" if word else value))
        line += text.count("\n", pos, end) + 1
        pos = end + 1
    return [c for c in out if c[1] != "requires"]  # REQUIRES: the minimum Ollama version, nothing to check


def _value(text: str, at: int, line: int, name: str) -> tuple[str, int]:
    """The value starting at `at` and where its (last) line ends: bare (the rest of the line, trimmed),
    "..." or \"\"\"...\"\"\" (which may span lines)."""
    for quote in ('"""', '"'):
        if text.startswith(quote, at):
            return _quoted(text, at, quote, line, name)
    end = text.find("\n", at)
    end = len(text) if end < 0 else end
    return text[at:end].strip(" \t"), end


def _quoted(text: str, at: int, quote: str, line: int, name: str) -> tuple[str, int]:
    """A quoted value: it ends at the first closing quote followed by a space, a line end or the end."""
    search = at + len(quote)
    while True:
        close = text.find(quote, search)
        if close < 0:
            raise ModelfileError(f"Modelfile line {line}: {name.upper()} has an unclosed {quote}")
        after = close + len(quote)
        if after >= len(text) or text[after] in " \t\n":
            break
        search = close + 1
    end = text.find("\n", after)
    end = len(text) if end < 0 else end
    if text[after:end].strip(" \t"):
        raise ModelfileError(f"Modelfile line {line}: text after the closing {quote} of {name.upper()}")
    return text[at + len(quote): close], end


def _parameter(params: dict, key: str, value: str, where: str) -> None:
    kinds = GenerateOptions.names()
    if key not in kinds:
        raise ModelfileError(f"{where} {key!r}: unknown parameter; mlxspec knows {', '.join(sorted(kinds))}")
    kind = kinds[key]
    if kind is list:
        params.setdefault(key, []).append(value)
    elif kind is bool and value in _BOOLS:
        params[key] = _BOOLS[value]
    elif kind is int and re.fullmatch(r"[+-]?\d+", value):
        params[key] = int(value)
    elif kind is float and _finite(value):
        params[key] = float(value)
    else:
        what = {bool: "true or false", int: "an integer", float: "a finite number"}[kind]
        raise ModelfileError(f"{where} {key} must be {what}, not {value!r}")


def _finite(value: str) -> bool:
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False


def _reference(ref: str, base: Path, where: str) -> str:
    """A path that exists, made absolute (as Ollama's expandPath), else the name or repo id as written;
    a relative path (./x, ../x) that is not there is a mistake, not a name."""
    if not ref:
        raise ModelfileError("Modelfile: FROM and DRAFT need a model")
    path = Path(ref).expanduser()
    path = path if path.is_absolute() else base / path
    try:
        if path.exists():
            return str(path.resolve())
    except (OSError, ValueError):  # a name too long for a path, a NUL byte: not a path then
        return ref
    if ref in (".", "..") or ref.startswith(("./", "../")):
        raise ModelfileError(f"{where} {ref}: no such file or directory ({path})")
    return ref


# -- manifest -> Modelfile -------------------------------------------------------------------------


def render(name: str, manifest) -> str:
    """A Modelfile that creates `manifest` again (FROM names its weights, not the model it came from)."""
    m = manifest
    lines = [f"# Modelfile of {name}, written by mlxspec show --modelfile", f"FROM {quote(m.target)}"]
    lines += [f"DRAFT {quote(m.draft)}"] if m.draft else []
    for key in ("drafter", "draft_length", "quantize", "draft_quantize", "description"):
        value = getattr(m, key)
        lines += [f"{key.upper()} {quote(str(value))}"] if value is not None else []
    lines += [f"TEMPLATE {quote(m.template)}"] if m.template is not None else []
    lines += [f"SYSTEM {quote(m.system)}"] if m.system is not None else []
    for key, value in m.parameters.items():
        for v in value if isinstance(value, list) else [value]:
            lines.append(f"PARAMETER {key} {quote(_format(v))}")
    lines += [f"MESSAGE {msg['role']} {quote(msg['content'])}" for msg in m.messages or []]
    lines += [f"LICENSE {quote(text)}" for text in m.license or []]
    return "\n".join(lines) + "\n"


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def quote(value: str) -> str:
    """The value as a Modelfile writes it: bare when that reads back the same, else in quotes."""
    for form in (value, f'"{value}"', f'"""{value}"""'):
        if form == value and (not value or value[0] == '"' or value != value.strip() or "\n" in value):
            continue
        try:
            if commands(f"SYSTEM {form}") == [(1, "system", value)]:
                return form
        except ModelfileError:
            continue
    raise ModelfileError(f"cannot write {value[:40]!r} in a Modelfile (it holds its own closing quotes)")
