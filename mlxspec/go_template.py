"""Ollama's Go chat templates (text/template syntax) parsed into a small tree.

    tree = parse("{{ range .Messages }}<|{{ .Role }}|>{{ .Content }}{{ end }}<|assistant|>")

The common subset Ollama's templates use: text; `{{ .System }}`, `{{ .Prompt }}`, `{{ .Response }}`,
`{{ .Suffix }}`; `{{ range .Messages }}` (also `range $i, $m := .Messages`, with `{{ else }}`) and,
inside it, `.Role` / `.Content`; `$.Field` for the top level inside a range; `if` / `else if` /
`else` / `end` with `eq`, `ne`, `not`, `and`, `or`; variables (`$x := ...`, `$x = ...`); `printf`
with `%s`; `break` / `continue`; comments; the `{{-` / `-}}` trim markers. Anything else is a
GoTemplateError naming the construct. go_jinja.py turns the tree into the Jinja the engine renders.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from .errors import MlxspecError

TOP_FIELDS = ("System", "Prompt", "Response", "Suffix", "Messages")
MESSAGE_FIELDS = ("Role", "Content")
FUNCTIONS = ("eq", "ne", "not", "and", "or", "printf")
KEYWORDS = ("if", "else", "end", "range", "break", "continue")


class GoTemplateError(MlxspecError):
    """A Go template outside the subset mlxspec translates (or one Go would not parse)."""


# -- the tree --------------------------------------------------------------------------------------


@dataclass
class Field:
    name: str
    scope: str = "top"  # "top": .Name outside a range; "dollar": $.Name; "message": .Name / $m.Name in a range


@dataclass
class Var:
    name: str  # without the $


@dataclass
class Str:
    value: str


@dataclass
class Call:
    fn: str
    args: list


@dataclass
class Text:
    text: str


@dataclass
class Print:
    expr: object


@dataclass
class Assign:
    var: str
    expr: object
    declare: bool


@dataclass
class If:
    branches: list  # [(condition, body)]
    orelse: list | None = None


@dataclass
class Range:
    body: list
    orelse: list | None = None
    index: str | None = None  # $i in `range $i, $m := .Messages`
    item: str | None = None


@dataclass
class Loop:  # break / continue
    kind: str


@dataclass
class Template:
    body: list
    identifiers: set[str] = field(default_factory=set)  # lower-cased, as Ollama's Template.Vars()

    @property
    def uses_messages(self) -> bool:
        return "messages" in self.identifiers


# -- lexing ----------------------------------------------------------------------------------------

_ACTION = re.compile(r"\{\{(-[ \t\r\n])?")
_TOKEN = re.compile(
    r"""\s*(?:(?P<str>"(?:[^"\\\n]|\\.)*")|(?P<raw>`[^`]*`)|(?P<assign>:=|=)|(?P<punct>[(),|])"""
    r"""|(?P<word>\$?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*|\$(?:\.[A-Za-z_][A-Za-z0-9_]*)*"""
    r"""|\.(?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)?)|(?P<other>[^\s()|,]+|\S))"""
)


def _split(source: str) -> list:
    """Text pieces (str) and actions (list of tokens), with the trim markers applied to the text."""
    out: list = []
    pos, trim_next = 0, False
    while True:
        m = _ACTION.search(source, pos)
        text = source[pos: m.start() if m else len(source)]
        if trim_next:
            text = text.lstrip(" \t\r\n")
        if m and m.group(1):
            text = text.rstrip(" \t\r\n")
        out.append(text)
        if not m:
            return out
        inner, end = _action_body(source, m.end())
        trim_next = re.search(r"[ \t\r\n]-$", inner) is not None
        inner = inner[:-2] if trim_next else inner
        if not inner.strip().startswith("/*"):
            out.append(_tokens(inner.strip()))
        pos = end


def _action_body(source: str, start: int) -> tuple[str, int]:
    """The text of an action up to its closing }} (not one inside a string), and where it ends."""
    if source[start:].lstrip(" \t\r\n").startswith("/*"):  # a comment: {{/* ... */}}, trim markers allowed
        m = re.compile(r"\*/([ \t\r\n]-)?\}\}").search(source, start)
        if not m:
            raise GoTemplateError("TEMPLATE: unclosed comment: write {{/* ... */}}")
        return source[start:m.start() + 2] + (m.group(1) or ""), m.end()
    i, quote = start, None
    while i < len(source):
        c = source[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"`":
            quote = c
        elif source.startswith("}}", i):
            return source[start:i], i + 2
        i += 1
    raise GoTemplateError(f"TEMPLATE: unclosed action {_short('{{' + source[start:start + 30])}")


def _tokens(inner: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(inner):
        m = _TOKEN.match(inner, pos)
        if not m or m.end() == pos:
            break
        kind = m.lastgroup
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    if inner[pos:].strip():
        raise GoTemplateError(f"TEMPLATE: cannot read {_short(inner[pos:])}")
    return tokens


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


# -- parsing ---------------------------------------------------------------------------------------


def parse(source: str) -> Template:
    """The tree of a Go template, or GoTemplateError naming what is outside the subset."""
    parser = _Parser(_split(source))
    body, stop = parser.block(depth=0)
    if stop is not None:
        raise GoTemplateError(f"TEMPLATE: unexpected {{{{ {stop[0]} }}}}")
    return Template(body, parser.identifiers)


class _Parser:
    def __init__(self, items: list):
        self.items = items
        self.pos = 0
        self.identifiers: set[str] = set()
        self.variables: list[set[str]] = [set()]
        self.in_range = 0
        self.range_items: set[str] = set()

    def block(self, depth: int):
        """Nodes up to an {{ else ... }} / {{ end }} (returned as the stop) or the end of the source."""
        nodes: list = []
        while self.pos < len(self.items):
            item = self.items[self.pos]
            self.pos += 1
            if isinstance(item, str):
                if item:
                    nodes.append(Text(item))
                continue
            if not item:
                raise GoTemplateError("TEMPLATE: empty action {{ }}")
            word = item[0][1] if item[0][0] == "word" else None
            if word in ("else", "end"):
                if depth == 0:
                    raise GoTemplateError(f"TEMPLATE: {{{{ {word} }}}} without an if or range")
                return nodes, item
            nodes.append(self.statement(item, word, depth))
        if depth:
            raise GoTemplateError("TEMPLATE: missing {{ end }}")
        return nodes, None

    def statement(self, tokens, word, depth):
        if word == "if":
            return self.if_(tokens[1:], depth)
        if word == "range":
            return self.range_(tokens[1:], depth)
        if word in ("break", "continue"):
            if len(tokens) != 1 or not self.in_range:
                raise GoTemplateError(f"TEMPLATE: {{{{ {word} }}}} outside a range")
            return Loop(word)
        if word in ("with", "define", "template", "block"):
            raise GoTemplateError(f"TEMPLATE: {{{{ {word} }}}} is not supported (mlxspec translates if, range, variables)")
        if len(tokens) >= 2 and tokens[1][0] == "assign" and word and word.startswith("$") and "." not in word:
            return self.assign(word[1:], tokens[1][1] == ":=", tokens[2:])
        return Print(self.pipeline(tokens))

    def assign(self, name: str, declare: bool, tokens) -> Assign:
        expr = self.pipeline(tokens)
        if declare:
            self.variables[-1].add(name)
        elif not any(name in scope for scope in self.variables):
            raise GoTemplateError(f"TEMPLATE: undefined variable ${name}")
        self.identifiers.add("$" + name)
        return Assign(name, expr, declare)

    def if_(self, condition, depth):
        branches, orelse = [], None
        while True:
            self.variables.append(set())
            cond = self.pipeline(condition)
            body, stop = self.block(depth + 1)
            self.variables.pop()
            branches.append((cond, body))
            words = [t[1] for t in stop]
            if words == ["end"]:
                return If(branches, orelse)
            if words[:2] == ["else", "if"]:
                condition = stop[2:]
                continue
            if words == ["else"]:
                self.variables.append(set())
                orelse, stop = self.block(depth + 1)
                self.variables.pop()
                if [t[1] for t in stop] != ["end"]:
                    raise GoTemplateError("TEMPLATE: expected {{ end }} after {{ else }}")
                return If(branches, orelse)
            raise GoTemplateError(f"TEMPLATE: {{{{ {' '.join(words)} }}}} is not supported")

    def range_(self, tokens, depth):
        index = item = None
        values = [t[1] for t in tokens]
        if ":=" in values:  # range $i, $m := .Messages  /  range $m := .Messages
            at = values.index(":=")
            names = [v for v in values[:at] if v != ","]
            if not names or len(names) > 2 or not all(n.startswith("$") and "." not in n for n in names):
                raise GoTemplateError(f"TEMPLATE: cannot read {{{{ range {' '.join(values)} }}}}")
            index, item = (names[0][1:], names[1][1:]) if len(names) == 2 else (None, names[0][1:])
            tokens = tokens[at + 1:]
        target = self.pipeline(tokens)
        if not (isinstance(target, Field) and target.name == "Messages"):
            raise GoTemplateError("TEMPLATE: range is supported over .Messages only")
        if self.in_range:
            raise GoTemplateError("TEMPLATE: a range inside a range is not supported")
        self.variables.append({n for n in (index, item) if n})
        self.range_items = {item} if item else set()
        self.in_range += 1
        body, stop = self.block(depth + 1)
        orelse = None
        if [t[1] for t in stop] == ["else"]:
            orelse, stop = self.block(depth + 1)
        self.in_range -= 1
        self.range_items = set()
        self.variables.pop()
        if [t[1] for t in stop] != ["end"]:
            raise GoTemplateError("TEMPLATE: expected {{ end }} to close the range")
        return Range(body, orelse, index, item)

    # -- expressions -------------------------------------------------------------------------------

    def pipeline(self, tokens):
        if any(t == ("punct", "|") for t in tokens):
            raise GoTemplateError("TEMPLATE: pipelines (|) are not supported")
        if not tokens:
            raise GoTemplateError("TEMPLATE: missing value")
        kind, value = tokens[0]
        if kind == "word" and value in FUNCTIONS:
            return self.call(value, tokens[1:])
        if kind == "word" and value[0] not in ".$" and value not in KEYWORDS:
            raise GoTemplateError(f"TEMPLATE: function {value!r} is not supported (mlxspec knows {', '.join(FUNCTIONS)})")
        if len(tokens) > 1:
            raise GoTemplateError(f"TEMPLATE: cannot read {_short(' '.join(t[1] for t in tokens))}")
        return self.operand(tokens[0])

    def call(self, fn: str, tokens) -> Call:
        args, i = [], 0
        while i < len(tokens):
            if tokens[i] == ("punct", "("):
                close = _closing(tokens, i)
                args.append(self.pipeline(tokens[i + 1: close]))
                i = close + 1
            else:
                args.append(self.operand(tokens[i]))
                i += 1
        wanted = {"not": (1, 1), "eq": (2, 99), "ne": (2, 2), "and": (1, 99), "or": (1, 99), "printf": (1, 99)}[fn]
        if not wanted[0] <= len(args) <= wanted[1]:
            raise GoTemplateError(f"TEMPLATE: wrong number of arguments for {fn}")
        if fn == "printf":
            if not isinstance(args[0], Str):
                raise GoTemplateError("TEMPLATE: printf needs a format string")
            verbs = re.findall(r"%(.)", args[0].value.replace("%%", ""))
            if any(v != "s" for v in verbs) or len(verbs) != len(args) - 1:
                raise GoTemplateError(f"TEMPLATE: printf {_short(args[0].value)}: only %s verbs, one per argument")
        return Call(fn, args)

    def operand(self, token):
        kind, value = token
        if kind == "str":
            try:
                return Str(ast.literal_eval(value))
            except (ValueError, SyntaxError):
                raise GoTemplateError(f"TEMPLATE: bad string {_short(value)}") from None
        if kind == "raw":
            return Str(value[1:-1])
        if kind == "word" and value.startswith("$."):
            return self.field(value[2:], "dollar")
        if kind == "word" and value.startswith("."):
            return self.field(value[1:], "message" if self.in_range else "top")
        if kind == "word" and value.startswith("$"):
            name, _, attr = value[1:].partition(".")
            if attr and name in self.range_items:  # $m.Content in `range $i, $m := .Messages`
                return self.field(attr, "message")
            if not name or attr:
                raise GoTemplateError(f"TEMPLATE: {value} is not supported (use $.Field or a variable)")
            if not any(name in scope for scope in self.variables):
                raise GoTemplateError(f"TEMPLATE: undefined variable {value}")
            self.identifiers.add(value)
            return Var(name)
        if kind == "word" and value in KEYWORDS:
            raise GoTemplateError(f"TEMPLATE: unexpected {value!r}")
        if kind == "word":
            raise GoTemplateError(f"TEMPLATE: function {value!r} is not supported (mlxspec knows {', '.join(FUNCTIONS)})")
        raise GoTemplateError(f"TEMPLATE: {_short(value)} is not supported")

    def field(self, name: str, scope: str) -> Field:
        if not name:
            raise GoTemplateError("TEMPLATE: {{ . }} is not supported: name a field such as .Content")
        if "." in name:
            raise GoTemplateError(f"TEMPLATE: .{name} is not supported (nested fields)")
        self.identifiers.add(name.lower())
        allowed = MESSAGE_FIELDS if scope == "message" else TOP_FIELDS
        if name not in allowed:
            where = "a message (inside range .Messages)" if scope == "message" else "the template's top level"
            raise GoTemplateError(f"TEMPLATE: .{name} is not supported on {where}: use {', '.join('.' + f for f in allowed)}")
        return Field(name, scope)


def _closing(tokens, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(tokens)):
        depth += {("punct", "("): 1, ("punct", ")"): -1}.get(tokens[i], 0)
        if depth == 0:
            return i
    raise GoTemplateError("TEMPLATE: unbalanced parentheses")
