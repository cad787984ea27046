"""Qwen3-Coder's XML tool calls (<function=NAME><parameter=KEY>VALUE</parameter>), typed by the
tools' JSON schemas: the parser at every cut, and through the ollama and openai clients with a
scripted engine (a tiny random model cannot be made to call)."""

from __future__ import annotations


import pytest

from api_helpers import assert_clients_get_calls, assert_splits_at_every_cut, post, scripted
from mlxspec.server.tool_calls import ToolCall, detect, parse_qwen3_coder, typed_arguments
from mlxspec.store import Manifest

# The shape of Qwen3-Coder's template: tools in XML, the call format spelled out, ChatML turns.
TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}<function><name>{{ t['function']['name'] }}</name>"
    "</function>{% endfor %}</tools>\nCall as <tool_call>\n<function=example>\n<parameter=example>\nvalue\n"
    "</parameter>\n</function>\n</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
EDIT = {"type": "function", "function": {"name": "edit_file", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "line": {"type": "integer"}, "dry_run": {"type": "boolean"},
    "options": {"type": "object"}, "code": {"type": "string"}}}}}
REPLY = ["I'll fix it.\n<tool_call>\n<function=edit_file>\n<parameter=path>\nsrc/main.py\n</parame",
         "ter>\n<parameter=line>\n42\n</parameter>\n<parameter=dry_run>\nfalse\n</parameter>\n",
         "<parameter=options>\n{\"indent\": 4}\n</parameter>\n<parameter=code>\n  x = 1\n\n</parameter>\n</function>\n</tool_call>"]
WANT = {"path": "src/main.py", "line": 42, "dry_run": False, "options": {"indent": 4}, "code": "  x = 1\n"}
USER = [{"role": "user", "content": "Fix line 42"}]


def test_detected_before_hermes_and_parsed():
    assert detect(TEMPLATE) == "qwen3_coder" and detect("<tool_call>{json}</tool_call>") == "hermes"
    text = "a<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call><tool_call><function=g></function>"
    assert parse_qwen3_coder(text) == ("a", [ToolCall("f", {"x": "1"}), ToolCall("g", {})])
    assert parse_qwen3_coder("<tool_call><function=f>unclosed") is None  # text, not a call


def test_arguments_typed_by_the_schema_and_left_as_text_otherwise():
    calls = [ToolCall("edit_file", {"path": "7", "line": "42", "dry_run": "yes", "options": "[1]", "other": "3"})]
    typed_arguments(calls, [EDIT, {"bad": "tool"}, "junk"])
    assert calls[0].arguments == {"path": "7", "line": 42, "dry_run": "yes", "options": "[1]", "other": "3"}
    loose = [ToolCall("f", {"n": "true"})]
    typed_arguments(loose, [{"type": "function", "function": {"name": "f", "parameters": {
        "properties": {"n": {"type": "integer"}}}}}])
    assert loose[0].arguments == {"n": "true"}  # a boolean is not an integer, whatever Python says


def test_splitter_at_every_cut():
    assert_splits_at_every_cut("qwen3_coder", [EDIT], "".join(REPLY), "I'll fix it.\n", [ToolCall("edit_file", WANT)])


@pytest.fixture(scope="module")
def coder(daemon, tiny_llama):
    registry, original = daemon.state.registry, daemon.state.registry.loader
    registry.loader = lambda m: scripted(original(m), {"text": REPLY}, []) if m.template == TEMPLATE else original(m)
    daemon.state.store.save("coder-xml", Manifest(target=str(tiny_llama), template=TEMPLATE))
    yield "coder-xml"
    registry.loader = original
    post(daemon.url + "/api/generate", {"model": "coder-xml", "keep_alive": 0})


def test_clients_get_typed_calls(daemon, coder):
    assert_clients_get_calls(daemon.url, coder, USER, [EDIT], "I'll fix it.\n", ("edit_file", WANT))
