"""Models of Ollama's store through the daemon, with the official `ollama` and `openai` clients:
listed, shown, generated from, created from; never changed (the store is byte-identical after each test)."""

from __future__ import annotations

import ollama
import openai
import pytest

from api_helpers import post
from daemon_harness import ThreadDaemon
from fake_ollama import GO_TEMPLATE, add_model, snapshot
from gguf_fixtures import write_tiny_llama_gguf
from mlxspec.modelfile import parse
from mlxspec.engine import Engine
from mlxspec.options import GenerateOptions
from mlxspec.server import Settings
from mlxspec.store import Manifest, Store

SYSTEM = "You answer in one word."
PARAMS = {"stop": ["<|im_end|>"], "num_predict": 5, "mirostat": 2}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("ollama-gguf") / "tiny.gguf", "Q4_0")


@pytest.fixture(scope="module")
def ollama_root(tmp_path_factory, gguf_file):
    root = tmp_path_factory.mktemp("ollama") / "models"
    add_model(root, "tiny", gguf_file, system=SYSTEM, params=PARAMS, license="MIT, for tests")
    add_model(root, "tiny", gguf_file, "bare", template=None)
    return root


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, ollama_root, gguf_file):
    store = Store(tmp_path_factory.mktemp("home"), ollama_models=ollama_root)
    store.save("tiny", Manifest(target=str(gguf_file), parameters={"num_predict": 3}))  # same name, mlxspec's store
    d = ThreadDaemon(store, Settings()).start()
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def unchanged(ollama_root):
    """Every test leaves Ollama's store exactly as it found it."""
    before = snapshot(ollama_root)
    yield
    assert snapshot(ollama_root) == before


@pytest.fixture
def client(daemon):
    return ollama.Client(host=daemon.url)


def expected(gguf_file, messages: list[dict], n: int) -> str:
    """What the GGUF itself answers, with the Ollama model's system prompt and stop string."""
    engine = Engine.load(str(gguf_file))
    ids = engine.chat_prompt([{"role": "system", "content": SYSTEM}, *messages])
    return "".join(e.text for e in engine.generate(ids, GenerateOptions(max_tokens=n, stop=["<|im_end|>"])))


def test_list_has_both_stores_apart(client, daemon):
    models = {m.model: m for m in client.list().models}
    assert {"tiny:latest", "ollama:tiny:latest", "ollama:tiny:bare"} <= set(models)
    theirs = models["ollama:tiny:latest"]
    assert theirs.details.family == "llama" and theirs.details.quantization_level == "Q4_0" and theirs.size > 80_000
    status, tags = post(daemon.url + "/api/tags", b"", method="GET")
    sources = {m["name"]: m["source"] for m in tags["models"]}
    assert sources["ollama:tiny:latest"] == "ollama" and sources["tiny:latest"] == "mlxspec"


def test_show_reports_the_layers(client, daemon):
    shown = client.show("ollama:tiny")
    assert parse(shown.modelfile)["system"] == SYSTEM and shown.license == "MIT, for tests"
    assert 'stop "<|im_end|>"' in shown.parameters and "num_predict 5" in shown.parameters
    assert shown.template == GO_TEMPLATE  # Ollama's template, translated, is the one in force
    assert "FROM ollama:tiny:latest" in shown.modelfile and shown.details.format == "gguf"
    status, raw = post(daemon.url + "/api/show", {"model": "ollama:tiny"})
    assert status == 200 and raw["system"] == SYSTEM
    extra = raw["mlxspec"]["ollama"]
    assert extra["template"] == GO_TEMPLATE and "translated to Jinja" in extra["template_note"]
    assert extra["read_only"] and set(extra["parameters_not_applied"]) == {"mirostat"}
    assert raw["mlxspec"]["template_source"] == "manifest"  # the translated Go template


def test_generate_and_chat_use_the_blob_system_and_params(client, gguf_file):
    answer = client.generate(model="ollama:tiny", prompt="Hello there")
    assert answer.model == "ollama:tiny:latest" and answer.eval_count <= 5  # num_predict from the params layer
    assert answer.response == expected(gguf_file, [{"role": "user", "content": "Hello there"}], 5)
    chat = client.chat(model="ollama:registry.ollama.ai/library/tiny", messages=[{"role": "user", "content": "Hi"}],
                       options={"num_predict": 4})
    assert chat.message.content == expected(gguf_file, [{"role": "user", "content": "Hi"}], 4)
    ours = client.generate(model="tiny", prompt="Hello there")
    assert ours.model == "tiny:latest" and ours.eval_count <= 3  # the bare name is mlxspec's own model


def test_openai_api_lists_and_answers(daemon):
    oai = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    owners = {m.id: m.owned_by for m in oai.models.list().data}
    assert owners["ollama:tiny:latest"] == "ollama" and owners["tiny:latest"] == "library"
    reply = oai.chat.completions.create(model="ollama:tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert reply.model == "ollama:tiny:latest" and reply.usage.completion_tokens <= 3
    assert oai.models.retrieve("ollama:tiny:bare").owned_by == "ollama"


def test_create_from_an_ollama_model(client, gguf_file):
    client.create(model="mine", from_="ollama:tiny")
    shown = client.show("mine")
    assert parse(shown.modelfile)["system"] == SYSTEM and "FROM ollama:tiny:latest" in shown.modelfile
    assert client.generate(model="mine", prompt="Hello there").response == client.generate(model="ollama:tiny", prompt="Hello there").response
    client.delete("mine")


def test_writes_to_ollamas_store_are_refused(client):
    with pytest.raises(ollama.ResponseError) as err:
        client.delete("ollama:tiny")
    assert err.value.status_code == 400 and "ollama rm tiny:latest" in err.value.error
    for call in (lambda: client.copy("tiny", "ollama:tiny:copy"), lambda: client.create(model="ollama:new", from_="tiny")):
        with pytest.raises(ollama.ResponseError) as err:
            call()
        assert err.value.status_code == 400 and "only reads" in err.value.error
    assert client.pull("ollama:tiny").status == "success"  # nothing to fetch: it is there
    assert "ollama:tiny:latest" in {m.model for m in client.list().models}


@pytest.mark.parametrize("model, status, words", [
    ("ollama:tiny:7b", 404, "tiny has tag(s) bare, latest"),
    ("ollama:absent", 404, "ollama pull absent:latest"),
    ("ollama:bad name", 400, "invalid Ollama model name"),
])
def test_bad_references(client, model, status, words):
    for call in (lambda: client.generate(model=model, prompt="hi"), lambda: client.show(model)):
        with pytest.raises(ollama.ResponseError) as err:
            call()
        assert err.value.status_code == status and words in err.value.error
