"""Embeddings from a generative model: the final hidden state (after the last norm) of the input's
last token, L2-normalized.

    vectors, tokens = embed(engine, ["some text", [1, 2, 3]], truncate=True, dimensions=None)

That is what Ollama's llama.cpp runner returns for a model without a pooling type (every decoder
model): the last prompt position's hidden state, normalized by the server; under a causal mask
it is the only position that has seen the whole input. Each input runs alone through a fresh KV cache, in chunks of PREFILL_CHUNK
tokens, so a batch gives exactly the vectors its inputs give one by one. `dimensions` keeps the
first n components and normalizes again (as Ollama and OpenAI do for Matryoshka-style truncation).
"""

from __future__ import annotations

import mlx.core as mx

from .cache import PREFILL_CHUNK, new_cache
from .errors import PromptError


def context_limit(model) -> int | None:
    """The model's trained context length (max_position_embeddings), if its config states one."""
    value = getattr(getattr(model, "args", None), "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def token_ids(engine, item, index: int, truncate: bool) -> list[int]:
    """An input (text or token ids) as the ids to embed, checked against the vocabulary and context."""
    ids = list(engine.tokenizer.encode(item)) if isinstance(item, str) else list(item)
    if not ids:
        raise PromptError(f"input {index} is empty")
    if any(not isinstance(t, int) or t < 0 or t >= engine.vocab_size for t in ids):
        raise PromptError(f"input {index} holds token ids outside the vocabulary (0..{engine.vocab_size - 1})")
    limit = context_limit(engine.target.model)
    if limit and len(ids) > limit:
        if not truncate:
            raise PromptError(f"input {index} has {len(ids)} tokens, more than the model's context of {limit}; "
                              "set truncate to true to cut it")
        ids = ids[:limit]
    return ids


def pooled(model, ids: list[int]) -> mx.array:
    """The final hidden state at the last of `ids` (float32, not normalized)."""
    cache = new_cache(model)
    for i in range(0, len(ids), PREFILL_CHUNK):  # chunks bound the attention scratch, as a prefill does
        hidden = model.model(mx.array(ids[i : i + PREFILL_CHUNK])[None], cache=cache)  # (1, L, H)
        mx.eval(hidden)
    return hidden[0, -1].astype(mx.float32)


def normalized(v: mx.array, dimensions: int | None) -> mx.array:
    if dimensions is not None:
        v = v[:dimensions]
    return v / mx.maximum(mx.linalg.norm(v), 1e-12)


def embed(engine, inputs: list, truncate: bool = True, dimensions: int | None = None) -> tuple[list[list[float]], int]:
    """Unit vectors for `inputs` (strings or token-id lists) and the number of tokens embedded."""
    model = engine.target.model
    size = model.args.hidden_size
    if dimensions is not None and not 1 <= dimensions <= size:
        raise PromptError(f"dimensions {dimensions} is outside 1..{size} (the model's hidden size)")
    all_ids = [token_ids(engine, item, i, truncate) for i, item in enumerate(inputs)]  # every input checked first
    vectors = [normalized(pooled(model, ids), dimensions).tolist() for ids in all_ids]
    return vectors, sum(len(ids) for ids in all_ids)
