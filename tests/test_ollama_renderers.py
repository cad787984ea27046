"""Ollama models whose config names a built-in renderer ("renderer": "gemma4") and that have no TEMPLATE layer
chat as Ollama formats them (mlxspec/renderers.py), through mlxspec's own path: Ollama's store -> Store ->
Manifest -> server/prompts.py -> the GGUF's tokenizer.

Expected strings are copied from ollama/ollama at fb30760996871fa9460115c753afd2c60d4ab0f7:
model/renderers/gemma4_reference_test.go (TestGemma4RendererMatchesReference: the case named in each
entry; TestGemma4RendererVariantsMatchExpectedGenerationPrompt). Those marked "derived" come from reading
model/renderers/gemma4.go, server/prompt.go and server/renderer_resolution.go (no Ollama test has them).
"""

from __future__ import annotations

import pytest

from fake_ollama import GO_TEMPLATE, add_model
from gguf_gemma4_fixtures import ollama_gemma4, write_tiny_gemma4_gguf
from mlxspec import renderers
from mlxspec.engine import Engine
from mlxspec.ollama_store import describe
from mlxspec.server.prompts import GeneratePrompt, chat_ids, generate_ids, think_variables, tool_format
from mlxspec.store import Store

SYSTEM = "You are helpful."
CONFIG = {"model_format": "gguf", "model_family": "gemma4", "model_families": ["gemma4"], "model_type": "8.0B",
          "file_type": "Q4_K_M", "renderer": "gemma4", "parser": "gemma4"}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """A tiny Gemma 4 as Ollama's converter writes it: <bos>, <|turn>, <turn|> are control tokens; no chat template."""
    where = tmp_path_factory.mktemp("gemma4")
    src = write_tiny_gemma4_gguf(where / "llama-cpp.gguf", "Q8_0", vocabulary="gemma4")
    return ollama_gemma4(src, where / "ollama.gguf")


@pytest.fixture(scope="module")
def engine(gguf_file):
    return Engine.load(str(gguf_file))


@pytest.fixture(scope="module")
def store(tmp_path_factory, gguf_file):
    root = tmp_path_factory.mktemp("ollama") / "models"
    add_model(root, "gemma4", gguf_file, "e4b", template=None, config=CONFIG)  # as Ollama's library ships it
    add_model(root, "gemma4", gguf_file, "31b", template=None, config=CONFIG | {"model_type": "31.3B"})
    add_model(root, "gemma4", gguf_file, "latest", template=None, config=CONFIG | {"model_type": "31.3B"})
    add_model(root, "gemma4", gguf_file, "sys", template=None, system=SYSTEM, config=CONFIG)
    add_model(root, "gemma4", gguf_file, "layer", template=GO_TEMPLATE, config=CONFIG)
    add_model(root, "gemma4", gguf_file, "large", template=None, config=CONFIG | {"renderer": "gemma4-large"})
    add_model(root, "gemma4", gguf_file, "unknown", template=None, config=CONFIG | {"renderer": "qwen3.5"})
    add_model(root, "gemma4", gguf_file, "none", template=None, config={k: v for k, v in CONFIG.items() if k != "renderer"})
    return Store(tmp_path_factory.mktemp("home"), ollama_models=root)


def manifest(store, tag: str = "e4b"):
    return store.named(f"ollama:gemma4:{tag}")[1]


def assert_renders(engine, ids: list[int], expected: str) -> None:
    """The prompt's ids are exactly the expected text's, with its one <bos> the BOS token."""
    assert ids == engine.encode(expected, add_special_tokens=False)
    assert ids.count(engine.tokenizer.bos_token_id) == 1 and ids[0] == engine.tokenizer.bos_token_id
    assert engine.tokenizer.decode(ids) == expected


U, A, S = "user", "assistant", "system"
# (Ollama's test case, messages, the string Ollama's renderer gives)
REFERENCE = [
    ("user_only", [(U, "Hello")], "<bos><|turn>user\nHello<turn|>\n<|turn>model\n"),
    ("system_user", [(S, "You are helpful."), (U, "Hi")],
     "<bos><|turn>system\nYou are helpful.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"),
    ("developer_user", [("developer", "You are helpful."), (U, "Hi")],
     "<bos><|turn>system\nYou are helpful.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"),
    ("multi_turn", [(S, "You are helpful."), (U, "Hi"), (A, "Hello!"), (U, "More")],
     "<bos><|turn>system\nYou are helpful.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n"
     "<|turn>user\nMore<turn|>\n<|turn>model\n"),
    ("strip_thinking_history", [(U, "What is 2+2?"), (A, "<|channel>thought\nThinking...<channel|>4"), (U, "And 3+3?")],
     "<bos><|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n4<turn|>\n<|turn>user\nAnd 3+3?<turn|>\n<|turn>model\n"),
    ("multiple_thinking_blocks",
     [(U, "Hi"), (A, "<|channel>Think1<channel|>Middle<|channel>Think2<channel|>Done"), (U, "More")],
     "<bos><|turn>user\nHi<turn|>\n<|turn>model\nMiddleDone<turn|>\n<|turn>user\nMore<turn|>\n<|turn>model\n"),
    ("adjacent_assistants_continue_same_model_turn", [(U, "Start"), (A, "One."), (A, "Two."), (U, "More")],
     "<bos><|turn>user\nStart<turn|>\n<|turn>model\nOne.Two.<turn|>\n<|turn>user\nMore<turn|>\n<|turn>model\n"),
    ("unicode_content", [(U, "こんにちは")], "<bos><|turn>user\nこんにちは<turn|>\n<|turn>model\n"),
    ("newlines_in_content", [(U, "Line 1\nLine 2\nLine 3")],
     "<bos><|turn>user\nLine 1\nLine 2\nLine 3<turn|>\n<|turn>model\n"),
    ("user_content_trimmed", [(U, "  hello  ")], "<bos><|turn>user\nhello<turn|>\n<|turn>model\n"),
    ("assistant_whitespace_trimmed", [(U, "Hi"), (A, "  spaced  "), (U, "More")],
     "<bos><|turn>user\nHi<turn|>\n<|turn>model\nspaced<turn|>\n<|turn>user\nMore<turn|>\n<|turn>model\n"),
    ("system_message_trimmed", [(S, "  You are helpful.  "), (U, "Hi")],
     "<bos><|turn>system\nYou are helpful.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"),
    ("system_whitespace_only", [(S, "   "), (U, "Hi")], "<bos><|turn>system\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"),
    ("empty_system_message", [(S, ""), (U, "Hi")], "<bos><|turn>system\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"),
    ("empty_assistant_content", [(U, "Hi"), (A, ""), (U, "More")],
     "<bos><|turn>user\nHi<turn|>\n<|turn>model\n<turn|>\n<|turn>user\nMore<turn|>\n<|turn>model\n"),
    # derived (gemma4.go): an unclosed thought drops the rest; a later system message is a turn of its own;
    # Go's TrimSpace keeps \x1c (Python's strip would not); the last assistant message still gets the prompt
    ("derived: unclosed_thought", [(U, "Hi"), (A, "Yes<|channel>never closed"), (U, "More")],
     "<bos><|turn>user\nHi<turn|>\n<|turn>model\nYes<turn|>\n<|turn>user\nMore<turn|>\n<|turn>model\n"),
    ("derived: later_system", [(U, "Hi"), (S, " Be brief. "), (U, "More")],
     "<bos><|turn>user\nHi<turn|>\n<|turn>system\nBe brief.<turn|>\n<|turn>user\nMore<turn|>\n<|turn>model\n"),
    ("derived: go_trim_space", [(U, "\x1cHi\x1c \n")], "<bos><|turn>user\n\x1cHi\x1c<turn|>\n<|turn>model\n"),
    ("derived: ends_with_assistant", [(U, "Hi"), (A, "Hel")],
     "<bos><|turn>user\nHi<turn|>\n<|turn>model\nHel<turn|>\n<|turn>model\n"),
]


@pytest.mark.parametrize("case, messages, expected", REFERENCE, ids=[c[0] for c in REFERENCE])
def test_chat_renders_as_ollamas_gemma4_renderer(engine, store, case, messages, expected):
    msgs = [{"role": role, "content": content} for role, content in messages]
    assert_renders(engine, chat_ids(engine, manifest(store), msgs), expected)


# TestGemma4RendererVariantsMatchExpectedGenerationPrompt: gemma4 / gemma4-small plain, gemma4-large with an
# empty thought; which one "gemma4" is (derived, renderer_resolution.go): by name (e2b/e4b small; 12b/26b/31b
# large), else by the config's model_type (>= 12B large), else small.
SMALL = "<bos><|turn>user\nHello<turn|>\n<|turn>model\n"
LARGE = SMALL + "<|channel>thought\n<channel|>"


@pytest.mark.parametrize("tag, expected", [("e4b", SMALL), ("31b", LARGE), ("latest", LARGE), ("large", LARGE)])
def test_the_variant_follows_ollamas_resolution(engine, store, tag, expected):
    assert_renders(engine, chat_ids(engine, manifest(store, tag), [{"role": "user", "content": "Hello"}]), expected)


def test_resolution_by_name_then_size():
    assert renderers.resolve("gemma4", ("gemma4:e2b-it-q8_0",), "31.3B") == "gemma4-small"  # the name first
    assert renderers.resolve("gemma4", ("gemma4:26b-a4b", "registry.ollama.ai/library/gemma4:26b-a4b")) == "gemma4-large"
    assert renderers.resolve("gemma4", ("gemma4:latest",), "12.0B") == "gemma4-large"
    assert renderers.resolve("gemma4", ("gemma4:latest",), "8.0B") == "gemma4-small"
    assert renderers.resolve("gemma4", ("gemma4:latest",), "huge") == "gemma4-small"
    assert renderers.resolve("gemma4-small", ("gemma4:31b",)) == "gemma4-small"  # only the legacy name resolves
    assert renderers.template_for("qwen3.5") == ("qwen3.5", None)


def test_the_models_system_prompt_and_generate_use_the_renderer(engine, store):
    """Derived (server/routes.go): chat prepends the SYSTEM layer; /api/generate renders [system, user] the same way."""
    expected = f"<bos><|turn>system\n{SYSTEM}<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
    assert_renders(engine, chat_ids(engine, manifest(store, "sys"), [{"role": "user", "content": "Hi"}]), expected)
    assert_renders(engine, generate_ids(engine, manifest(store, "sys"), GeneratePrompt(prompt="Hi")), expected)
    assert_renders(engine, generate_ids(engine, manifest(store), GeneratePrompt(prompt="Hi", system=SYSTEM)), expected)


def test_the_renderer_wins_over_a_template_layer_as_in_ollama(engine, store):
    """Derived (server/prompt.go renderPrompt): a named renderer formats the prompt, whatever the template."""
    assert manifest(store, "layer").template == renderers.TEMPLATES["gemma4-small"]
    assert_renders(engine, chat_ids(engine, manifest(store, "layer"), [{"role": "user", "content": "Hello"}]), SMALL)


def test_an_unknown_renderer_or_none_leaves_the_model_as_it_was(engine, store):
    for tag in ("unknown", "none"):
        assert manifest(store, tag).template is None
        ids = chat_ids(engine, manifest(store, tag), [{"role": "user", "content": "Hello"}])
        assert engine.tokenizer.bos_token_id not in ids[1:] and "<|turn>" not in engine.tokenizer.decode(ids)


def test_show_names_the_renderer(store):
    ollama = store.ollama
    contents = store.ollama_contents("ollama:gemma4:31b")
    shown = describe(ollama, contents)
    assert shown["renderer"] == "gemma4-large" and shown["template"] == renderers.TEMPLATES["gemma4-large"]
    assert "'gemma4-large'" in shown["template_note"] and "tools and thinking too" in shown["template_note"]
    unknown = describe(ollama, store.ollama_contents("ollama:gemma4:unknown"))
    assert unknown["renderer"] == "qwen3.5" and "not one mlxspec renders" in unknown["template_note"]
    assert describe(ollama, store.ollama_contents("ollama:gemma4:none"))["renderer"] == ""


# Tools as Ollama's renderer declares them, and the strings its reference tests give (gemma4_reference_test.go,
# 8a0016f: bashDeclRef, readDeclRef, nestedDeclRef, arrayDeclRef, modeDeclRef, configureDeclRef, rawDeclRef,
# nestedRequiredDeclRef, searchDeclRef); "derived" cases follow gemma4.go's formatting rules.
def _tool(name, description, props=None, required=None):
    params = {"type": "object"} | ({"properties": props} if props is not None else {}) | ({"required": required} if required else {})
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


Q = '<|"|>'
BASH = _tool("bash", "Run a command", {"command": {"type": "string", "description": "The command"}}, ["command"])
READ = _tool("read", "Read a file", {"path": {"type": "string", "description": "File path"}}, ["path"])
BASH_DECL = ("<|tool>declaration:bash{description:QRun a commandQ,parameters:{properties:{command:{description:QThe "
             "commandQ,type:QSTRINGQ}},required:[QcommandQ],type:QOBJECTQ}}<tool|>").replace("Q", Q)
READ_DECL = ("<|tool>declaration:read{description:QRead a fileQ,parameters:{properties:{path:{description:QFile pathQ,"
             "type:QSTRINGQ}},required:[QpathQ],type:QOBJECTQ}}<tool|>").replace("Q", Q)
SCHEMAS = [  # (tool, its declaration)
    (_tool("create", "Create item", {"config": {"type": "object", "description": "Config", "properties": {
        "enabled": {"type": "boolean", "description": "On/off"}}}, "name": {"type": "string", "description": "Name"}}),
     "create{description:QCreate itemQ,parameters:{properties:{config:{description:QConfigQ,properties:{enabled:{"
     "description:QOn/offQ,type:QBOOLEANQ}},type:QOBJECTQ},name:{description:QNameQ,type:QSTRINGQ}},type:QOBJECTQ}}"),
    (_tool("batch", "Run batch", {"commands": {"type": "array", "description": "Commands", "items": {"type": "string"}}}),
     "batch{description:QRun batchQ,parameters:{properties:{commands:{description:QCommandsQ,items:{type:QSTRINGQ},"
     "type:QARRAYQ}},type:QOBJECTQ}}"),
    (_tool("set_mode", "Set mode", {"mode": {"type": "string", "description": "The mode", "enum": ["fast", "slow"]}}),
     "set_mode{description:QSet modeQ,parameters:{properties:{mode:{description:QThe modeQ,enum:[QfastQ,QslowQ],"
     "type:QSTRINGQ}},type:QOBJECTQ}}"),
    (_tool("configure", "Configure", {"config": {"type": "object", "description": "Config"}}),
     "configure{description:QConfigureQ,parameters:{properties:{config:{description:QConfigQ,properties:{},"
     "type:QOBJECTQ}},type:QOBJECTQ}}"),
    (_tool("raw", "Raw input"), "raw{description:QRaw inputQ,parameters:{type:QOBJECTQ}}"),
    (_tool("create_user", "Create user", {"profile": {"type": "object", "description": "Profile", "required": ["name"],
                                                      "properties": {"name": {"type": "string", "description": "Name"},
                                                                     "age": {"type": "number", "description": "Age"}}}}),
     "create_user{description:QCreate userQ,parameters:{properties:{profile:{description:QProfileQ,properties:{age:{"
     "description:QAgeQ,type:QNUMBERQ},name:{description:QNameQ,type:QSTRINGQ}},required:[QnameQ],type:QOBJECTQ}},"
     "type:QOBJECTQ}}"),
    # derived (gemma4.go): a property's anyOf of bare types is its type union, several types one string at the
    # top level and a list inside items; other anyOf (a branch with more than a type) is no type at all
    (_tool("open", "Open", {"path": {"description": "Path", "anyOf": [{"type": "string"}, {"type": "null", "title": "x"}]},
                            "mode": {"anyOf": [{"type": "string"}], "enum": ["r", "w"]},
                            "ids": {"type": "array", "items": {"type": ["integer", "null"]}},
                            "other": {"anyOf": [{"type": "string", "description": "A"}]}}),
     "open{description:QOpenQ,parameters:{properties:{ids:{items:{type:[QINTEGERQ,QNULLQ]},type:QARRAYQ},mode:{enum:"
     "[QrQ,QwQ],type:QSTRINGQ},other:{},path:{description:QPathQ,type:Q['STRING', 'NULL']Q}},type:QOBJECTQ}}"),
    (_tool("search", "Search", {"query": {"type": "string", "description": "Search query"}, "limit": {"type": "number"},
                                "offset": {"type": "number", "description": "Start offset"}}),
     "search{description:QSearchQ,parameters:{properties:{limit:{type:QNUMBERQ},offset:{description:QStart offsetQ,"
     "type:QNUMBERQ},query:{description:QSearch queryQ,type:QSTRINGQ}},type:QOBJECTQ}}"),
]


def _call(name, args, id=None):
    return {**({"id": id} if id else {}), "function": {"name": name, "arguments": args}}


def _q(text: str) -> str:
    return Q + text + Q


TOOL_CASES = [  # (case, messages, tools, think, the string for the small variant)
    ("tools_no_system", [(U, "Hi")], [BASH], False, "<bos><|turn>system\n" + BASH_DECL + "<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"),
    ("declarations", [(U, "Hi")], [t for t, _ in SCHEMAS], False,
     "<bos><|turn>system\n" + "".join("<|tool>declaration:" + d.replace("Q", Q) + "<tool|>" for _, d in SCHEMAS)
     + "<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"),
    ("tool_call_response", [(S, "You are helpful."), (U, "List files"), (A, "", [_call("bash", {"command": "ls"})]),
                            {"role": "tool", "tool_name": "bash", "content": "file1.txt\nfile2.txt"}], [BASH], False,
     "<bos><|turn>system\nYou are helpful." + BASH_DECL + "<turn|>\n<|turn>user\nList files<turn|>\n<|turn>model\n"
     "<|tool_call>call:bash{command:" + _q("ls") + "}<tool_call|><|tool_response>response:bash{value:"
     + _q("file1.txt\nfile2.txt") + "}<tool_response|>"),
    ("tool_call_pending_response", [(S, "You are helpful."), (U, "List files"),
                                    (A, "Let me check.", [_call("bash", {"command": "ls"})])], [BASH], False,
     "<bos><|turn>system\nYou are helpful." + BASH_DECL + "<turn|>\n<|turn>user\nList files<turn|>\n<|turn>model\n"
     "<|tool_call>call:bash{command:" + _q("ls") + "}<tool_call|>Let me check.<|tool_response>"),
    ("full_round_trip", [(S, "You are helpful."), (U, "List files"), (A, "", [_call("bash", {"command": "ls"})]),
                         {"role": "tool", "tool_name": "bash", "content": "file1.txt\nfile2.txt"},
                         (A, "Here are the files."), (U, "Read file1.txt")], [BASH, READ], False,
     "<bos><|turn>system\nYou are helpful." + BASH_DECL + READ_DECL + "<turn|>\n<|turn>user\nList files<turn|>\n"
     "<|turn>model\n<|tool_call>call:bash{command:" + _q("ls") + "}<tool_call|><|tool_response>response:bash{value:"
     + _q("file1.txt\nfile2.txt") + "}<tool_response|>Here are the files.<turn|>\n<|turn>user\nRead file1.txt<turn|>\n"
     "<|turn>model\n"),
    ("multiple_tool_calls_with_thinking_ids_and_continuation",
     [(S, "You are a coding assistant."), (U, "List files, then read config."),
      {"role": A, "content": "", "thinking": "Need the directory listing before reading the config.",
       "tool_calls": [_call("bash", {"command": "ls -la"}, "call_bash"), _call("read", {"path": "config.json"}, "call_read")]},
      {"role": "tool", "tool_call_id": "call_read", "content": '{"debug": true}'},
      {"role": "tool", "tool_call_id": "call_bash", "content": "config.json\nmain.go"}, (A, "Config loaded.")],
     [BASH, READ], True,
     "<bos><|turn>system\n<|think|>\nYou are a coding assistant." + BASH_DECL + READ_DECL + "<turn|>\n<|turn>user\n"
     "List files, then read config.<turn|>\n<|turn>model\n<|channel>thought\nNeed the directory listing before reading "
     "the config.\n<channel|><|tool_call>call:bash{command:" + _q("ls -la") + "}<tool_call|><|tool_call>call:read{path:"
     + _q("config.json") + "}<tool_call|><|tool_response>response:read{value:" + _q('{"debug": true}')
     + "}<tool_response|><|tool_response>response:bash{value:" + _q("config.json\nmain.go")
     + "}<tool_response|>Config loaded.<turn|>\n<|turn>model\n"),
    ("derived: argument_values", [(U, "Add"), (A, "", [_call("add", {"b": 2.0, "a": 1, "x": 3.14, "ok": True, "n": None,
                                                                   "l": [1, "two"], "m": {"k": "v"}})]),
                                  {"role": "tool", "tool_name": "add", "content": "3"}], [], False,
     "<bos><|turn>user\nAdd<turn|>\n<|turn>model\n<|tool_call>call:add{a:1,b:2,l:[1," + _q("two") + "],m:{k:" + _q("v")
     + "},n:null,ok:true,x:3.14}<tool_call|><|tool_response>response:add{value:" + _q("3") + "}<tool_response|>"),
    ("derived: thinking_after_tool_results", [(U, "Go"), (A, "", [_call("bash", {"command": "ls"})]),
                                              {"role": "tool", "tool_name": "bash", "content": "ok"}], [BASH], True,
     "<bos><|turn>system\n<|think|>\n" + BASH_DECL + "<turn|>\n<|turn>user\nGo<turn|>\n<|turn>model\n<|tool_call>call:bash{"
     "command:" + _q("ls") + "}<tool_call|><|tool_response>response:bash{value:" + _q("ok") + "}<tool_response|>"
     "<|channel>thought\n"),
]


def _messages(items) -> list[dict]:
    return [m if isinstance(m, dict) else {"role": m[0], "content": m[1], **({"tool_calls": m[2]} if len(m) > 2 else {})}
            for m in items]


@pytest.mark.parametrize("tag", ["e4b", "31b"])
@pytest.mark.parametrize("case, messages, tools, think, expected", TOOL_CASES, ids=[c[0] for c in TOOL_CASES])
def test_tools_render_as_ollamas_gemma4_renderer(engine, store, tag, case, messages, tools, think, expected):
    """Declarations in the system turn, an assistant's calls and their results in its model turn (by tool name or
    call id), its thinking after the last user message; the large variant's empty thought only on a new turn."""
    m = manifest(store, tag)
    if tag == "31b" and not think and expected.endswith("<|turn>model\n"):
        expected += "<|channel>thought\n<channel|>"
    assert tool_format(engine, m, f"ollama:gemma4:{tag}", tools or None) == ("gemma4" if tools else None)
    assert_renders(engine, chat_ids(engine, m, _messages(messages), tools or None, think=think), expected)

# gemma4_reference_test.go (8a0016f): thinking_no_system, thinking_system, thinking_explicitly_disabled, and
# TestGemma4LargeRendererOmitsEmptyThoughtBlockWhenThinkingEnabled (the large variant, `tag` 31b)
THINKING = [
    ("e4b", True, [(U, "Hi")], "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"),
    ("e4b", True, [(S, "You are helpful."), (U, "Hi")],
     "<bos><|turn>system\n<|think|>\nYou are helpful.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"),
    ("e4b", False, [(U, "Hi")], "<bos><|turn>user\nHi<turn|>\n<|turn>model\n"),
    ("31b", True, [(U, "Hello")], "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHello<turn|>\n<|turn>model\n"),
    ("31b", False, [(U, "Hello")], LARGE),
]


@pytest.mark.parametrize("tag, think, messages, expected", THINKING)
def test_thinking_renders_as_ollamas_gemma4_renderer(engine, store, tag, think, messages, expected):
    """Ollama's `think` is the template's enable_thinking: a system turn opening with <|think|>, and no empty
    thought block on the large variant; the capability is listed, and the reply's block is split off."""
    from mlxspec.server.facts import Facts
    from mlxspec.server.thinking import CHANNEL_OPEN, splitter_for

    m = manifest(store, tag)
    assert think_variables(m.template, think) == {"enable_thinking": think}
    assert {"thinking", "tools"} <= set(Facts().capabilities(m))
    msgs = [{"role": role, "content": content} for role, content in messages]
    assert_renders(engine, chat_ids(engine, m, msgs, think=think), expected)
    splitter = splitter_for(m.template, expected[-20:], think)
    assert splitter.open == CHANNEL_OPEN and splitter.keep == think
    assert splitter.feed("<|channel>thought\nhmm<channel|>4") == ("hmm" if think else "", "4")
