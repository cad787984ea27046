"""Pull through the real download path: `mlxspec serve` in a subprocess with HF_ENDPOINT pointing at
a local stand-in for the Hugging Face hub; the official ollama client and the CLI pull from it.
"""

from __future__ import annotations

import threading
import time

import ollama
import pytest
from click.testing import CliRunner

from daemon_harness import BackgroundServer, ProcessDaemon
from fake_hub import FakeHub
from mlxspec.frontend.cli import cli
from mlxspec.store import Store

QWEN_TARGET = "mlx-community/Qwen2.5-7B-Instruct-4bit"  # what models/qwen2.5-7b-spec.json names
QWEN_DRAFT = "lmstudio-community/Qwen2.5-0.5B-Instruct-MLX-8bit"


@pytest.fixture(scope="module")
def hub(tiny_llama):
    fake = FakeHub()
    for repo in (QWEN_TARGET, QWEN_DRAFT, "acme/tiny-llama"):
        fake.add(repo, tiny_llama)  # the tiny model plays both roles: same tokenizer, a draft that agrees
    server = BackgroundServer(fake.app).start()
    server.fake = fake
    yield server
    server.stop()


def start_daemon(tmp_path, hub, name="home") -> ProcessDaemon:
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1"}
    return ProcessDaemon(tmp_path / name, env).start()


@pytest.fixture(scope="module")
def daemon(hub, tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("pull"), hub)
    yield d
    d.stop()


def test_pull_a_shipped_pair_with_progress(daemon, tmp_path):
    client = ollama.Client(host=daemon.url)
    updates = list(client.pull("qwen2.5-7b-spec", stream=True))
    statuses = [u.status for u in updates]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    for repo in (QWEN_TARGET, QWEN_DRAFT):
        mine = [u for u in updates if u.digest == repo]
        assert mine and mine[-1].total > 400_000 and mine[-1].completed == mine[-1].total
    assert "qwen2.5-7b-spec:latest" in {m.model for m in client.list().models}
    assert list((daemon.home.parent / "hf" / "hub").glob("models--mlx-community--Qwen2.5-7B-Instruct-4bit/snapshots/*/model.safetensors"))

    out = client.generate(model="qwen2.5-7b-spec", prompt="Hi", options={"num_predict": 6, "adaptive": False})
    assert out.eval_count == 6
    shown = client.show("qwen2.5-7b-spec")
    assert shown.modelinfo["general.architecture"] == "llama"  # read from the downloaded files
    assert next(m for m in client.list().models if m.model == "qwen2.5-7b-spec:latest").size > 900_000  # both


def test_pull_a_repo_id_with_the_cli(daemon):
    result = CliRunner().invoke(cli, ["pull", "acme/tiny-llama"], env={"MLXSPEC_HOST": daemon.host})
    assert result.exit_code == 0, result.output
    assert "success" in result.output and "pulling acme/tiny-llama" in result.output
    assert Store(daemon.home).get("acme/tiny-llama").target == "acme/tiny-llama"
    missing = CliRunner().invoke(cli, ["pull", "acme/missing"], env={"MLXSPEC_HOST": daemon.host})
    assert missing.exit_code == 1 and "not found on the Hugging Face hub" in missing.output
    assert not Store(daemon.home).exists("acme/missing")


def _pull_until_progress(daemon, name: str, updates: list) -> threading.Event:
    """Pull in a thread; the event is set once some bytes (not all) have arrived."""
    partly = threading.Event()

    def run():
        try:
            for u in ollama.Client(host=daemon.url).pull(name, stream=True):
                updates.append(u)
                if u.completed and u.total and u.completed < u.total:
                    partly.set()
        except Exception as e:  # the daemon dies under it: that is the point
            updates.append(e)
        partly.set()

    threading.Thread(target=run, daemon=True).start()
    return partly


def test_a_killed_pull_leaves_no_model_and_a_second_pull_completes(hub, tiny_llama, tmp_path, request):
    hub.fake.add("acme/slow", tiny_llama, slow=True)
    d = start_daemon(tmp_path, hub)
    request.addfinalizer(d.stop)
    updates: list = []
    assert _pull_until_progress(d, "acme/slow", updates).wait(30)
    assert any(getattr(u, "completed", 0) for u in updates)
    d.kill()  # half-way: the daemon dies
    store = Store(d.home)
    assert not store.exists("acme/slow") and store.list() == []
    assert not [p for p in store.home.rglob("*") if p.is_file() and p.suffix in (".json", ".tmp")]

    d = start_daemon(tmp_path, hub)
    request.addfinalizer(d.stop)
    client = ollama.Client(host=d.url)
    assert "acme/slow:latest" not in {m.model for m in client.list().models}
    assert client.pull("acme/slow").status == "success"
    assert client.generate(model="acme/slow", prompt="Hi", options={"num_predict": 3}).eval_count == 3


def test_a_client_that_leaves_abandons_the_pull(hub, tiny_llama, daemon):
    hub.fake.add("acme/slow-two", tiny_llama, slow=True)
    client = ollama.Client(host=daemon.url)
    stream = client.pull("acme/slow-two", stream=True)
    assert next(stream).status == "pulling manifest"
    stream.close()  # the client goes away while the weights are still coming
    time.sleep(3)  # longer than the slow download takes
    assert "acme/slow-two:latest" not in {m.model for m in client.list().models}
    assert not Store(daemon.home).exists("acme/slow-two")


@pytest.fixture(scope="module")
def gguf_repo(hub, tmp_path_factory):
    """A GGUF repo as people publish them: two quantizations, a vision projector, a README."""
    from gguf_fixtures import write_tiny_llama_gguf

    folder = tmp_path_factory.mktemp("gguf-repo")
    write_tiny_llama_gguf(folder / "Tiny-Q8_0.gguf", "Q8_0")
    write_tiny_llama_gguf(folder / "Tiny-Q4_0.gguf", "Q4_0")
    (folder / "mmproj-Tiny-F16.gguf").write_bytes(b"not the model")
    (folder / "README.md").write_text("tiny")
    hub.fake.add("acme/Tiny-GGUF", folder)
    return "acme/Tiny-GGUF"


def test_pull_a_gguf_from_a_hub_repo_by_quantization(daemon, gguf_repo):
    """Ollama's hf.co/ORG/REPO:QUANT: the file of that quantization is fetched (not the repo), stored as
    org/repo:quant; no tag picks Ollama's default or the nearest (Q4_0 here); a missing one is named."""
    client = ollama.Client(host=daemon.url)
    assert client.pull(f"hf.co/{gguf_repo}:Q8_0").status == "success"
    store = Store(daemon.home)
    assert store.get("acme/tiny-gguf:q8_0").target == f"hf.co/{gguf_repo}:Q8_0"
    snapshot = next((daemon.home.parent / "hf" / "hub").glob("models--acme--Tiny-GGUF/snapshots/*"))
    assert sorted(p.name for p in snapshot.iterdir()) == ["Tiny-Q8_0.gguf"]
    out = client.generate(model="acme/tiny-gguf:q8_0", prompt="Hi", options={"num_predict": 4})
    assert out.eval_count == 4
    assert client.show("acme/tiny-gguf:q8_0").modelinfo["general.architecture"] == "llama"

    same = client.generate(model=f"hf.co/{gguf_repo}:Q8_0", prompt="Hi", options={"num_predict": 4})  # as Ollama
    assert same.response == out.response
    with pytest.raises(ollama.ResponseError, match="try pulling it first"):
        client.generate(model=f"hf.co/{gguf_repo}", prompt="Hi")
    assert client.pull(f"hf.co/{gguf_repo}").status == "success"  # no tag: Q4_K_M, else the nearest (Q4_0)
    assert (snapshot / "Tiny-Q4_0.gguf").is_file() and store.get("acme/tiny-gguf:latest").target == f"hf.co/{gguf_repo}"
    with pytest.raises(ollama.ResponseError, match=r"has no Q2_K GGUF \(it has: Q4_0, Q8_0\)"):
        client.pull(f"hf.co/{gguf_repo}:Q2_K")
    assert not store.exists("acme/tiny-gguf:q2_k")


def pull_shipped_pair(daemon, hub, name: str, target, source_folder) -> set[str]:
    """Pull the shipped `name`, its target and its drafter's source served from these folders; decode with it
    and with its target alone (a model created over HTTP, drafter none): the same answer, drafted by its own
    drafter, exactly. Returns the files the hub served of the drafter's source repo."""
    from server.api_helpers import ndjson_lines, post

    shipped = Store(daemon.home).shipped(name)
    kind, source = shipped.drafter_source
    hub.fake.add(shipped.target, target)
    hub.fake.add(source, source_folder)
    client = ollama.Client(host=daemon.url)
    assert client.pull(name).status == "success"
    status, lines = ndjson_lines(daemon.url + "/api/create",  # drafter: mlxspec's own field
                                 {"model": "plain-twin", "from": shipped.target, "drafter": "none"})
    assert status == 200 and lines[-1] == {"status": "success"}, lines
    body = {"prompt": "the world and the", "raw": True, "stream": False,
            "options": {"temperature": 0, "num_predict": 10, "adaptive": False, "draft_length": 2}}
    try:
        (_, drafted), (_, plain) = (post(daemon.url + "/api/generate", {"model": m, **body}) for m in (name, "plain-twin"))
        assert drafted["response"] == plain["response"]
        spec = drafted["speculative"]
        assert spec["drafter"] == kind and spec["drafted"] > 0 and spec["exact"] is True
    finally:
        for model in (name, "plain-twin"):
            client.generate(model=model, keep_alive=0)
            client.delete(model)
    return {path for repo, path in hub.fake.served if repo == source}


def test_an_mtp_block_is_fetched_alone_from_the_original_checkpoint(daemon, hub, tmp_path):
    """The shipped qwen3.5-9b-mtp: an MLX conversion (no mtp.* tensors) drafted by mtp:Qwen/Qwen3.5-9B. Pulling
    it fetches the conversion and, of the original checkpoint, the config, index and the one shard holding the
    block, never its trunk. Its answers are plain decoding's."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from model_factory import make_qwen35_checkpoint
    from mlxspec.loading import load

    original = make_qwen35_checkpoint(tmp_path / "original")
    converted = tmp_path / "converted"
    converted.mkdir()
    for f in original.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            (converted / f.name).write_bytes(f.read_bytes())
    mx.save_safetensors(str(converted / "model.safetensors"), dict(tree_flatten(load(str(original)).model.parameters())),
                        metadata={"format": "mlx"})
    served = pull_shipped_pair(daemon, hub, "qwen3.5-9b-mtp", converted, original)
    assert served == {"config.json", "model.safetensors.index.json", "model-00002-of-00002.safetensors"}


def test_a_shipped_eagle3_pair_pulls_its_head(daemon, hub, tmp_path):
    """qwen3-8b-eagle3: the target and the EAGLE-3 head's repo are fetched by pull; its answers are plain's."""
    import json

    from model_factory import make_model_dir
    from test_eagle3 import write_head

    target = make_model_dir(tmp_path / "target", "llama", layers=8, seed=2)  # the tiny model plays Qwen3-8B
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    head = write_head(tmp_path / "head", 64, vocab, draft_vocab=vocab // 2, convention="speculators")
    assert pull_shipped_pair(daemon, hub, "qwen3-8b-eagle3", target, head) == {"config.json", "model.safetensors"}


def test_a_shipped_gemma4_pair_pulls_its_assistant(daemon, hub, tmp_path):
    """gemma-4-26b-a4b-mtp: the target and Google's assistant (a gemma4_assistant repo, fetched whole)."""
    from model_factory import make_gemma4_dir
    from test_gemma4_assistant import write_assistant

    target = make_gemma4_dir(tmp_path / "target", layers=8)  # the tiny model plays Gemma 4 26B-A4B
    assistant = write_assistant(tmp_path / "assistant", target)
    assert pull_shipped_pair(daemon, hub, "gemma-4-26b-a4b-mtp", target, assistant) == {"config.json", "model.safetensors"}
