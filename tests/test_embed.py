"""mlxspec.embed: which hidden state becomes the vector, and the checks on its inputs."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.embed import embed
from mlxspec.engine import Engine
from mlxspec.errors import PromptError


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine.load(str(tiny_llama), quantize="q4g32")


def test_the_vector_is_the_last_tokens_final_hidden_state(engine):
    ids = [5, 17, 42, 7, 99]
    (vector,), count = embed(engine, [ids])
    hidden = engine.target.model.model(mx.array([ids]))[0].astype(mx.float32)  # no cache: one pass
    last = np.array(hidden[-1])
    assert count == 5 and np.allclose(vector, last / np.linalg.norm(last), atol=1e-5)
    mean = np.array(hidden.mean(axis=0))
    assert not np.allclose(vector, mean / np.linalg.norm(mean), atol=1e-3)  # not mean pooling


def test_inputs_are_checked(engine):
    with pytest.raises(PromptError, match="outside the vocabulary"):
        embed(engine, [[10**6]])
    with pytest.raises(PromptError, match="is empty"):
        embed(engine, ["a", []])
    with pytest.raises(PromptError, match="dimensions"):
        embed(engine, ["a"], dimensions=10**6)
