"""The `mlxspec` command: verbs over a daemon in this process, in-process generate, REPL, errors."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import sys
from datetime import datetime, timedelta, timezone

import pytest
from click.testing import CliRunner

from daemon_harness import ThreadDaemon, free_port, wait_until, without_chat_template
from mlxspec.frontend.cli import LAZY_VERBS, cli
from mlxspec.frontend.models import ago, until
from mlxspec.address import parse_host
from mlxspec.emit import Event
from mlxspec.frontend.display import WordWrap
from mlxspec.errors import MlxspecError
from mlxspec.frontend.client import Client
from mlxspec.frontend.repl import Session, repl, stats_from
from mlxspec.server import Settings
from mlxspec.store import Manifest, Store


# A template that can think (Qwen3's switch), and the reply its model streams (a random model cannot think)
THINK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined "
                  "and not enable_thinking %}<think></think>{% endif %}{% endif %}")
THOUGHT, ANSWER = "Two and two make four, as everyone knows.", "The answer is four, which is what you expected."


def thinking(engine):
    """The engine generates as usual (briefly), then streams a reply that thinks first."""
    original = engine.generate

    def generate(prompt, options=None, *, cancel=None, format=None):
        last = None
        for last in original(prompt, dataclasses.replace(options, max_tokens=2), cancel=cancel):
            pass
        yield Event(text=f"<think>{THOUGHT}</think>\n\n")
        yield Event(text=ANSWER, done=True, finish_reason="stop", stats=last.stats)

    engine.generate = generate
    return engine


@pytest.fixture(scope="module")
def daemon(tiny_llama, tmp_path_factory):
    base_model = without_chat_template(tiny_llama, tmp_path_factory.mktemp("cli-base") / "model")
    store = Store(tmp_path_factory.mktemp("cli-home"))
    store.save("tiny", Manifest(target=str(tiny_llama), draft=str(tiny_llama), parameters={"adaptive": False, "num_predict": 16}))
    store.save("base", Manifest(target=str(base_model), parameters={"num_predict": 4}))
    store.save("thinker", Manifest(target=str(tiny_llama), template=THINK_TEMPLATE))
    d = ThreadDaemon(store, Settings()).start()
    registry, load = d.state.registry, d.state.registry.loader
    registry.loader = lambda m: thinking(load(m)) if m.template == THINK_TEMPLATE else load(m)
    yield d
    d.stop()


def invoke(daemon, args, input=None):
    env = {"MLXSPEC_HOST": daemon.host if daemon else f"127.0.0.1:{free_port()}"}
    if daemon:  # the CLI and its daemon share MLXSPEC_HOME: the CLI may then pass local paths
        env["MLXSPEC_HOME"] = str(daemon.state.store.home)
    return CliRunner().invoke(cli, args, env=env, input=input)


def test_times_read_as_english():
    now = datetime.now(timezone.utc)
    assert ago(now.isoformat()) == "just now" and until(now.isoformat()) == "now"
    assert ago((now - timedelta(hours=3)).isoformat()) == "3 hours ago"
    assert until((now + timedelta(minutes=5, seconds=1)).isoformat()) == "5 minutes from now"


def test_host_parsing():
    assert parse_host("") == ("http", "127.0.0.1", 11435)
    assert parse_host(":9000") == ("http", "127.0.0.1", 9000)
    assert parse_host("0.0.0.0:11434") == ("http", "0.0.0.0", 11434)
    assert parse_host("https://example.com") == ("https", "example.com", 443)
    for bad in ("127.0.0.1:99999", "127.0.0.1:0", "host:port"):  # out of range is no port either
        with pytest.raises(MlxspecError, match="the port must be a number from 1 to 65535"):
            parse_host(bad)


def test_run_one_shot_with_verbose_statistics(daemon):
    result = invoke(daemon, ["run", "tiny", "Once upon a time", "--verbose"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip()  # the answer
    assert "drafter: draft-model" in result.stderr and "decode:" in result.stderr and "total duration" in result.stderr
    piped = invoke(daemon, ["run", "tiny"], input="Once upon a time\n")
    assert piped.exit_code == 0 and piped.stdout.strip()


def test_show_says_how_a_gguf_loaded(daemon, tmp_path):
    from gguf_fixtures import Dims, write_tiny_llama_gguf

    path = write_tiny_llama_gguf(tmp_path / "k.gguf", "Q4_K", dims=Dims(hidden=256, ffn=512), output_qtype="Q6_K",
                                 type_overrides={"blk.1.attn_v.weight": "Q3_K", "blk.0.ffn_up.weight": "Q5_0"})
    daemon.state.store.save("k-quants", Manifest(target=str(path)))
    shown = invoke(daemon, ["show", "k-quants"])
    assert shown.exit_code == 0, shown.output
    assert "exact tensors       F32 x5, Q4_K x13, Q5_0 x1" in shown.stdout
    assert "requantized         Q6_K -> q8g32 x1: RMS error" in shown.stdout
    assert "requantized         Q3_K -> q3g32 x1: RMS error" in shown.stdout
    report = json.loads(invoke(daemon, ["show", "k-quants", "-v"]).stdout)["mlxspec"]["gguf_conversion"]
    assert report["requantized"]["output.weight"]["rms_error"] <= report["requantized"]["output.weight"]["source_rms"]


def test_model_verbs(daemon, tiny_llama, tmp_path):
    assert "tiny:latest" in invoke(daemon, ["list"]).stdout
    assert invoke(daemon, ["ls"]).stdout.splitlines()[0].split() == ["NAME", "ID", "SIZE", "MODIFIED"]
    assert invoke(daemon, ["cp", "tiny", "copy:one"]).exit_code == 0
    shown = invoke(daemon, ["show", "copy:one"])
    assert shown.exit_code == 0 and "architecture" in shown.stdout and "draft-model" in shown.stdout
    assert "FROM " in invoke(daemon, ["show", "copy:one", "--modelfile"]).stdout
    assert json.loads(invoke(daemon, ["show", "copy:one", "-v"]).stdout)["mlxspec"]["draft"] == str(tiny_llama)

    invoke(daemon, ["run", "copy:one", "hi", "--keepalive", "5m"])
    ps = invoke(daemon, ["ps"]).stdout
    assert "copy:one" in ps and "draft-model" in ps and "from now" in ps
    assert invoke(daemon, ["stop", "copy:one"]).exit_code == 0
    assert "copy:one" not in invoke(daemon, ["ps"]).stdout
    assert invoke(daemon, ["rm", "copy:one"]).stdout.strip() == "deleted 'copy:one'"
    assert "copy:one" not in invoke(daemon, ["list"]).stdout


def test_create_from_flags_and_from_a_manifest_file(daemon, tiny_llama, tmp_path, monkeypatch):
    made = invoke(daemon, ["create", "made", "--from", str(tiny_llama), "--draft", str(tiny_llama), "--draft-quantize", "q8"])
    assert made.exit_code == 0 and "success" in made.output
    assert daemon.state.store.get("made").draft_quantize == "q8"

    (tmp_path / "weights").symlink_to(tiny_llama)
    (tmp_path / "m.json").write_text(json.dumps({"target": "weights", "drafter": "lookup", "parameters": {"num_predict": 3}}))
    monkeypatch.chdir(tmp_path.parent)  # a relative target is relative to the file, not to where we stand
    from_file = invoke(daemon, ["create", "from-file", "-f", str(tmp_path / "m.json")])
    assert from_file.exit_code == 0, from_file.output
    manifest = daemon.state.store.get("from-file")
    assert manifest.target == str(tiny_llama.resolve()) and manifest.drafter == "lookup"
    assert invoke(daemon, ["run", "from-file", "hi"]).exit_code == 0

    (tmp_path / "block").mkdir()  # a drafter's local source is made absolute too: the daemon may run elsewhere
    for name in ("config.json", "model.safetensors"):  # a folder of weights, as the daemon requires of a path
        (tmp_path / "block" / name).write_text("{}")
    assert invoke(daemon, ["create", "with-mtp", "--from", str(tiny_llama), "--drafter", f"mtp:{tmp_path.name}/block"]).exit_code == 0
    assert daemon.state.store.get("with-mtp").drafter == f"mtp:{(tmp_path / 'block').resolve()}"


@pytest.mark.parametrize(
    "args, words",
    [
        (["run", "no-such-model", "hi"], "cannot pull"),
        (["show", "nothing"], "not found"),
        (["rm", "nothing"], "not found"),
        (["cp", "tiny", "bad name!"], "invalid model name"),
        (["create", "x"], "--from"),
        (["create", "x", "--from", "/no/such/path"], "not found"),
        (["create", "x", "--from", "tiny", "--quantize", "q7"], "unknown quantization"),
        (["run", "tiny", "hi", "--keepalive", "later"], "keep_alive"),
        (["generate"], "Missing argument"),
        (["frobnicate"], "No such command"),
    ],
)
def test_errors_are_one_line_and_exit_1(daemon, args, words):
    result = invoke(daemon, args)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and words in lines[0], result.stderr


def test_no_daemon_is_a_clear_error(tmp_path):
    result = invoke(None, ["list"])
    assert result.exit_code == 1 and "no mlxspec daemon answers" in result.stderr and "mlxspec serve" in result.stderr


def test_run_starts_a_daemon_when_none_answers(tiny_llama, tmp_path):
    home = tmp_path / "home"
    Store(home).save("tiny", Manifest(target=str(tiny_llama)))
    host = f"127.0.0.1:{free_port()}"
    env = {"MLXSPEC_HOST": host, "MLXSPEC_HOME": str(home)}
    try:
        result = CliRunner().invoke(cli, ["run", "tiny", "hello"], env=env)
        assert result.exit_code == 0, result.output
        assert "started one in the background" in result.stderr and result.stdout.strip()
        assert Client(host).is_running()
    finally:  # stop the daemon `run` started: it wrote its pid
        pid_file = home / "serve.pid"
        if wait_until(pid_file.exists, timeout=10):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)


def test_generate_in_process(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path))
    result = CliRunner().invoke(cli, ["generate", str(tiny_llama), "Once upon a time", "-n", "8", "--draft", str(tiny_llama)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() and "drafter: draft-model" in result.stderr and "decode: 8 tokens" in result.stderr
    quiet = CliRunner().invoke(cli, ["generate", str(tiny_llama), "Once upon a time", "-n", "8", "--quiet", "--no-chat"])
    assert quiet.exit_code == 0 and quiet.stderr == ""

    Store(tmp_path).save("named", Manifest(target=str(tiny_llama), drafter="lookup", parameters={"num_predict": 4}))
    named = CliRunner().invoke(cli, ["generate", "named", "Once upon a time", "--draft-length", "3"])
    assert named.exit_code == 0 and "drafter: lookup" in named.stderr and "decode: 4 tokens" in named.stderr  # its parameters
    more = CliRunner().invoke(cli, ["generate", "named", "Once upon a time", "-n", "5"])
    assert more.exit_code == 0 and "decode: 5 tokens" in more.stderr  # the command line wins

    for args, words in (
        (["generate", "nothing-here", "hi"], "not found"),
        (["generate", str(tiny_llama), "hi", "--quantize", "q7"], "unknown quantization"),
        (["generate", str(tiny_llama), "hi", "--drafter", "draft-model"], "needs one"),
        (["generate", str(tiny_llama), "hi", "--temperature", "-2"], "temperature"),
        (["generate", str(tiny_llama), "hi", "--temperature", "1", "--seed", "-5"], "seed"),
    ):
        bad = CliRunner().invoke(cli, args)
        assert bad.exit_code == 1 and words in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_repl(daemon):
    said, lines = [], iter([
        "/set parameter num_predict 4", "/set parameter bogus 1", "Hello", '"""first line', 'second line"""',
        "/show info", "/set verbose", "Again", "/clear", "/nonsense", "/?", "/bye", "never read",
    ])
    session = Session(Client(daemon.host), "tiny", chat=True, echo=lambda text="", **kw: said.append(text))

    def read(prompt):
        line = next(lines)
        if line == "/clear":
            assert len(session.messages) == 6  # three questions, three answers
        return line

    repl(session, read)
    out = "\n".join(str(x) for x in said)
    assert "Set parameter 'num_predict'" in out and "unknown option 'bogus'" in out
    assert session.options == {"num_predict": 4} and session.messages == [] and session.verbose
    assert "architecture" in out and "decode: 4 tokens" in out and "Unknown command '/nonsense'" in out
    assert "/bye" in out  # the help text
    assert next(lines) == "never read"


def test_repl_with_a_base_model_continues_from_the_context(daemon):
    said, lines = [], iter(["Once upon a time", "and then", "/clear", "again"])
    session = Session(Client(daemon.host), "base", chat=False, echo=lambda text="", **kw: said.append(text))
    contexts = []

    def read(prompt):
        contexts.append(len(session.context))
        line = next(lines, None)
        if line is None:
            raise EOFError  # Ctrl-D
        return line

    repl(session, read)
    # the second prompt continues the first (its context grew); /clear starts over
    assert contexts[0] == 0 and contexts[1] > 0 and contexts[2] > contexts[1] and contexts[3] == 0
    assert session.messages == [] and len(session.context) > 0


def test_stats_from_the_final_object():
    stats = stats_from({"drafter": "lookup", "drafted": 4, "accepted": 3, "rounds": 2, "generated_tokens": 5,
                        "acceptance_rate": 0.75, "target_passes": 2})
    assert stats.acceptance_rate == 0.75 and stats.mean_accepted_length == 2.5


def test_lazy_verbs_are_listed_and_load():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0 and "generate" in result.stdout
    for verb in LAZY_VERBS:
        assert f"  {verb} " in result.stdout
        assert CliRunner().invoke(cli, [verb, "--help"]).exit_code == 0


def test_daemon_install_uninstall_status(tmp_path, monkeypatch):
    from mlxspec.frontend import service

    if not sys.platform.startswith("linux"):
        pytest.skip("exercises the systemd path")
    calls = []
    run = lambda cmd: calls.append(cmd) or __import__("subprocess").CompletedProcess(cmd, 0, "", "")  # noqa: E731
    assert "installed" in service.install(tmp_path, run)
    unit = (tmp_path / ".config/systemd/user/mlxspec.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_start.endswith(" serve") and os.path.exists(exec_start[len("ExecStart="):].split()[0])
    assert ["systemctl", "--user", "enable", "--now", "mlxspec.service"] in calls
    assert "installed at" in service.status(tmp_path)
    assert "removed" in service.uninstall(tmp_path, run) and "not installed" in service.status(tmp_path)
    failing = lambda cmd: __import__("subprocess").CompletedProcess(cmd, 1, "", "Failed to connect to bus")  # noqa: E731
    with pytest.raises(Exception, match="Failed to connect to bus"):
        service.install(tmp_path, failing)


def screen(out: str) -> list[str]:
    """The lines a terminal shows for `out` (text, newlines, and word wrap's cursor-left + clear-line)."""
    lines = [""]
    for piece in re.split(r"(\x1b\[\d+D\x1b\[K|\n)", out):
        if piece == "\n":
            lines.append("")
        elif piece.startswith("\x1b["):
            lines[-1] = lines[-1][: -int(piece[2:].split("D")[0])]
        else:
            lines[-1] += piece
    return lines


@pytest.mark.parametrize("size", [1, 3, 7, 100])
def test_word_wrap_moves_whole_words_and_breaks_long_ones(size):
    text = "Once upon a time there was a little robot who loved to count supercalifragilisticexpialidocious things."
    wrap = WordWrap(30)  # lines of at most 25 columns, as Ollama leaves 5 free
    lines = [line.rstrip() for line in screen("".join(wrap.feed(text[i : i + size]) for i in range(0, len(text), size)))]
    assert all(len(line) <= 25 for line in lines) and len(lines) > 3
    assert lines[:3] == ["Once upon a time there", "was a little robot who", "loved to count"]
    assert "".join(lines[3:]) == "supercalifragilisticexpialidocious things."  # too long for a line: broken
    assert screen(WordWrap(30).feed("one\ntwo three")) == ["one", "two three"]


def test_run_flags_format_think_hidethinking(daemon):
    shown = invoke(daemon, ["run", "thinker", "What is 2 + 2?"])  # a model that thinks does by default, as Ollama
    assert shown.exit_code == 0, shown.output
    assert shown.stdout == f"Thinking...\n{THOUGHT}\n...done thinking.\n\n{ANSWER}\n"
    hidden = invoke(daemon, ["run", "thinker", "What is 2 + 2?", "--hidethinking"])
    assert hidden.exit_code == 0 and hidden.stdout == f"{ANSWER}\n"
    off = invoke(daemon, ["run", "thinker", "--think=false", "What is 2 + 2?"])  # not split off: the text as written
    assert off.exit_code == 0 and "Thinking..." not in off.stdout and "<think>" in off.stdout
    bare = invoke(daemon, ["run", "thinker", "--think", "What", "is", "2 + 2?"])  # a bare --think takes no word
    assert bare.exit_code == 0 and bare.stdout.startswith("Thinking...")
    piped = invoke(daemon, ["run", "thinker", "--nowordwrap"], input="What is 2 + 2?")  # piped: never wrapped anyway
    assert piped.exit_code == 0 and ANSWER in piped.stdout

    pytest.importorskip("llguidance")
    constrained = invoke(daemon, ["run", "tiny", "Answer in JSON", "--format", "json"])
    assert constrained.exit_code == 0 and constrained.stdout.lstrip().startswith("{")


@pytest.mark.parametrize("args, words", [
    (["run", "tiny", "hi", "--think=sometimes"], "must be true, false, high, medium, low, or max"),
    (["run", "tiny", "hi", "--format", "yaml"], "must be json or a JSON schema object"),
    (["run", "base", "hi", "--think"], "thinking is only supported on /api/chat"),
])
def test_run_flag_mistakes_are_one_line(daemon, args, words):
    bad = invoke(daemon, args)
    assert bad.exit_code == 1 and words in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_repl_set_format_think_and_wordwrap(daemon):
    said, lines = [], iter(["/set format yaml", "/set format json", "/set noformat", "/set think high", "/set think maybe",
                            "/set nothink", "/set think", "/set nowordwrap", "/set wordwrap", "/?", "What is 2 + 2?"])
    session = Session(Client(daemon.host), "thinker", chat=True, thinks=True, terminal=True, width=lambda: 30,
                      echo=lambda text="", **kw: said.append(text))
    states = []

    def read(prompt):
        states.append((session.format, session.think, session.wordwrap))
        line = next(lines, None)
        if line is None:
            raise EOFError  # Ctrl-D
        return line

    repl(session, read)
    assert states[1:10] == [(None, None, True), ("json", None, True), (None, None, True), (None, "high", True),
                            (None, "high", True), (None, False, True), (None, True, True), (None, True, False), (None, True, True)]
    out = "".join(str(x) for x in said)
    assert "For 'json' mode use '/set format json'" in out and "Invalid think level 'maybe'" in out
    assert all(f"/set {c}" in out for c in ("format json", "noformat", "think", "nothink", "wordwrap", "nowordwrap"))
    answer = screen(out[out.index("Thinking..."):])  # wrapped at 25 columns, words whole
    assert all(len(line) <= 25 for line in answer) and " ".join(answer).split() == \
        ["Thinking...", *THOUGHT.split(), "...done", "thinking.", *ANSWER.split()]
    assert session.messages[-1] == {"role": "assistant", "content": ANSWER, "thinking": THOUGHT}
