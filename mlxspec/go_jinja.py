"""A Go chat template (Ollama's) as a Jinja chat template that renders what Ollama renders.

    jinja = to_jinja('{{ if .System }}{{ .System }} {{ end }}{{ .Prompt }}')   # GoTemplateError if outside the subset
    source = chat_source(template)   # a Go template translated, a Jinja one as it is

The Jinja takes what every chat template takes (`messages`, plus `prompt` / `suffix` on
/api/generate) and does what Ollama's template.Execute does (template/template.go):
- consecutive messages of one role are joined with a blank line (not tool messages); the system
  messages, joined the same way, are `.System`;
- with a suffix and a prompt: one pass with `.Prompt` and `.Suffix` (fill-in-the-middle);
- a template that uses `.Messages`: one pass with `.System` and `.Messages`, `.Response` empty;
- any other template runs once per turn with `.System` / `.Prompt` / `.Response`, and the last turn
  stops after the first `{{ .Response }}` (what the model writes next); a template naming neither
  `.Messages` nor `.Response` gets `{{ .Response }}` appended, as Ollama's Parse does.
No template text is left as Jinja data (every piece is a string literal), so the output is the
same whatever trim_blocks / lstrip_blocks the renderer uses (transformers turns both on).
"""

from __future__ import annotations

import functools
import re

from .go_template import Assign, Call, Field, If, Loop, Print, Range, Str, Text, Var, parse

# Ollama's template for a model without one (template.DefaultTemplate).
DEFAULT_GO_TEMPLATE = "{{ .Prompt }}"
# an action starting with .Field, $var, a comment, a Go keyword, or a function applied to .Field / $var
_GO_ACTION = re.compile(r"\{\{-?\s*(?:\.|\$|/\*|(?:if|range|with|define|template|block)\b|[A-Za-z_]\w*\s+[.$(])")
_ARGS = "System, Prompt, Response, Suffix, Messages"


def is_go_template(text: str) -> bool:
    """Ollama's Go syntax ({{ .Prompt }}, {{ if .System }}...) rather than Jinja ({% ... %}, {{ messages }})."""
    return "{%" not in text and "{#" not in text and _GO_ACTION.search(text) is not None


def chat_source(template: str) -> str:
    """The Jinja to render: a Go template translated (GoTemplateError when it cannot be), Jinja as it is."""
    return to_jinja(template) if is_go_template(template) else template


def uses_suffix(template: str | None) -> bool:
    """Whether a template (Go or Jinja) renders the fill-in-the-middle suffix."""
    if not template:
        return False
    return ".Suffix" in template if is_go_template(template) else "suffix" in template


@functools.lru_cache(maxsize=256)
def to_jinja(source: str) -> str:
    tree = parse(source)
    body = tree.body
    if not tree.uses_messages and "response" not in tree.identifiers:
        body = body + [Print(Field("Response"))]  # Ollama's Parse appends {{ .Response }}
    out = [_macro("_turn", body)]
    if not tree.uses_messages:
        out.append(_macro("_last", _cut(body, [False])))
    out.append(_COLLATE)
    fim = "{% if prompt is defined and prompt and suffix is defined and suffix %}{{ _turn('', prompt, '', suffix, []) }}{% else %}"
    out.append(fim + (_MESSAGES if tree.uses_messages else _TURNS) + "{% endif %}")
    return "".join(out)


# The driver: collate as Ollama does, then one pass (Messages) or a pass per turn (legacy templates).
_COLLATE = (
    "{% set _c = namespace(system=[], msgs=[]) %}{% for m in messages %}"
    "{% if m.role == 'system' %}{% set _c.system = _c.system + [m.content] %}{% endif %}"
    "{% if _c.msgs and _c.msgs[-1].role == m.role and m.role != 'tool' %}"
    "{% set _c.msgs = _c.msgs[:-1] + [{'role': m.role, 'content': _c.msgs[-1].content ~ '\\n\\n' ~ m.content}] %}"
    "{% else %}{% set _c.msgs = _c.msgs + [{'role': m.role, 'content': m.content}] %}{% endif %}{% endfor %}"
)
_MESSAGES = "{{ _turn(_c.system | join('\\n\\n'), '', '', '', _c.msgs) }}"
_FLUSH = ("{{ _turn(_t.system, _t.prompt, _t.response, '', []) }}"
          "{% set _t.system = '' %}{% set _t.prompt = '' %}{% set _t.response = '' %}")
_TURNS = (
    "{% set _t = namespace(system='', prompt='', response='') %}{% for m in _c.msgs %}"
    "{% if m.role == 'system' %}{% if _t.prompt or _t.response %}" + _FLUSH + "{% endif %}{% set _t.system = m.content %}"
    "{% elif m.role == 'user' %}{% if _t.response %}" + _FLUSH + "{% endif %}{% set _t.prompt = m.content %}"
    "{% elif m.role == 'assistant' %}{% set _t.response = m.content %}{% endif %}{% endfor %}"
    "{{ _last(_t.system, _t.prompt, _t.response, '', []) }}"
)


def _macro(name: str, body: list) -> str:
    return f"{{% macro {name}({_ARGS}) %}}{{% set _v = namespace() %}}{_nodes(body, {})}{{% endmacro %}}"


def _cut(nodes: list, cut: list) -> list:
    """Ollama's deleteNode: everything after the first {{ .Response }} goes (if/range conditions are not
    searched, nor $.Response, as there)."""
    out = []
    for n in nodes:
        if cut[0]:
            continue
        if isinstance(n, (Print, Assign)):
            cut[0] = _names_response(n.expr)
            out.append(n)
        elif isinstance(n, If):
            branches = []
            for cond, body in n.branches:
                if cut[0]:
                    break
                branches.append((cond, _cut(body, cut)))
            out.append(If(branches, _cut(n.orelse, cut) if n.orelse is not None else None))
        elif isinstance(n, Range):
            body = _cut(n.body, cut)
            out.append(Range(body, _cut(n.orelse, cut) if n.orelse is not None else None, n.index, n.item))
        else:
            out.append(n)
    return out


def _names_response(expr) -> bool:
    if isinstance(expr, Field):
        return expr.name == "Response" and expr.scope == "top"
    return isinstance(expr, Call) and any(_names_response(a) for a in expr.args)


def _nodes(nodes: list, loop: dict) -> str:
    return "".join(_node(n, loop) for n in nodes)


def _node(n, loop: dict) -> str:
    if isinstance(n, Text):
        return "{{ " + literal(n.text) + " }}"
    if isinstance(n, Print):
        return "{{ " + _expr(n.expr, loop) + " }}"
    if isinstance(n, Assign):
        return f"{{% set _v.{n.var} = {_expr(n.expr, loop)} %}}"
    if isinstance(n, Loop):
        return f"{{% {n.kind} %}}"
    if isinstance(n, If):
        out = ""
        for i, (cond, body) in enumerate(n.branches):
            out += f"{{% {'if' if i == 0 else 'elif'} {_expr(cond, loop)} %}}{_nodes(body, loop)}"
        if n.orelse is not None:
            out += "{% else %}" + _nodes(n.orelse, loop)
        return out + "{% endif %}"
    if isinstance(n, Range):
        inner = {**loop, **({n.index: "_i"} if n.index else {}), **({n.item: "_m"} if n.item else {})}
        out = "{% for _m in Messages %}{% set _i = loop.index0 %}" + _nodes(n.body, inner)
        if n.orelse is not None:
            out += "{% else %}" + _nodes(n.orelse, loop)
        return out + "{% endfor %}"
    raise TypeError(f"unknown node {n!r}")


def _expr(e, loop: dict) -> str:
    if isinstance(e, Str):
        return literal(e.value)
    if isinstance(e, Field):
        return f"_m.{e.name.lower()}" if e.scope == "message" else e.name
    if isinstance(e, Var):
        return loop.get(e.name, f"_v.{e.name}")
    args = [_expr(a, loop) for a in e.args]
    if e.fn == "eq":
        return "(" + " or ".join(f"{args[0]} == {b}" for b in args[1:]) + ")"
    if e.fn == "ne":
        return f"({args[0]} != {args[1]})"
    if e.fn == "not":
        return f"(not {args[0]})"
    if e.fn in ("and", "or"):
        return "(" + f" {e.fn} ".join(args) + ")"
    pieces = e.args[0].value.split("%%")  # printf with %s verbs: a concatenation
    parts, values = [], iter(args[1:])
    for j, piece in enumerate(pieces):
        texts = piece.split("%s")
        for k, text in enumerate(texts):
            parts.append(literal(text))
            if k < len(texts) - 1:
                parts.append(f"({next(values)})")
        if j < len(pieces) - 1:
            parts.append(literal("%"))
    return "(" + " ~ ".join(parts) + ")"


def literal(text: str) -> str:
    """A Jinja string literal for any text (Jinja decodes literals with Python's unicode-escape)."""
    out = []
    for ch in text:
        if ch in "\\\"":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
