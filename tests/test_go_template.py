"""Ollama's Go chat templates translated to Jinja (issue 12 item 4): rendered against the strings
Ollama's own tests expect (template/template_test.go), under transformers' Jinja settings and plain ones."""

from __future__ import annotations

import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from mlxspec.go_jinja import chat_source, is_go_template, to_jinja, uses_suffix
from mlxspec.go_template import GoTemplateError

ENVS = [  # transformers renders chat templates with trim_blocks + lstrip_blocks; the output must not depend on it
    ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]),
    ImmutableSandboxedEnvironment(extensions=[jinja2.ext.loopcontrols]),
]


def render(go: str, messages: list[dict], **variables) -> str:
    source = to_jinja(go)
    first, second = (env.from_string(source).render(messages=messages, **variables) for env in ENVS)
    assert first == second
    return first


def msgs(*pairs) -> list[dict]:
    return [{"role": r, "content": c} for r, c in pairs]


HELLO = msgs(("user", "Hello friend!"), ("assistant", "Hello human!"), ("user", "What is your name?"))
SYSTEM = msgs(("system", "You are a helpful assistant!")) + HELLO
MISTRAL = {
    "no response": "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] ",
    "response": "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] {{ .Response }}",
    "messages": '[INST] {{ if .System }}{{ .System }}\n\n{{ end }}\n{{- range .Messages }}\n'
                '{{- if eq .Role "user" }}{{ .Content }}[/INST] {{ else if eq .Role "assistant" }}{{ .Content }}[INST] {{ end }}\n'
                "{{- end }}",
}
CHATML_LEGACY = ("{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}{{ if .Prompt }}<|im_start|>user\n"
                 "{{ .Prompt }}<|im_end|>\n{{ end }}<|im_start|>assistant\n{{ .Response }}<|im_end|>\n")
CHATML = "\n{{- range $index, $_ := .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
CHATML_OUT = ("<|im_start|>system\nYou are a helpful assistant!<|im_end|>\n<|im_start|>user\nHello friend!<|im_end|>\n"
              "<|im_start|>assistant\nHello human!<|im_end|>\n<|im_start|>user\nWhat is your name?<|im_end|>\n"
              "<|im_start|>assistant\n")
# Ollama's gemma-instruct template: variables, printf, continue
GEMMA = ('{{- $system := "" }}\n{{- range .Messages }}\n{{- if eq .Role "system" }}\n{{- if not $system }}{{ $system = .Content }}\n'
         '{{- else }}{{ $system = printf "%s\\n\\n%s" $system .Content }}\n{{- end }}\n{{- continue }}\n'
         '{{- else if eq .Role "user" }}<start_of_turn>user\n{{- if $system }}\n{{ $system }}\n{{- $system = "" }}\n{{- end }}\n'
         '{{- else if eq .Role "assistant" }}<start_of_turn>model\n{{- end }}\n{{ .Content }}<end_of_turn>\n{{ end }}<start_of_turn>model\n')


@pytest.mark.parametrize("kind", list(MISTRAL))
def test_mistral_forms_render_as_ollama(kind):
    assert render(MISTRAL[kind], HELLO) == "[INST] Hello friend![/INST] Hello human![INST] What is your name?[/INST] "
    assert render(MISTRAL[kind], SYSTEM) == ("[INST] You are a helpful assistant!\n\nHello friend![/INST] Hello human!"
                                             "[INST] What is your name?[/INST] ")


def test_a_last_assistant_message_is_continued():
    talk = HELLO + msgs(("assistant", "My name is Ollama and I"))
    expected = "[INST] Hello friend![/INST] Hello human![INST] What is your name?[/INST] My name is Ollama and I"
    assert render("[INST] {{ .Prompt }}[/INST] {{ .Response }}", talk) == expected
    assert render("[INST] {{ .Prompt }}[/INST] ", talk) == expected  # {{ .Response }} appended, as Ollama's Parse


@pytest.mark.parametrize("template", [CHATML_LEGACY, CHATML])
def test_chatml_per_turn_and_messages_forms(template):
    assert render(template, SYSTEM) == CHATML_OUT


def test_variables_printf_and_continue():
    talk = msgs(("system", "S1"), ("user", "a"), ("assistant", "b"), ("system", "S2"), ("user", "c"))
    assert render(GEMMA, talk) == ("<start_of_turn>user\nS1\na<end_of_turn>\n<start_of_turn>model\nb<end_of_turn>\n"
                                   "<start_of_turn>user\nS2\nc<end_of_turn>\n<start_of_turn>model\n")
    # consecutive system messages are joined by collate before the template sees them
    assert render(GEMMA, msgs(("system", "x"), ("system", "y"), ("user", "q"))).startswith("<start_of_turn>user\nx\n\ny\nq")


def test_suffix_pass_and_default_template():
    fim = "{{- if .Suffix }}<PRE> {{ .Prompt }} <SUF>{{ .Suffix }} <MID>\n{{- else }}{{ .Prompt }}\n{{- end }}"
    assert render(fim, msgs(("user", "hello"))) == "hello"
    assert render(fim, msgs(("user", "def add(")), prompt="def add(", suffix="return x") == "<PRE> def add( <SUF>return x <MID>"
    assert uses_suffix(fim) and not uses_suffix("{{ .Prompt }}") and uses_suffix("{{ suffix }}")
    talk = msgs(("system", "S"), ("user", "a"), ("user", "b"), ("assistant", "x"), ("tool", "t"), ("user", "c"))
    assert render("{{ .Prompt }}", talk) == "a\n\nbxc"  # Ollama's default: no system, no tool, replies kept


def test_text_that_looks_like_jinja_stays_text():
    go = '{{ .Prompt }} {% raw %} }} {{"{{"}} \\ " \t\x01 é\r\n{{ if eq .Prompt "}}" }}yes{{ end }}'
    assert render(go, msgs(("user", "}}"))) == '}} {% raw %} }} {{ \\ " \t\x01 é\r\nyes'


def test_detection_and_passthrough():
    assert is_go_template("{{ .Prompt }}") and is_go_template("{{- range .Messages }}{{ end }}")
    assert is_go_template("{{/* c */}}{{ $.System }}") and is_go_template("{{ json .Tools }}")
    assert not is_go_template("{{ prompt }}") and not is_go_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert chat_source("{{ messages[0].content }}") == "{{ messages[0].content }}"


@pytest.mark.parametrize("template, named", [
    ("{{ .Tools }}", ".Tools"),
    ("{{ range .Messages }}{{ .ToolCalls }}{{ end }}", ".ToolCalls"),
    ("{{ with .System }}x{{ end }}", "with"),
    ('{{ template "x" }}', "template"),
    ("{{ range .Messages }}{{ $last := eq (len (slice $.Messages 1)) 1 }}{{ end }}", "'len'"),
    ("{{ .Prompt | upper }}", "pipelines"),
    ("{{ json .Messages }}", "'json'"),
    ('{{ printf "%d" .Prompt }}', "printf"),
    ("{{ if .System }}x", "missing {{ end }}"),
    ("{{ end }}", "without an if or range"),
    ("{{ $x }}", "undefined variable $x"),
    ("{{ break }}", "outside a range"),
    ("{{ range .Prompt }}{{ end }}", ".Messages only"),
    ("{{ .Prompt", "unclosed action"),
])
def test_outside_the_subset_is_an_error_naming_the_construct(template, named):
    with pytest.raises(GoTemplateError) as e:
        to_jinja(template)
    assert named in str(e.value)
