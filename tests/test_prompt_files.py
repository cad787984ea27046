"""Prompts and chat logs for `mlxspec train-drafter --prompts FILE` (heads/prompt_files.py): every
format a user's logs come in, each user turn a prompt with its history, bad files a one-line error."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlxspec.engine import Engine
from mlxspec.errors import MlxspecError
from mlxspec.frontend.cli import cli
from mlxspec.heads.prompt_files import PROMPTS_FILE, load_prompts
from mlxspec.heads.record import record
from mlxspec.options import GenerateOptions

CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": [{"type": "text", "text": "And a fruit?"}, {"type": "image_url", "image_url": {}}]}]
FIRST = CHAT[:2]
SECOND = CHAT[:3] + [{"role": "user", "content": "And a fruit?"}]


def write(tmp_path, data, name="p.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_the_shipped_set_is_plain_prompts():
    prompts = load_prompts()
    assert len(prompts) > 1000 and all(isinstance(p, str) and p.strip() for p in prompts)
    assert load_prompts(PROMPTS_FILE) == prompts


@pytest.mark.parametrize("data", [
    [{"messages": CHAT}],  # OpenAI's / Ollama's shape
    {"messages": CHAT},  # one log alone
    [CHAT],  # bare message lists
    CHAT,  # one bare chat
    [{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Name a colour."},
                        {"from": "gpt", "value": "Blue."}, {"from": "human", "value": "And a fruit?"}]}],  # ShareGPT
], ids=["messages", "one-object", "bare-list", "one-bare-chat", "sharegpt"])
def test_each_user_turn_of_a_chat_log_is_a_prompt_with_its_history(tmp_path, data):
    assert load_prompts(write(tmp_path, data)) == [FIRST, SECOND]


def test_json_lines_mixed_items_tools_left_out_and_repeats_counted_once(tmp_path):
    lines = ["Tell me a joke.", {"prompt": "Explain rain."}, {"messages": CHAT[:2]},
             {"messages": [{"role": "user", "content": "Weather in Oslo?"},
                           {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
                           {"role": "tool", "content": "{\"c\": 3}"},
                           {"role": "assistant", "content": "3 C."},
                           {"role": "user", "content": "Thanks!"}]},
             "Tell me a joke."]
    path = write(tmp_path, "\n".join(json.dumps(x) for x in lines) + "\n\n", "p.jsonl")
    oslo = [{"role": "user", "content": "Weather in Oslo?"}]
    assert load_prompts(path) == ["Tell me a joke.", "Explain rain.", FIRST, oslo,
                                  oslo + [{"role": "assistant", "content": "3 C."}, {"role": "user", "content": "Thanks!"}]]


@pytest.mark.parametrize("data, why", [
    ("[1, 2", "neither JSON nor JSON Lines"),
    ([], "no prompts"),
    ([{"messages": [{"role": "assistant", "content": "Hi."}]}], "no prompts"),
    (["ok", 3], "item 2: expected a prompt string"),
    (["  "], "item 1: an empty prompt"),
    ([{"prompt": 5}], "item 1: \"prompt\" must be a string, not int"),
    ([{"messages": [{"role": "wizard", "content": "x"}]}], "item 1: unknown role 'wizard'"),
    ([{"messages": [{"role": "user", "content": 7}]}], "item 1: a message's content must be text"),
    ([{"messages": [{"role": "user", "content": ""}]}], "item 1: a user message without text"),
    ([{"messages": "hello"}], "item 1: a chat log's messages must be a list"),
    ([{"messages": ["hello"]}], "item 1: a message must be an object"),
])
def test_a_bad_file_is_one_clear_error(tmp_path, data, why):
    with pytest.raises(MlxspecError, match=why):
        load_prompts(write(tmp_path, data))


def test_a_missing_or_binary_file_is_one_clear_error(tmp_path):
    with pytest.raises(MlxspecError, match="cannot read prompts"):
        load_prompts(tmp_path / "nope.json")
    (tmp_path / "b.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(MlxspecError, match="cannot read prompts"):
        load_prompts(tmp_path / "b.json")


def test_recording_a_chat_log_answers_each_turn_in_its_context(tiny_llama, tmp_path):
    """The target answers each user turn after the logged history (the template renders it all),
    with its own greedy answer; a chat too long for an answer in the context is skipped."""
    engine = Engine.load(str(tiny_llama))
    too_long = [{"role": "user", "content": "word " * engine.context_length}]
    samples = record(engine, [FIRST, SECOND, too_long], tokens=10_000, max_answer=8, show=False)
    assert [s.ids[: s.answer_start] for s in samples] == [engine.chat_prompt(FIRST), engine.chat_prompt(SECOND)]
    for s in samples:
        want = [t for e in engine.generate(s.ids[: s.answer_start], GenerateOptions(max_tokens=8, temperature=0)) for t in e.tokens]
        assert s.ids[s.answer_start :] == want[: len(s.ids) - s.answer_start]


def test_train_drafter_reads_a_chat_log_and_refuses_a_bad_one(tiny_llama, tmp_path):
    env = {"MLXSPEC_HOME": str(tmp_path / "home")}
    base = ["train-drafter", str(tiny_llama), "--kind", "medusa", "--tokens", "60", "--max-answer", "12",
            "--epochs", "1", "--out", "from-logs"]
    good = CliRunner().invoke(cli, base + ["--prompts", write(tmp_path, [{"messages": CHAT}] * 3)], env=env)
    assert good.exit_code == 0, good.output
    assert "wrote" in good.output
    recorded = list((tmp_path / "home" / "drafters" / ".recordings").rglob("*.safetensors"))
    assert len(recorded) == 2  # the two user turns, the repeats once
    bad = CliRunner().invoke(cli, base + ["--prompts", write(tmp_path, [{"messages": [{"role": "bot"}]}])], env=env)
    assert bad.exit_code != 0 and "unknown role 'bot'" in bad.output and "Traceback" not in bad.output

