"""`mlxspec create NAME -f Modelfile` and `mlxspec show NAME --modelfile` (issue 12 item 4)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from daemon_harness import ThreadDaemon
from mlxspec.frontend.cli import cli
from mlxspec.server import Settings
from mlxspec.store import Store


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = ThreadDaemon(Store(tmp_path_factory.mktemp("modelfile-home")), Settings()).start()
    yield d
    d.stop()


def invoke(daemon, args):
    # the CLI and its daemon share MLXSPEC_HOME: the CLI may then pass local paths (local.key)
    env = {"MLXSPEC_HOST": daemon.host, "MLXSPEC_HOME": str(daemon.state.store.home)}
    return CliRunner().invoke(cli, args, env=env)


def test_create_from_a_modelfile_and_show_one_that_round_trips(daemon, tiny_llama, tmp_path, monkeypatch):
    (tmp_path / "weights").symlink_to(tiny_llama)
    (tmp_path / "Modelfile").write_text(
        "FROM ./weights\nDRAFTER lookup\nPARAMETER num_predict 4\nPARAMETER stop END\nPARAMETER stop STOP\n"
        'SYSTEM """Be brief.\nVery."""\nTEMPLATE {{ .System }} {{ .Prompt }}\nMESSAGE user hi\nLICENSE MIT\n'
    )
    monkeypatch.chdir(tmp_path.parent)  # FROM ./weights is relative to the Modelfile, not to where we stand
    made = invoke(daemon, ["create", "mf", "-f", str(tmp_path / "Modelfile")])
    assert made.exit_code == 0 and "success" in made.output, made.output
    first = daemon.state.store.get("mf")
    assert first.target == str(tiny_llama.resolve()) and first.parameters == {"num_predict": 4, "stop": ["END", "STOP"]}

    shown = invoke(daemon, ["show", "mf", "--modelfile"])
    assert shown.exit_code == 0 and shown.stdout.count("PARAMETER stop") == 2
    (tmp_path / "again").write_text(shown.stdout)
    assert invoke(daemon, ["create", "mf2", "-f", str(tmp_path / "again")]).exit_code == 0
    assert daemon.state.store.get("mf2") == first
    assert invoke(daemon, ["run", "mf2", "Once upon a time"]).exit_code == 0

    monkeypatch.chdir(tmp_path)  # no -f: ./Modelfile, as Ollama's CLI
    assert invoke(daemon, ["create", "mf3"]).exit_code == 0 and daemon.state.store.get("mf3") == first


@pytest.mark.parametrize("text, words", [
    ("FROM tiny\nPARAMETER mirostat_x 1\n", "'mirostat_x': unknown parameter"),
    ("FROM {model}\nTEMPLATE {{{{ .Tools }}}}\n", ".Tools is not supported"),
    ("FROM {model}\nADAPTER ./lora.gguf\n", "ADAPTER"),
])
def test_modelfile_mistakes_are_one_line(daemon, tiny_llama, tmp_path, text, words):
    (tmp_path / "Modelfile").write_text(text.format(model=tiny_llama))
    result = invoke(daemon, ["create", "bad", "-f", str(tmp_path / "Modelfile")])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and words in lines[0], result.output
