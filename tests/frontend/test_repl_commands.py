"""The REPL's commands as Ollama's CLI has them: /show PART, /load, /save, /exit, /set's forms and usages,
a multi-line system message, and a refused request that leaves the session running."""

from __future__ import annotations

import pytest

from daemon_harness import ThreadDaemon, without_chat_template
from mlxspec.frontend.client import Client
from mlxspec.frontend.repl import Session, repl
from mlxspec.server import Settings
from mlxspec.store import Manifest, Store


@pytest.fixture(scope="module")
def daemon(tiny_llama, tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("repl-home"))
    base_model = without_chat_template(tiny_llama, tmp_path_factory.mktemp("repl-base") / "model")
    store.save("tiny", Manifest(target=str(tiny_llama), system="Be brief.", license=["MIT, for tests"],
                                parameters={"num_predict": 3}))
    store.save("base", Manifest(target=str(base_model), parameters={"num_predict": 3}))
    d = ThreadDaemon(store, Settings()).start()
    yield d
    d.stop()


def session_for(daemon, model="tiny", chat=True) -> tuple[Session, list]:
    said = []
    return Session(Client(daemon.host), model, chat=chat, echo=lambda text="", **kw: said.append(str(text))), said


def run_lines(session: Session, lines: list[str]) -> list[str]:
    """Run the REPL over `lines`, then Ctrl-D; the lines left unread."""
    left = iter(lines)

    def read(prompt):
        line = next(left, None)
        if line is None:
            raise EOFError
        return line

    repl(session, read)
    return list(left)


def test_show_parts(daemon):
    session, said = session_for(daemon)
    run_lines(session, ["/show system", "/show license", "/show parameters", "/show template", "/show modelfile"])
    out = "\n".join(said)
    assert "Be brief." in out and "MIT, for tests" in out and "num_predict 3" in out
    assert "{% for m in messages %}" in out and "FROM " in out and "Unknown command" not in out
    session, said = session_for(daemon)
    run_lines(session, ["/show", "/show nonsense"])
    out = "\n".join(said)
    assert "/show info" in out and "modelfile" in out and "/set system" not in out  # /show alone: its usage
    assert "Unknown command '/show nonsense'" in out


def test_show_system_says_the_sessions_own(daemon):
    session, said = session_for(daemon)
    run_lines(session, ["/set system Answer in French.", "/show system", "/bye"])
    assert said[-1].strip() == "Answer in French."


def test_set_forms_and_usages(daemon):
    session, said = session_for(daemon)
    run_lines(session, ["/set parameter stop a b", "/set parameter stop c", "/set parameter", "/set", "/set nonsense"])
    assert session.options == {"stop": ["c"]}  # as Ollama: the words given, replacing the earlier ones
    out = "\n".join(said)
    assert "Set parameter 'stop' to 'a, b'" in out
    assert "Available Parameters" in out and "/set parameter stop" in out  # /set parameter alone
    assert "/set system <string>" in out  # /set alone
    assert "Unknown command '/set nonsense'" in out
    session, said = session_for(daemon)
    run_lines(session, ["/help set", "/? show"])
    assert "/set system <string>" in said[1] and "/show" not in said[1] and "/show license" in said[2]


def test_multi_line_system_message(daemon):
    session, said = session_for(daemon)
    run_lines(session, ['/set system """You are terse.', 'Answer in one word."""', "/bye"])
    assert session.system == "You are terse.\nAnswer in one word." and "Set system message." in said


def test_a_triple_quoted_block_is_always_a_message(daemon):
    """As Ollama's CLI (cmd/interactive.go): text between \"\"\" is a message even where it starts with '/'."""
    session, said = session_for(daemon)
    left = run_lines(session, ['"""/bye is no command here', '/set system neither"""', '"""/show info"""', "/bye", "never"])
    assert left == ["never"] and session.system is None
    assert [m["content"] for m in session.messages if m["role"] == "user"] == \
        ["/bye is no command here\n/set system neither", "/show info"]
    assert not any("Unknown command" in line or "Set system" in line or "architecture" in line for line in said)


def test_exit_ends_the_session(daemon):
    session, _ = session_for(daemon)
    assert run_lines(session, ["/exit", "never read"]) == ["never read"]


def test_load_another_model_and_a_missing_one(daemon):
    session, said = session_for(daemon)
    run_lines(session, ["Hello", "/load nothing", "/load base"])
    assert "Couldn't find model 'nothing'" in "\n".join(said)
    assert session.model == "base" and not session.chat and session.messages == []  # a new conversation
    session, said = session_for(daemon)
    run_lines(session, ["/load"])
    assert "/load <model>" in "\n".join(said)


def test_save_the_session_as_a_model(daemon):
    session, said = session_for(daemon)
    run_lines(session, ["/set system Be curt.", "/set parameter num_predict 2", "Hello", "/save saved", "/save bad!name"])
    out = "\n".join(said)
    assert "Created new model 'saved'" in out and "invalid model name" in out  # a bad name: said, not the end
    saved = daemon.state.store.get("saved")
    assert saved.system == "Be curt." and saved.parameters == {"num_predict": 2}
    assert [m["role"] for m in saved.messages] == ["user", "assistant"] and saved.messages[0]["content"] == "Hello"

    loaded, _ = session_for(daemon, "base", chat=False)
    run_lines(loaded, ["/load saved", "/save saved-again"])  # the saved conversation is kept by a later save
    assert daemon.state.store.get("saved-again").messages == saved.messages


def test_a_refused_request_does_not_end_the_session(daemon):
    session, said = session_for(daemon, "base", chat=False)
    left = run_lines(session, ["/set think", "Hello", "/set nothink", "/bye", "never read"])
    assert left == ["never read"]  # the REPL went on after the daemon refused thinking on /api/generate
    assert any(line.startswith("Error: ") and "thinking" in line for line in said)
