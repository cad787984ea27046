"""Ollama's built-in prompt renderers, as Jinja chat templates that render what Ollama renders.

Ollama's newer library models (Gemma 4 among them) ship no TEMPLATE layer: their config blob names a
renderer written in Go ("renderer": "gemma4") that Ollama's server formats chat prompts with
(server/prompt.go renderPrompt: a named renderer wins over any template). `template_for` gives the
equivalent chat template for the renderers mlxspec knows, so that the model chats as under Ollama.

Source: github.com/ollama/ollama at fb30760996871fa9460115c753afd2c60d4ab0f7 (2026-08-21):
model/renderers/gemma4.go (last changed in 8a0016f826305b0672daaf02c6c55a34f844bba3), the names in
model/renderers/renderer.go (rendererForName) and server/renderer_resolution.go (which variant "gemma4"
means). Covered: system/developer, user and assistant messages, assistant turns continued across adjacent
assistant messages, thinking stripped from assistant history, the generation prompt, thinking on or off
(`enable_thinking`: Ollama's `think`; the reply's <|channel>thought block is split off by
server/thinking.py), tools declared in the system turn (their JSON schemas as gemma4.go writes them), an
assistant's calls and the tool results after them (named by tool name or call id) in its model turn, and an
assistant's `thinking` after the last user message; the reply's calls are parsed by server/tool_calls.py.
Not covered: images ([img-N] tags).
"""

from __future__ import annotations

import re

GEMMA4_SMALL, GEMMA4_LARGE = "gemma4-small", "gemma4-large"
# renderer_resolution.go: the legacy name means small or large by the model's name, then its size
GEMMA4_LEGACY, GEMMA4_LARGE_MIN_PARAMETERS = "gemma4", 12_000_000_000

# Go's strings.TrimSpace (unicode.IsSpace), which Python's str.strip exceeds (it also strips \x1c-\x1f).
_GO_SPACE = r"' \t\n\v\f\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000'"


Q = '<|"|>'  # Gemma 4's string delimiter
_SEP = "\\x1f"  # joins a schema's type names inside the template

# Macros of the renderer's formatting (gemma4.go), each writing its text directly:
# _arg(x, q): formatArgValue (a call's arguments, a tool's response), q: formatSchemaValue's quoted keys.
#   null, booleans, numbers as Go prints them (a whole float as an integer), strings between Q marks, maps in
#   Go's sorted key order (dictsort(true): by code point, as sort.Strings), arrays in order.
# _types(t): a schema's type names upper-cased, joined by _SEP ('' when none).
# _list(xs): strings as [Q x Q, ...].
# _props(props, top, skip): writeSchemaProperties, each property (sorted) as name:{description, enum (strings),
#   items (arrays), nullable, properties and required (objects), type}. `top`: reached from the tool's
#   parameters through `properties` (Ollama's typed ToolProperty: only its fields count, an anyOf of bare types
#   is their union, and several types print as one string "['A', 'B']"); inside `items`, several types print
#   as a list. `skip`: an object
#   without `properties` lists its other keys' schemas (standard keys skipped).
# _items(items): writeSchemaItemsSpec. _decl(tool): renderToolDeclaration.
_MACROS = "".join([
    "{%- macro _arg(x, q) -%}",
    "{%- if x is none -%}{{- 'null' -}}",
    "{%- elif x is boolean -%}{{- 'true' if x else 'false' -}}",
    "{%- elif x is string -%}{{- Q + x + Q -}}",
    "{%- elif x is mapping -%}{{- '{' -}}{%- for k, v in x | dictsort(true) -%}",
    "{{- (',' if not loop.first else '') + (Q + k + Q if q else k) + ':' -}}{{- _arg(v, q) -}}{%- endfor -%}{{- '}' -}}",
    "{%- elif x is number -%}{{- (x | int | string) if x == (x | int) else (x | string) -}}",
    "{%- elif x is iterable -%}{{- '[' -}}{%- for v in x -%}{{- ',' if not loop.first else '' -}}{{- _arg(v, q) -}}",
    "{%- endfor -%}{{- ']' -}}",
    "{%- else -%}{{- x | string -}}{%- endif -%}",
    "{%- endmacro -%}",
    "{%- macro _types(t) -%}",
    "{%- if t is string -%}{{- t | upper -}}",
    "{%- elif t is iterable and t is not mapping -%}{{- t | select('string') | map('upper') | join(SEP) -}}{%- endif -%}",
    "{%- endmacro -%}",
    "{%- macro _list(xs) -%}{{- '[' -}}{%- for x in xs -%}{{- (',' if not loop.first else '') + Q + (x | string) + Q -}}",
    "{%- endfor -%}{{- ']' -}}{%- endmacro -%}",
    "{%- macro _props(props, top, skip=false) -%}",
    "{%- set _p = namespace(first=true) -%}",
    "{%- for name, prop in props | dictsort(true) -%}",
    "{%- if prop is mapping and not (skip and (name in STANDARD or (top and name not in TYPED))) -%}",
    "{{- (',' if not _p.first else '') + name + ':{' -}}{%- set _p.first = false -%}",
    "{%- set _c = namespace(comma=false) -%}",
    "{%- if prop['description'] is string and prop['description'] -%}",
    "{{- 'description:' + Q + prop['description'] + Q -}}{%- set _c.comma = true -%}{%- endif -%}",
    "{%- set tn = _types(prop['type']) -%}",
    # a typed property without a type whose anyOf branches each say only a type: their union (simpleAnyOfTypes)
    "{%- set any = prop['anyOf'] -%}",
    "{%- if top and not tn and any is iterable and any is not string and any is not mapping and any | length -%}",
    "{%- set _a = namespace(ok=true, names=[]) -%}",
    "{%- for b in any -%}",
    "{%- if b is mapping and _types(b['type']) and not ('items' in b or b['description'] or b['enum']",
    " or 'properties' in b or b['required'] or b['anyOf']) -%}",  # ('items' in b: b['items'] is dict.items)
    "{%- for t in _types(b['type']).split(SEP) -%}{%- if t not in _a.names -%}{%- set _a.names = _a.names + [t] -%}",
    "{%- endif -%}{%- endfor -%}",
    "{%- else -%}{%- set _a.ok = false -%}{%- endif -%}{%- endfor -%}",
    "{%- if _a.ok -%}{%- set tn = _a.names | join(SEP) -%}{%- endif -%}{%- endif -%}",
    "{%- set types = tn.split(SEP) if tn else [] -%}",
    "{%- if top and types | length > 1 -%}{%- set types = [\"['\" + types | join(\"', '\") + \"']\"] -%}{%- endif -%}",
    "{%- set kind = types[0] if types else '' -%}",
    "{%- set enum = prop['enum'] -%}",
    "{%- if kind == 'STRING' and enum is iterable and enum is not string and enum is not mapping and enum | length -%}",
    "{{- (',' if _c.comma else '') + 'enum:' + _list(enum) -}}{%- set _c.comma = true -%}",
    "{%- elif kind == 'ARRAY' and prop['items'] is mapping and prop['items'] | length -%}",
    "{{- (',' if _c.comma else '') + 'items:{' -}}{{- _items(prop['items']) -}}{{- '}' -}}{%- set _c.comma = true -%}",
    "{%- endif -%}",
    "{%- if not top and prop['nullable'] is sameas true -%}",
    "{{- (',' if _c.comma else '') + 'nullable:true' -}}{%- set _c.comma = true -%}{%- endif -%}",
    "{%- if kind == 'OBJECT' -%}",
    "{{- (',' if _c.comma else '') + 'properties:{' -}}{%- set _c.comma = true -%}",
    "{%- if prop['properties'] is mapping -%}{{- _props(prop['properties'], top) -}}",
    "{%- else -%}{{- _props(prop, top, true) -}}{%- endif -%}{{- '}' -}}",
    "{%- set req = prop['required'] -%}",
    "{%- if req is iterable and req is not string and req is not mapping and req | select('string') | list -%}",
    "{{- ',required:' + _list(req | select('string') | list) -}}{%- endif -%}",
    "{%- endif -%}",
    "{%- if types | length == 1 -%}{{- (',' if _c.comma else '') + 'type:' + Q + types[0] + Q -}}",
    "{%- elif types -%}{{- (',' if _c.comma else '') + 'type:' + _list(types) -}}{%- endif -%}",
    "{{- '}' -}}",
    "{%- endif -%}{%- endfor -%}",
    "{%- endmacro -%}",
    "{%- macro _items(items) -%}",
    "{%- set _i = namespace(first=true) -%}",
    "{%- for key, value in items | dictsort(true) -%}{%- if value is not none -%}",
    "{{- '' if _i.first else ',' -}}{%- set _i.first = false -%}",
    "{%- if key == 'properties' -%}{{- 'properties:{' -}}{%- if value is mapping -%}{{- _props(value, false) -}}",
    "{%- endif -%}{{- '}' -}}",
    "{%- elif key == 'required' -%}{{- 'required:' + _list(value | select('string') | list) -}}",
    "{%- elif key == 'type' -%}{%- set tn = _types(value) -%}{%- set ts = tn.split(SEP) if tn else [] -%}",
    "{%- if ts | length == 1 -%}{{- 'type:' + Q + ts[0] + Q -}}{%- elif ts -%}{{- 'type:' + _list(ts) -}}{%- endif -%}",
    "{%- else -%}{{- key + ':' -}}{{- _arg(value, true) -}}{%- endif -%}",
    "{%- endif -%}{%- endfor -%}",
    "{%- endmacro -%}",
    "{%- macro _decl(tool) -%}",
    "{%- set fn = tool['function'] if tool['function'] is mapping else tool -%}",
    "{%- set params = fn['parameters'] if fn['parameters'] is mapping else {} -%}",
    "{{- '<|tool>declaration:' + fn['name'] + '{description:' + Q + (fn['description'] or '') + Q -}}",
    "{%- if params['properties'] is mapping or params['type'] -%}",
    "{{- ',parameters:{' -}}{%- set _d = namespace(comma=false) -%}",
    "{%- if params['properties'] is mapping and params['properties'] | length -%}",
    "{{- 'properties:{' -}}{{- _props(params['properties'], true) -}}{{- '}' -}}{%- set _d.comma = true -%}{%- endif -%}",
    "{%- set req = params['required'] -%}",
    "{%- if req is iterable and req is not string and req is not mapping and req | length -%}",
    "{{- (',' if _d.comma else '') + 'required:' + _list(req) -}}{%- set _d.comma = true -%}{%- endif -%}",
    "{%- if params['type'] -%}{{- (',' if _d.comma else '') + 'type:' + Q + params['type'] | upper + Q -}}{%- endif -%}",
    "{{- '}' -}}",
    "{%- endif -%}",
    "{{- '}<tool|>' -}}",
    "{%- endmacro -%}",
])


def _gemma4(large: bool) -> str:
    """Gemma4Renderer.Render (gemma4.go): tools declared in the system turn, an assistant's calls and the
    tool results after them in its model turn; thinking is the template's `enable_thinking` (Ollama's
    think). No literal newline outside string literals: the output is the same under any trim_blocks /
    lstrip_blocks."""
    return "".join([
        "{%- set _ws = " + _GO_SPACE + " -%}",
        "{%- set Q = '" + Q + "' -%}{%- set SEP = '" + _SEP + "' -%}",
        "{%- set STANDARD = ['description', 'type', 'properties', 'required', 'nullable'] -%}",
        "{%- set TYPED = ['type', 'description', 'enum', 'items', 'properties', 'required'] -%}",
        _MACROS,
        "{%- set _think = enable_thinking is defined and enable_thinking -%}",
        "{%- set _tools = tools if tools is defined and tools else [] -%}",
        "{{- '<bos>' -}}",  # emitted as text: Gemma 4's tokenizer adds no BOS itself
        "{%- set _g = namespace(start=0, prev='', type='') -%}",
        # a system turn for a leading system or developer message (trimmed, even when empty), tools or thinking
        "{%- set _system = messages and messages[0].role in ['system', 'developer'] -%}",
        "{%- if _system or _tools or _think -%}",
        "{{- '<|turn>system\\n' + ('<|think|>\\n' if _think else '') -}}",
        "{%- if _system -%}{{- messages[0].content | trim(_ws) -}}{%- set _g.start = 1 -%}{%- endif -%}",
        "{%- for tool in _tools -%}{{- _decl(tool) -}}{%- endfor -%}",
        "{{- '<turn|>\\n' -}}{%- endif -%}",
        "{%- set L = messages[_g.start:] -%}",
        "{%- set _u = namespace(last=-1) -%}{%- for i in range(L | length) -%}{%- if L[i].role == 'user' -%}",
        "{%- set _u.last = i -%}{%- endif -%}{%- endfor -%}",
        "{%- for i in range(L | length) -%}{%- set m = L[i] -%}{%- if m.role != 'tool' -%}",  # tool results: below
        "{%- set _g.type = '' -%}",
        "{%- set role = 'model' if m.role == 'assistant' else m.role -%}",
        # adjacent assistant messages continue one model turn
        "{%- if not (role == 'model' and _g.prev == 'assistant') -%}{{- '<|turn>' + role + '\\n' -}}{%- endif -%}",
        # an assistant's thinking after the last user message (an agentic turn still going on) is shown
        "{%- if m.role == 'assistant' and m.thinking and i > _u.last -%}",
        "{{- '<|channel>thought\n' + m.thinking + '\n<channel|>' -}}{%- endif -%}",
        "{%- set calls = m.tool_calls if m.tool_calls else [] -%}",
        "{%- for c in calls -%}",
        "{{- '<|tool_call>call:' + c.function.name + '{' -}}",
        "{%- for k, v in (c.function.arguments or {}) | dictsort(true) -%}{{- (',' if not loop.first else '') + k + ':' -}}",
        "{{- _arg(v, false) -}}{%- endfor -%}{{- '}<tool_call|>' -}}",
        "{%- set _g.type = 'tool_call' -%}{%- endfor -%}",
        # the tool results right after the calls, in this turn
        "{%- set _r = namespace(on=calls | length > 0, any=false) -%}",
        "{%- for j in range(i + 1, L | length) -%}{%- if _r.on and L[j].role == 'tool' -%}",
        "{%- set _n = namespace(name=L[j].tool_name or 'unknown') -%}",
        "{%- for c in calls -%}{%- if L[j].tool_call_id and c.id == L[j].tool_call_id -%}",
        "{%- set _n.name = c.function.name -%}{%- endif -%}{%- endfor -%}",
        "{{- '<|tool_response>response:' + _n.name + '{value:' -}}{{- _arg(L[j].content, false) -}}",
        "{{- '}<tool_response|>' -}}{%- set _r.any = true -%}{%- set _g.type = 'tool_response' -%}",
        "{%- else -%}{%- set _r.on = false -%}{%- endif -%}{%- endfor -%}",
        "{%- set _h = namespace(text='') -%}",
        "{%- if role == 'model' -%}{%- if m.content -%}",
        # stripThinking: drop <|channel>...<channel|> blocks (an unclosed one: the rest), then trim
        "{%- set _t = namespace(text=m.content, out='', done=false) -%}",
        "{%- for _ in range(m.content.count('<|channel>') + 1) -%}{%- if not _t.done -%}",
        "{%- set a = _t.text.find('<|channel>') -%}",
        "{%- if a == -1 -%}{%- set _t.out = _t.out + _t.text -%}{%- set _t.done = true -%}",
        "{%- else -%}{%- set _t.out = _t.out + _t.text[:a] -%}{%- set b = _t.text[a:].find('<channel|>') -%}",
        "{%- if b == -1 -%}{%- set _t.done = true -%}{%- else -%}{%- set _t.text = _t.text[a + b + 10:] -%}{%- endif -%}",
        "{%- endif -%}{%- endif -%}{%- endfor -%}",
        "{%- set _h.text = _t.out | trim(_ws) -%}{%- endif -%}",
        "{%- else -%}{%- set _h.text = m.content | trim(_ws) -%}{%- endif -%}",
        "{{- _h.text -}}",
        # the next message that is not a tool result: does this model turn go on into it?
        "{%- set _x = namespace(role='') -%}",
        "{%- for j in range(i + 1, L | length) -%}{%- if not _x.role and L[j].role != 'tool' -%}",
        "{%- set _x.role = L[j].role -%}{%- endif -%}{%- endfor -%}",
        "{%- set goes_on = role == 'model' and _x.role == 'assistant' and (not calls or _r.any) -%}",
        "{%- if _g.type == 'tool_call' and not _r.any -%}{{- '<|tool_response>' -}}",
        "{%- elif not goes_on and not (_r.any and not (_h.text | trim(_ws)) and not _x.role) -%}{{- '<turn|>\\n' -}}",
        "{%- endif -%}",
        "{%- set _g.prev = m.role -%}",
        "{%- endif -%}{%- endfor -%}",
        # the generation prompt, unless the model's turn goes on after its calls or their results; the large
        # models' renderer (emptyBlockOnNothink) adds an empty thought where thinking is off
        "{%- if _g.type not in ['tool_response', 'tool_call'] -%}{{- '<|turn>model\\n' -}}",
        "{%- if not _think -%}{{- '" + ("<|channel>thought\\n<channel|>" if large else "") + "' -}}{%- endif -%}",
        "{%- elif _g.type == 'tool_response' and _think -%}{{- '<|channel>thought\\n' -}}{%- endif -%}",
    ])


TEMPLATES = {GEMMA4_SMALL: _gemma4(large=False), GEMMA4_LARGE: _gemma4(large=True)}


def resolve(renderer: str, names: tuple[str, ...] = (), model_type: str = "") -> str:
    """The renderer Ollama runs for a config's `renderer` (resolveRendererName): "gemma4" is the small or
    the large variant by the model's names (shortest first, then the full one), else by its parameter
    count (the config's model_type, "31.3B"), else small."""
    if renderer != GEMMA4_LEGACY:
        return renderer
    for name in names:
        lower = name.lower()
        if "e2b" in lower or "e4b" in lower:
            return GEMMA4_SMALL
        if any(size in lower for size in ("12b", "26b", "31b")):
            return GEMMA4_LARGE
    count = _parameter_count(model_type)
    return GEMMA4_LARGE if count is not None and count >= GEMMA4_LARGE_MIN_PARAMETERS else GEMMA4_SMALL


def template_for(renderer: str, names: tuple[str, ...] = (), model_type: str = "") -> tuple[str, str | None]:
    """(the renderer Ollama would run, its chat template here or None when mlxspec has none)."""
    name = resolve(renderer, names, model_type)
    return name, TEMPLATES.get(name)


def renderer_of(template: str | None) -> str | None:
    """The renderer a template stands for, when it is one of these."""
    return next((name for name, text in TEMPLATES.items() if text == template), None)


def _parameter_count(text: str) -> int | None:
    """format.HumanNumber's text back to a count, as parseHumanParameterCount: "8.0B", "300M", "5K"."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([BMKbmk])", text or "")
    if match is None:
        return None
    return int(float(match[1]) * {"B": 10**9, "M": 10**6, "K": 10**3}[match[2].upper()])
