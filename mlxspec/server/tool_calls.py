"""Tool calls in generated text -> structured calls, per model family (a name -> parser table).

The engine only produces text; a model asked to call a tool writes the call in its family's own
syntax. Which syntax is read from the chat template's text (`detect`). While streaming, `Splitter`
holds back text from the first call marker on (and a trailing piece that may be the start of one);
at the end the held text becomes calls, or, if it is not a valid call, plain content again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable


@dataclass
class ToolCall:
    name: str
    arguments: dict


Parsed = tuple[str, list[ToolCall]]  # (content outside the calls, the calls)


def _call(obj, args_key: str = "arguments") -> ToolCall | None:
    """{"name": str, <args_key>: object or JSON text of one}; None when it is not a call."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get(args_key, obj.get("arguments", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string, as OpenAI does
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    return ToolCall(obj["name"], args) if isinstance(args, dict) else None


def _json_values(text: str, separators: str = " \t\r\n;,") -> list | None:
    """Consecutive JSON values in `text` (separated by whitespace, ';' or ','); None if anything else."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i] in separators:
            i += 1
        if i == len(text):
            return values
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        values.append(value)


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


def parse_hermes(text: str) -> Parsed | None:
    """Qwen2.5/Qwen3, Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, repeated.
    A last call cut by the end of generation (no closing tag) still counts if its JSON is whole."""
    calls = []
    for body in _HERMES.findall(text):
        values = _json_values(body)
        if not values or len(values) != 1 or (call := _call(values[0])) is None:
            return None
        calls.append(call)
    return (_HERMES.sub("", text).strip(), calls) if calls else None


def parse_llama3(text: str) -> Parsed | None:
    """Llama 3.x: {"name": ..., "parameters": {...}} (several separated by ';'), after an optional
    <|python_tag|>; the JSON must be all that follows, or it is an answer that merely looks like JSON."""
    content, tag, rest = text.partition("<|python_tag|>")
    if not tag:
        content, rest = "", text
    values = _json_values(rest)
    calls = [_call(v, "parameters") for v in values or []]
    return (content.strip(), calls) if calls and all(calls) else None


_MISTRAL_V11 = re.compile(r"\[TOOL_CALLS\]([^\[\]{}\s]+)\[ARGS\]")


def parse_mistral(text: str) -> Parsed | None:
    """Mistral: [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]; newer tokenizers (v11) write
    [TOOL_CALLS]name[ARGS]{...} once per call."""
    content, _, rest = text.partition("[TOOL_CALLS]")
    if _MISTRAL_V11.search(text):
        calls = []
        for name, args in zip(_MISTRAL_V11.findall(text), _MISTRAL_V11.split(text)[2::2]):
            values = _json_values(args)
            call = _call({"name": name, "arguments": values[0]}) if values and len(values) == 1 else None
            if call is None:
                return None
            calls.append(call)
        return content.strip(), calls
    values = _json_values(rest)
    if not values or len(values) != 1 or not isinstance(values[0], list) or not values[0]:
        return None
    calls = [_call(v) for v in values[0]]
    return (content.strip(), calls) if all(calls) else None


_CODER_CALL = re.compile(r"<tool_call>\s*<function=([^>\s]+)>(.*?)</function>\s*(?:</tool_call>|$)", re.S)
_CODER_PARAM = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.S)


def parse_qwen3_coder(text: str) -> Parsed | None:
    """Qwen3-Coder: <tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>,
    repeated; values are text (one newline each side is the format's), typed later by the tool's schema."""
    calls = []
    for name, body in _CODER_CALL.findall(text):
        args = {key: value.removeprefix("\n").removesuffix("\n") for key, value in _CODER_PARAM.findall(body)}
        calls.append(ToolCall(name, args))
    rest = _CODER_CALL.sub("", text)
    return (rest.strip(), calls) if calls and "<tool_call>" not in rest else None


GEMMA4_OPEN, GEMMA4_CLOSE, GEMMA4_STRING = "<|tool_call>", "<tool_call|>", '<|"|>'
_GEMMA4_CALL = re.compile(r"<\|tool_call>\s*call:([^{\s]+)\s*(\{.*?)(?:<tool_call\|>|$)", re.S)
_GEMMA4_QUOTED = re.compile(r'<\|"\|>(.*?)<\|"\|>', re.S)
_GEMMA4_BARE_KEY = re.compile(r"([,{])\s*(\w+)\s*:")


def parse_gemma4(text: str) -> Parsed | None:
    """Gemma 4: <|tool_call>call:NAME{key:value,...}<tool_call|>, repeated (Ollama's model/parsers/gemma4.go):
    bare keys, strings between <|"|> marks, other values as JSON. A call cut by the end of generation
    still counts if it reads whole once its string and braces are closed; stray closing tags are dropped."""
    calls = []
    for name, args in _GEMMA4_CALL.findall(text):
        values = _gemma4_arguments(args)
        if values is None:
            return None
        calls.append(ToolCall(name, values))
    rest = _GEMMA4_CALL.sub("", text).replace(GEMMA4_CLOSE, "")
    return (rest.strip(), calls) if calls and GEMMA4_OPEN not in rest else None


def _gemma4_arguments(args: str) -> dict | None:
    """Gemma 4's argument object as a dict: as written, else with an unclosed string or object closed."""
    for candidate in (args, _gemma4_closed(args)):
        try:
            value = json.loads(_gemma4_json(candidate))
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _gemma4_json(args: str) -> str:
    """The object as JSON: each <|"|>string<|"|> held aside (it may hold anything), bare keys quoted."""
    strings = []

    def hold(match: re.Match) -> str:
        strings.append(match[1])
        return f"\x00{len(strings) - 1}\x00"

    text = _GEMMA4_BARE_KEY.sub(r'\1"\2":', _GEMMA4_QUOTED.sub(hold, args))
    return re.sub("\x00([0-9]+)\x00", lambda m: json.dumps(strings[int(m[1])]), text)


def _gemma4_closed(args: str) -> str:
    """A cut call's arguments closed: the open string (before a final brace, if any), then the object."""
    text = args.rstrip()
    if text.count(GEMMA4_STRING) % 2:
        at = len(text) - 1 if text.endswith(("}", "]")) else len(text)
        text = text[:at] + GEMMA4_STRING + text[at:]
    opened = _GEMMA4_QUOTED.sub("", text)
    return text + "}" * max(0, opened.count("{") - opened.count("}"))


def typed_arguments(calls: list[ToolCall], tools: list | None) -> None:
    """Text arguments to the types their tool's JSON schema declares (integer, number, boolean,
    object, array, null); a value that does not read as its type stays text."""
    schemas = {}
    for tool in tools or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        params = fn.get("parameters") if isinstance(fn, dict) else None
        if isinstance(fn, dict) and isinstance(params, dict) and isinstance(params.get("properties"), dict):
            schemas[fn.get("name")] = params["properties"]
    for call in calls:
        props = schemas.get(call.name, {})
        for key, value in call.arguments.items():
            kind = props.get(key, {}).get("type") if isinstance(props.get(key), dict) else None
            if isinstance(value, str) and kind in _READERS:
                call.arguments[key] = _READERS[kind](value.strip(), value)


def _reader(*types):
    def read(text: str, raw: str):
        try:
            value = json.loads(text)
        except ValueError:
            return raw
        if isinstance(value, bool) != (bool in types):  # True is an int to Python, not to JSON Schema
            return raw
        return value if isinstance(value, types) else raw
    return read


_READERS = {"integer": _reader(int), "number": _reader(int, float), "boolean": _reader(bool),
            "object": _reader(dict), "array": _reader(list), "null": _reader(type(None))}


@dataclass(frozen=True)
class Format:
    parse: Callable[[str], Parsed | None]
    markers: tuple[str, ...]  # a call starts here, anywhere in the output
    leading: tuple[str, ...] = ()  # a call starts here only at the very start of the output
    text_arguments: bool = False  # arguments come as text: typed by the tools' schemas


FORMATS = {
    "qwen3_coder": Format(parse_qwen3_coder, ("<tool_call>",), text_arguments=True),
    "hermes": Format(parse_hermes, ("<tool_call>",)),
    "llama3": Format(parse_llama3, ("<|python_tag|>",), leading=("{",)),
    "mistral": Format(parse_mistral, ("[TOOL_CALLS]",)),
    "gemma4": Format(parse_gemma4, (GEMMA4_OPEN,)),
}


def detect(template: str | None) -> str | None:
    """The call format a chat template teaches its model; None: no known one (output stays text)."""
    template = template or ""
    if GEMMA4_OPEN in template:
        return "gemma4"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_tag|>" in template or ("<|start_header_id|>" in template and "tools" in template):
        return "llama3"
    return None


def shows_tools(template: str | None) -> bool:
    """Does the template show the model its tools (Ollama's `.Tools` rule)? Such a model lists the
    `tools` capability and is offered tools; its calls are parsed where `detect` knows the format."""
    return detect(template) is not None or "tools" in (template or "").lower()


class Splitter:
    """Streamed text -> content that is surely not part of a call; the calls at `finish`."""

    def __init__(self, fmt: Format, tools: list | None = None):
        self.fmt, self.tools = fmt, tools
        self.buf = ""
        self.holding = False  # a marker was seen: everything from it on waits for the end
        self.started = False  # some content already went out: `leading` markers no longer apply

    def feed(self, text: str) -> str:
        self.buf += text
        if self.holding:
            return ""
        head = self.buf.lstrip()
        if not self.started and self.fmt.leading:
            if not head:
                return ""  # only whitespace so far: a leading call may still come
            if head.startswith(self.fmt.leading):
                self.holding = True
                return ""
        found = [i for i in (self.buf.find(m) for m in self.fmt.markers) if i >= 0]
        cut = min(found) if found else len(self.buf) - _partial_marker(self.buf, self.fmt.markers)
        self.holding = bool(found)
        out, self.buf = self.buf[:cut], self.buf[cut:]
        self.started = self.started or bool(out)
        return out

    def finish(self) -> Parsed:
        """The held text as (content, calls); text that is not a valid call is content."""
        text, self.buf = self.buf, ""
        parsed = self.fmt.parse(text) if self.holding else None
        if parsed and self.fmt.text_arguments:
            typed_arguments(parsed[1], self.tools)
        return parsed if parsed else (text, [])


def _partial_marker(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest end of `text` that begins some marker (held back until clear)."""
    return max((n for m in markers for n in range(1, len(m)) if text.endswith(m[:n])), default=0)


async def pieces(events, found: Found | None):
    """(content, calls, event, thinking) per engine event; with a call format, content is held back
    while it may be a call, and the calls come with the last event. `found.thinking`: a
    thinking.ThinkSplitter that first takes the reasoning out of the text, or a
    harmony.HarmonySplitter (reasoning and calls)."""
    fmt, think = (found.format, found.thinking) if found else (None, None)
    splitter = Splitter(FORMATS[fmt], found.tools) if fmt else None
    async for event in events:
        thinking, text = think.feed(event.text) if think else ("", event.text)
        if event.done and think:
            more, rest = think.finish()
            thinking, text = thinking + more, text + rest
        if splitter is None:  # a harmony splitter (gpt-oss) finds the calls itself
            yield text, (getattr(think, "calls", []) if event.done else []), event, thinking
        elif event.done:
            text = splitter.feed(text)
            rest, calls = splitter.finish()
            yield text + rest, calls, event, thinking
        else:
            yield splitter.feed(text), [], event, thinking


async def collect(events) -> tuple[str, list[ToolCall], str, object]:
    """A whole reply from `pieces`: (content, calls, thinking, the last engine event)."""
    text, calls, thoughts, last = [], [], [], None
    async for content, new_calls, event, thinking in events:
        text.append(content), thoughts.append(thinking)
        calls += new_calls
        last = event
    return "".join(text), calls, "".join(thoughts), last


class Found:
    """The call format of a job's model: set while its prompt is built (on the MLX thread), read
    once the job has started; None: no tools in the request, or no known format."""

    format: str | None = None
    tools: list | None = None  # the request's, for formats whose arguments the schemas type
    thinking: object = None  # a ThinkSplitter when the reply's thinking is split off (think requested)
