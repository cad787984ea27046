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
server/thinking.py). Not covered: tools (the template never shows them, so a request offering them gets
mlxspec's 400 "does not support tools"), tool calls and tool results in the history (refused: a template
error, 400).
"""

from __future__ import annotations

import re

GEMMA4_SMALL, GEMMA4_LARGE = "gemma4-small", "gemma4-large"
# renderer_resolution.go: the legacy name means small or large by the model's name, then its size
GEMMA4_LEGACY, GEMMA4_LARGE_MIN_PARAMETERS = "gemma4", 12_000_000_000

# Go's strings.TrimSpace (unicode.IsSpace), which Python's str.strip exceeds (it also strips \x1c-\x1f).
_GO_SPACE = r"' \t\n\v\f\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000'"


def _gemma4(large: bool) -> str:
    """Gemma4Renderer.Render (gemma4.go) for messages without tools or tool calls; thinking is the
    template's `enable_thinking` (Ollama's think). No literal newline outside string literals: the output
    is the same under any trim_blocks / lstrip_blocks."""
    return "".join([
        "{%- set _ws = " + _GO_SPACE + " -%}",
        "{%- set _think = enable_thinking is defined and enable_thinking -%}",
        "{%- for m in messages -%}{%- if m.role == 'tool' or m.tool_calls -%}",
        "{{- raise_exception('tool calls and tool results: mlxspec does not render the gemma4 renderer\\'s tool format') -}}",
        "{%- endif -%}{%- endfor -%}",
        "{{- '<bos>' -}}",  # emitted as text: Gemma 4's tokenizer adds no BOS itself
        "{%- set _g = namespace(start=0, prev='') -%}",
        # a system turn for a leading system or developer message (trimmed, even when empty) or for thinking
        "{%- set _system = messages and messages[0].role in ['system', 'developer'] -%}",
        "{%- if _system or _think -%}",
        "{{- '<|turn>system\\n' + ('<|think|>\\n' if _think else '') -}}",
        "{%- if _system -%}{{- messages[0].content | trim(_ws) -}}{%- set _g.start = 1 -%}{%- endif -%}",
        "{{- '<turn|>\\n' -}}{%- endif -%}",
        "{%- for m in messages[_g.start:] -%}",
        "{%- set role = 'model' if m.role == 'assistant' else m.role -%}",
        # adjacent assistant messages continue one model turn
        "{%- if not (role == 'model' and _g.prev == 'assistant') -%}{{- '<|turn>' + role + '\\n' -}}{%- endif -%}",
        "{%- if role == 'model' -%}",
        # stripThinking: drop <|channel>...<channel|> blocks (an unclosed one: the rest), then trim
        "{%- set _t = namespace(text=m.content, out='', done=false) -%}",
        "{%- for _ in range(m.content.count('<|channel>') + 1) -%}{%- if not _t.done -%}",
        "{%- set i = _t.text.find('<|channel>') -%}",
        "{%- if i == -1 -%}{%- set _t.out = _t.out + _t.text -%}{%- set _t.done = true -%}",
        "{%- else -%}{%- set _t.out = _t.out + _t.text[:i] -%}{%- set j = _t.text[i:].find('<channel|>') -%}",
        "{%- if j == -1 -%}{%- set _t.done = true -%}{%- else -%}{%- set _t.text = _t.text[i + j + 10:] -%}{%- endif -%}",
        "{%- endif -%}{%- endif -%}{%- endfor -%}",
        "{{- _t.out | trim(_ws) -}}",
        "{%- else -%}{{- m.content | trim(_ws) -}}{%- endif -%}",
        "{%- if not (role == 'model' and not loop.last and loop.nextitem.role == 'assistant') -%}",
        "{{- '<turn|>\\n' -}}{%- endif -%}",
        "{%- set _g.prev = m.role -%}",
        "{%- endfor -%}",
        # the generation prompt, always; the large models' renderer (emptyBlockOnNothink) adds an empty thought
        # where thinking is off
        "{{- '<|turn>model\\n' -}}",
        "{%- if not _think -%}{{- '" + ("<|channel>thought\\n<channel|>" if large else "") + "' -}}{%- endif -%}",
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
