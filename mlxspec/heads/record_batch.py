"""Recording several answers at once: B prompts decoded greedily side by side, one target pass per step.

One step reads every weight once whatever the row count, which is what a GPU wants: there a batch
of answers should cost little more than one (not measured: no GPU here). On this 2-core CPU it does
not pay: the rows run the model's own module path (mlxspec's fused one-row blocks do not take a
batch) and 4-bit matmuls are compute-bound, so recording 32 prompts x 160 tokens of SmolLM2 ran at
37-41 tok/s with batches of 8 or 16 against 67-68 tok/s one at a time through the engine (two
alternating runs each). `mlxspec train-drafter --batch N` chooses; the default is 1.

Recording is training data, not output: the answers run over mlx-lm's BatchKVCache (left-padded
prompts), and their rows may differ from one-row decoding in the last bits; an answer may then part
from the engine's own greedy answer at a near tie, and it is still an answer the target wrote.

    record_wave(engine, [prompt ids, ...], max_answer) -> [(answer ids, hidden (rows, D))], in order

A finished answer (EOS or max_answer) leaves the batch at once (its cache rows are filtered out).
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from ..cache import PREFILL_CHUNK
from ..features import head as target_head


def record_wave(engine, prompts: list[list[int]], max_answer: int,
                eos: set[int] | None = None) -> list[tuple[list[int], mx.array]]:
    """Greedy answers to these prompt ids, each with the final hidden states of every position the
    target read, as `FeatureTap` keeps them: (answer, hidden (rows, D)); an answer cut at
    max_answer has no row for its last token (never read), one ended by EOS has. `eos`: the end
    tokens (the tokenizer's by default)."""
    model = engine.target.model
    body, head = model.model, target_head(model)
    eos = set(engine.tokenizer.eos_token_ids) if eos is None else eos
    pads = [max(map(len, prompts)) - len(p) for p in prompts]
    x = mx.array([[0] * pad + p for p, pad in zip(prompts, pads)], dtype=mx.uint32)  # (B, L) left-padded
    cache = [BatchKVCache(pads) for _ in body.layers]
    hidden = []  # the prompts, a chunk at a time (bounds the attention scratch, as the engine's prefill)
    for start in range(0, x.shape[1], PREFILL_CHUNK):
        hidden.append(body(x[:, start : start + PREFILL_CHUNK], cache=cache))
        mx.eval(hidden[-1], [c.state for c in cache])
    hidden = mx.concatenate(hidden, axis=1)  # (B, L, D)
    nxt = mx.argmax(head(hidden[:, -1]), axis=-1)  # (B,)
    rows = [[hidden[i, pad:]] for i, pad in enumerate(pads)]  # per answer: (m, D) blocks
    answers: list[list[int]] = [[] for _ in prompts]
    live = list(range(len(prompts)))  # answers still being written, in batch order
    while live:
        tokens = nxt.tolist()  # the step's one host read-back
        keep = []
        for j, (i, t) in enumerate(zip(live, tokens)):
            if t in eos:
                continue
            answers[i].append(t)
            if len(answers[i]) < max_answer:
                keep.append(j)
        if not keep:
            break
        if len(keep) < len(live):  # finished answers leave the batch
            index = mx.array(keep, dtype=mx.int32)
            for c in cache:
                c.filter(index)
            live, nxt = [live[j] for j in keep], nxt[index]
        hidden = body(nxt[:, None].astype(mx.uint32), cache=cache)  # (b, 1, D)
        nxt = mx.argmax(head(hidden[:, 0]), axis=-1)
        for j, i in enumerate(live):
            rows[i].append(hidden[j])
        mx.async_eval(nxt)
    return [(answer, mx.concatenate(blocks)) for answer, blocks in zip(answers, rows)]
