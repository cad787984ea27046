"""Embeddings from a generative model: its final hidden states (after the last norm), mean-pooled
over the input's tokens and L2-normalized.

    vectors, tokens = embed(engine, ["some text", [1, 2, 3]], truncate=True, dimensions=None)

Mean pooling is llama.cpp's `mean` (what Ollama's runner asks for unless a model says otherwise);
decoder models have no trained pooling head, and the mean of all positions is steadier than the
last token's state. Each input runs alone through a fresh KV cache, in chunks of PREFILL_CHUNK
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
    """Mean of the final hidden states over `ids` (float32, not normalized)."""
    cache, total = new_cache(model), None
    for i in range(0, len(ids), PREFILL_CHUNK):
        hidden = model.model(mx.array(ids[i : i + PREFILL_CHUNK])[None], cache=cache)  # (1, L, H)
        part = hidden[0].astype(mx.float32).sum(axis=0)
        total = part if total is None else total + part
        mx.eval(total)
    return total / len(ids)


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
