"""Embeddings through the real clients: Ollama's embed/embeddings and OpenAI's embeddings.create.

Unit vectors, one per input; a batch equals its inputs embedded one by one; `dimensions` keeps the
first components and normalizes again; truncation follows `truncate`; bad input is a 400.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import ollama
import openai
import pytest

TEXTS = ["Once upon a time", "def add(a, b):\n    return a + b", "The quick brown fox"]


@pytest.fixture
def client(daemon):
    return ollama.Client(host=daemon.url)


@pytest.fixture
def oai(daemon):
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused")


def test_embed_gives_one_unit_vector_per_input_and_a_batch_equals_singles(client):
    batch = client.embed(model="tiny", input=TEXTS)
    vectors = np.array(batch.embeddings)
    assert vectors.shape[0] == len(TEXTS) and vectors.shape[1] > 1
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    for text, v in zip(TEXTS, vectors):
        assert client.embed(model="tiny", input=text).embeddings[0] == list(v)  # bit for bit
    assert batch.prompt_eval_count > len(TEXTS) and batch.total_duration > 0
    assert not np.allclose(vectors[0], vectors[1])  # different texts, different vectors


def test_dimensions_truncate_and_renormalize(client):
    full = np.array(client.embed(model="tiny", input=TEXTS[0]).embeddings[0])
    short = np.array(client.embed(model="tiny", input=TEXTS[0], dimensions=8).embeddings[0])
    assert short.shape == (8,) and np.isclose(np.linalg.norm(short), 1.0, atol=1e-6)
    assert np.allclose(short, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="tiny", input="x", dimensions=10**6)
    assert e.value.status_code == 400 and "dimensions" in e.value.error


def test_truncate_false_refuses_an_input_longer_than_the_context(client, tiny_llama):
    limit = json.loads((tiny_llama / "config.json").read_text())["max_position_embeddings"]
    long_text = "word " * (limit + 50)
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="tiny", input=long_text, truncate=False)
    assert e.value.status_code == 400 and "truncate" in e.value.error
    cut = client.embed(model="tiny", input=long_text)  # truncate defaults to true
    assert cut.prompt_eval_count == limit


def test_the_older_embeddings_endpoint(client):
    v = client.embeddings(model="tiny", prompt=TEXTS[1]).embedding
    assert list(v) == client.embed(model="tiny", input=TEXTS[1]).embeddings[0]
    assert list(client.embeddings(model="tiny", prompt="").embedding) == []  # as Ollama: loads, answers empty
    assert client.embed(model="tiny", input="").embeddings == []  # so does /api/embed with an empty string


def test_openai_embeddings_floats_base64_and_token_ids(oai, client):
    res = oai.embeddings.create(model="tiny", input=TEXTS)
    assert [d.index for d in res.data] == [0, 1, 2] and res.usage.prompt_tokens > 0
    assert res.data[2].embedding == client.embed(model="tiny", input=TEXTS[2]).embeddings[0]
    raw = oai.embeddings.with_raw_response.create(model="tiny", input=TEXTS[0], encoding_format="base64").http_response.json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, res.data[0].embedding, atol=1e-7)
    by_ids = oai.embeddings.create(model="tiny", input=[[5, 17, 42], [7, 8]])
    assert len(by_ids.data) == 2 and by_ids.usage.prompt_tokens == 5
    with pytest.raises(openai.BadRequestError) as e:
        oai.embeddings.create(model="tiny", input=[[10**7]])
    assert "vocabulary" in e.value.message
