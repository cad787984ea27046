"""Issue 14, item 2: a template (request `template`, or stored by /api/create) is code from the caller.
It renders off the MLX thread with a time limit, and a stored one must parse when it is created."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from api_helpers import post
from mlxspec.server import template_limits
from mlxspec.server.template_limits import TemplateLimitError, check_template, limited

RUNAWAY = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}{{ prompt }}"


def test_limited_stops_a_runaway_render_and_caps_the_output():
    start = time.monotonic()
    with pytest.raises(TemplateLimitError, match="longer than 0.2 s"):
        limited(lambda: [i for i in range(10**12) if i < 0], seconds=0.2)  # one line: a comprehension
    with pytest.raises(TemplateLimitError, match="longer than"):
        limited(lambda: sum(1 for _ in iter(int, 1)), seconds=0.2)  # a generator that never ends
    assert time.monotonic() - start < 3
    with pytest.raises(TemplateLimitError, match="more than"):
        limited(lambda: "x" * (template_limits.MAX_PROMPT_CHARS + 1))
    assert limited(lambda: "fine") == "fine"


def test_check_template_names_the_line():
    assert check_template("{{ messages[0].content }}") is None
    assert "line 2" in check_template("ok\n{% for m in messages %}")


def test_a_runaway_template_is_a_400_and_does_not_hold_other_models(daemon, monkeypatch):
    monkeypatch.setattr(template_limits, "RENDER_SECONDS", 1.5)  # the daemon runs in this process
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(post, daemon.url + "/api/generate",
                           {"model": "tiny", "prompt": "hi", "template": RUNAWAY, "stream": False, "keep_alive": 0})
        time.sleep(0.3)  # the runaway is rendering now
        start = time.monotonic()
        status, body = post(daemon.url + "/api/generate",
                            {"model": "tiny-plain", "prompt": "hi", "stream": False, "keep_alive": 0,
                             "options": {"num_predict": 3}})
        other = time.monotonic() - start
        assert status == 200 and body["done"], body
        status, body = slow.result(timeout=30)
    assert status == 400 and "ran longer than 1.5 s" in body["error"], body
    assert other < 1.2, f"another model's request waited {other:.2f} s behind the template"


def test_create_refuses_a_template_that_does_not_parse(daemon):
    status, body = post(daemon.url + "/api/create", {"model": "broken", "from": "tiny", "template": "{% if %}"})
    assert status == 400 and "does not parse" in body["error"], body
    status, _ = post(daemon.url + "/api/create", {"model": "fine", "from": "tiny", "template": "{{ messages }}"})
    assert status == 200


DEEP_GO = "{{ if .Prompt }}" * 3000 + "{{ .Prompt }}" + "{{ end }}" * 3000
DEEP_JINJA = "{{ " + "(" * 5000 + "prompt" + ")" * 5000 + " }}"


def test_templates_nested_past_the_parsers_depth_are_400s(daemon):
    """Both parsers recurse per level of nesting: a RecursionError was a 500, at create and at each request."""
    assert "nested too deeply" in check_template(DEEP_GO) and "nested too deeply" in check_template(DEEP_JINJA)
    for template in (DEEP_GO, DEEP_JINJA):
        status, body = post(daemon.url + "/api/create", {"model": "deep", "from": "tiny", "template": template})
        assert status == 400 and "does not parse" in body["error"] and "nested too deeply" in body["error"], body
        status, body = post(daemon.url + "/api/generate", {"model": "tiny", "prompt": "hi", "template": template,
                                                           "stream": False})
        assert status == 400 and "template error" in body["error"] and "too deeply" in body["error"], body
