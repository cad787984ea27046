"""Chat templates are code from callers (a request's `template`, one stored by /api/create) or from a
model file: render them with a time limit and an output limit, off the MLX thread.

    ids = limited(lambda: tok.apply_chat_template(...), seconds=RENDER_SECONDS)   # TemplateLimitError if over
    check_template(source)                                                         # at create time: syntax

Jinja's sandbox (transformers renders in an ImmutableSandboxedEnvironment) stops attribute tricks
but not work: `{% for i in range(99999) %}{% for j in range(99999) %}` runs for hours. Jinja compiles
a template to Python, so a trace function on the rendering thread sees every line it executes and
stops it at the deadline. Rendering runs on a worker thread (the scheduler's executor), so a slow
template never holds the MLX thread that every model shares.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TypeVar

RENDER_SECONDS = 2.0  # a real chat template renders in milliseconds
MAX_PROMPT_CHARS = 4_000_000  # ~1M tokens: more than any context window

T = TypeVar("T")


class TemplateLimitError(Exception):
    """The template ran past its time or output limit (the caller's template: a 400)."""


def limited(render: Callable[[], T], seconds: float | None = None) -> T:
    """render() on this thread, stopped with TemplateLimitError once it runs `seconds` (RENDER_SECONDS)."""
    seconds = RENDER_SECONDS if seconds is None else seconds
    deadline = time.monotonic() + seconds
    state = {"lines": 0}

    def trace(frame, event, arg):
        state["lines"] += 1
        if state["lines"] % 64 == 0 and time.monotonic() > deadline:  # the clock every 64 lines: cheap
            raise TemplateLimitError(f"the template ran longer than {seconds:g} s")
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        result = render()
    finally:
        sys.settrace(previous)
    if isinstance(result, (str, list)) and len(result) > MAX_PROMPT_CHARS:  # text, or token ids
        raise TemplateLimitError(f"the template produced more than {MAX_PROMPT_CHARS} characters")
    return result


def check_template(source: str) -> str | None:
    """None if `source` parses as a Jinja template (as transformers compiles chat templates) or is a Go
    template (Ollama's) that mlxspec translates, else why not."""
    from jinja2 import TemplateSyntaxError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from ..go_jinja import chat_source
    from ..go_template import GoTemplateError

    try:
        source = chat_source(source)
    except GoTemplateError as e:
        return str(e)
    except RecursionError:  # both parsers recurse per level of nesting
        return "blocks nested too deeply"
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    try:
        env.parse(source)
    except TemplateSyntaxError as e:
        return f"line {e.lineno}: {e.message}"
    except RecursionError:
        return "expressions nested too deeply"
    return None

