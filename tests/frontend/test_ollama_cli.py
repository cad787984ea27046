"""`ollama:` models from the command line: `mlxspec serve` reading OLLAMA_MODELS, list/show/run/create/rm
over it, in-process `generate` and `bench`; Ollama's store byte-identical after every command."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from daemon_harness import ProcessDaemon
from fake_ollama import add_model, snapshot
from gguf_fixtures import write_tiny_llama_gguf
from mlxspec.frontend.bench import bench
from mlxspec.frontend.cli import cli

SYSTEM = "You answer in one word."


@pytest.fixture(scope="module")
def ollama_root(tmp_path_factory):
    gguf_file = write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "Q4_0")
    root = tmp_path_factory.mktemp("ollama") / "models"
    add_model(root, "tiny", gguf_file, system=SYSTEM, params={"num_predict": 5}, license="MIT, for tests")
    add_model(root, "tiny", gguf_file, "bare", template=None)
    return root


@pytest.fixture(autouse=True)
def unchanged(ollama_root):
    before = snapshot(ollama_root)
    yield
    assert snapshot(ollama_root) == before


@pytest.fixture(scope="module")
def served(tmp_path_factory, ollama_root):
    daemon = ProcessDaemon(tmp_path_factory.mktemp("home"), env={"OLLAMA_MODELS": str(ollama_root)}).start()
    yield daemon
    daemon.stop()


def invoke(args, env: dict, command=cli):
    return CliRunner().invoke(command, args, env=env)


def one_line_error(result, words: str) -> bool:
    return result.exit_code == 1 and words in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_verbs_over_a_daemon_that_read_ollama_models(served):
    env = {"MLXSPEC_HOST": served.host, "MLXSPEC_HOME": str(served.home)}
    listed = invoke(["list"], env).stdout
    assert "ollama:tiny:latest" in listed and "ollama:tiny:bare" in listed
    assert invoke(["show", "ollama:tiny", "--system"], env).stdout.strip() == SYSTEM
    assert invoke(["show", "ollama:tiny", "--license"], env).stdout.strip() == "MIT, for tests"
    assert "architecture" in invoke(["show", "ollama:tiny"], env).stdout

    answer = invoke(["run", "ollama:tiny", "Hello there", "--verbose"], env)
    assert answer.exit_code == 0 and answer.stdout.strip(), answer.output
    assert "decode: 5 tokens" in answer.stderr  # num_predict from the params layer

    assert one_line_error(invoke(["rm", "ollama:tiny"], env), "ollama rm tiny:latest")
    assert one_line_error(invoke(["run", "ollama:tiny:7b", "hi"], env), "tiny has tag(s) bare, latest")
    created = invoke(["create", "mine", "--from", "ollama:tiny", "--drafter", "lookup"], env)
    assert created.exit_code == 0, created.output
    assert "mine:latest" in invoke(["list"], env).stdout
    assert invoke(["show", "mine", "--system"], env).stdout.strip() == SYSTEM
    assert invoke(["rm", "mine"], env).exit_code == 0


def test_generate_in_process_reads_ollama_models(ollama_root, tmp_path):
    env = {"OLLAMA_MODELS": str(ollama_root), "MLXSPEC_HOME": str(tmp_path)}
    result = invoke(["generate", "ollama:tiny", "Hello there", "--draft", "ollama:tiny:bare"], env)
    assert result.exit_code == 0, result.output
    assert "drafter: draft-model" in result.stderr and "decode: 5 tokens" in result.stderr  # its params
    assert one_line_error(invoke(["generate", "ollama:absent", "hi"], env), "ollama pull absent:latest")
    assert one_line_error(invoke(["generate", "ollama:tiny", "hi"], {**env, "OLLAMA_MODELS": str(tmp_path)}), "not found")


def test_bench_an_ollama_model(ollama_root, tmp_path):
    env = {"OLLAMA_MODELS": str(ollama_root), "MLXSPEC_HOME": str(tmp_path)}
    args = ["ollama:tiny", "--drafters", "lookup", "--draft-lengths", "2", "--max-tokens", "4", "--repeats", "1",
            "--no-peers", "--bandwidth-mib", "4", "--prompts", "prose"]
    result = invoke(args, env, bench)
    assert result.exit_code == 0, result.output
    assert "lookup k=2" in result.stdout and "ollama:tiny" in result.stdout
