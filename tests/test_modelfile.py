"""Modelfiles (issue 12 item 4): the parser, its errors, and manifest -> Modelfile -> the same fields."""

from __future__ import annotations

import pytest

from mlxspec.modelfile import ModelfileError, commands, parse, quote, render
from mlxspec.store import Manifest

def test_every_directive_becomes_its_create_field(tmp_path):
    (tmp_path / "weights").mkdir()
    text = '''# comment
FROM ./weights
DRAFT org/draft-model
DRAFTER draft-model
draft_length 3
QUANTIZE q4
DRAFT_QUANTIZE q8
DESCRIPTION A model made in a test
PARAMETER temperature 0.7
PARAMETER stop "<|im_end|>"
PARAMETER stop <|endoftext|>
parameter num_ctx 4096
PARAMETER use_mmap true
PARAMETER num_predict -1
TEMPLATE """{{ if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{ .Prompt }}"""
SYSTEM   You are Mario.  
MESSAGE user "Is Toronto in Canada?"
MESSAGE assistant yes
REQUIRES 0.6.4
LICENSE """MIT

text"""
LICENSE Apache-2.0
'''
    assert parse(text, tmp_path) == {
        "from": str((tmp_path / "weights").resolve()), "draft": "org/draft-model", "drafter": "draft-model",
        "draft_length": 3, "quantize": "q4", "draft_quantize": "q8", "description": "A model made in a test",
        "parameters": {"temperature": 0.7, "stop": ["<|im_end|>", "<|endoftext|>"], "num_ctx": 4096, "use_mmap": True,
                       "num_predict": -1},
        "template": "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}{{ .Prompt }}",
        "system": "You are Mario.",
        "messages": [{"role": "user", "content": "Is Toronto in Canada?"}, {"role": "assistant", "content": "yes"}],
        "license": ["MIT\n\ntext", "Apache-2.0"],
    }


def test_names_and_repo_ids_stay_as_written(tmp_path):
    assert parse("FROM llama3.2:1b\nDRAFT mlx-community/x-4bit\n", tmp_path) == {
        "from": "llama3.2:1b", "draft": "mlx-community/x-4bit"}
    assert parse("\ufeffFROM a\r\nSYSTEM b\r\n")["system"] == "b"  # a BOM and Windows line ends


def test_a_drafters_source_is_a_path_relative_to_the_modelfile_or_a_name(tmp_path):
    (tmp_path / "block").mkdir()
    assert parse("FROM x\nDRAFTER mtp:./block\n", tmp_path)["drafter"] == f"mtp:{(tmp_path / 'block').resolve()}"
    assert parse("FROM x\nDRAFTER mtp:Qwen/Qwen3.5-4B\n", tmp_path)["drafter"] == "mtp:Qwen/Qwen3.5-4B"
    assert parse("FROM x\nDRAFTER early-exit:8\n", tmp_path)["drafter"] == "early-exit:8"


@pytest.mark.parametrize("text, words", [
    ("SYSTEM hi", "no FROM line"),
    ("FROM x\nADAPTER ./lora", "ADAPTER (LoRA adapters) is not supported"),
    ("FROM x\nRENDERER qwen3", "RENDERER"),
    ("FROM x\nPARSER qwen3", "PARSER"),
    ("FROM x\nFOO bar", "line 2: unknown directive 'FOO'"),
    ("FROM x\nPARAMETER mirostat_x 1", "'mirostat_x': unknown parameter; mlxspec knows"),
    ("FROM x\nPARAMETER temperature hot", "temperature must be a finite number, not 'hot'"),
    ("FROM x\nPARAMETER temperature nan", "finite number"),
    ("FROM x\nPARAMETER num_ctx 1.5", "num_ctx must be an integer"),
    ("FROM x\nPARAMETER use_mmap maybe", "use_mmap must be true or false"),
    ("FROM x\nPARAMETER top_p 7", "invalid option top_p=7.0"),
    ("FROM x\nPARAMETER", "PARAMETER needs a name and a value"),
    ("FROM x\nMESSAGE tool hi", "role must be one of system, user, assistant"),
    ('FROM x\n\nTEMPLATE """abc\n', "line 3: TEMPLATE has an unclosed \"\"\""),
    ('FROM x\nSYSTEM "a" b', "text after the closing"),
    ("FROM x\nDRAFT_LENGTH many", "DRAFT_LENGTH must be an integer"),
    ("FROM x\nFROM y", "FROM is given twice"),
])
def test_mistakes_are_named(text, words):
    with pytest.raises(ModelfileError) as e:
        parse(text)
    assert words in str(e.value)


def test_line_numbers_count_multiline_values():
    text = 'FROM x\nTEMPLATE """a\nb\nc"""\nSYSTEM s\nBOGUS 1'
    assert [c[0] for c in commands(text.rsplit("\n", 1)[0])] == [1, 2, 5]
    with pytest.raises(ModelfileError, match="line 6"):
        parse(text)


@pytest.mark.parametrize("value", ["plain", " padded ", "two\nlines", 'say "hi"', '"starts quoted', "", 'ends with """',
                                   "tab\tin", "# not a comment"])
def test_quote_reads_back_the_same(value):
    assert commands(f"SYSTEM {quote(value)}") == [(1, "system", value)]


def test_a_value_holding_its_own_closing_quotes_is_refused():
    with pytest.raises(ModelfileError, match="closing quotes"):
        quote('a"""\nb"')


def test_render_parses_back_to_the_manifest_fields(tmp_path):
    manifest = Manifest(
        target=str(tmp_path), draft="org/draft", drafter="draft-model", quantize="q4", draft_quantize="q8", draft_length=2,
        parameters={"temperature": 0.5, "stop": ["a b", "\n"], "num_predict": 7, "adaptive": False},
        template='{{ range .Messages }}<|{{ .Role }}|>\n{{ .Content }}{{ end }}', system=" Be brief.\n",
        description="desc", messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": 'say "x"'}],
        license=["MIT", "two\nlines"],
    )
    body = parse(render("m:latest", manifest), tmp_path)
    fields = {"target": body.pop("from"), **body}
    assert Manifest(**fields) == manifest
