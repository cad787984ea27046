"""Medusa self-distillation: heads learn to guess the target's own tokens (record.py records them).

    train    Medusa heads on those positions: head i at position t predicts token t+i+2
             (cross-entropy against the target's own tokens; AdamW, fixed seed, tqdm progress)

The target's output head is frozen: its matrix is read once as W^T = head(I) - head(0) (D, V),
whatever its storage (quantized, tied). The softmax runs over the tokens the target actually wrote
(a few thousand of SmolLM2's 49k): the only targets there are, and 10-20x less matmul per step,
which is what makes training fit a 2-core CPU with a reference BLAS. Inference uses the full head.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from tqdm import tqdm

from ..errors import MlxspecError
from ..features import head as target_head
from .medusa import MedusaHeads
from .record import Recorded, load_prompts, record  # noqa: F401  (recording is shared by every kind)

def positions(samples: list[Recorded], heads: int) -> tuple[mx.array, mx.array]:
    """(P, D) hidden rows whose next token is an answer token, (P, heads) targets (-1: past the end)."""
    rows, targets = [], []
    for s in samples:
        n = len(s.ids)
        t = list(range(s.answer_start - 1, n - 2))  # row t predicts ids[t+1]; head i guesses ids[t+i+2]
        rows.append(s.hidden[mx.array(t)])
        targets += [[s.ids[j + i + 2] if j + i + 2 < n else -1 for i in range(heads)] for j in t]
    return mx.concatenate(rows), mx.array(targets, dtype=mx.int32)


def frozen_head(model: nn.Module, dims: int) -> tuple[mx.array, mx.array]:
    """The target's output head as a dense (D, V) matrix and (V,) bias: head(I) - head(0)."""
    head = target_head(model)
    bias = head(mx.zeros((1, dims), dtype=mx.float32))[0]
    weight = head(mx.eye(dims, dtype=mx.float32)) - bias
    mx.eval(weight, bias)
    return mx.stop_gradient(weight), mx.stop_gradient(bias)


def restrict(w: mx.array, b: mx.array, y: mx.array, *others: mx.array) -> tuple:
    """The head's columns for the S tokens in `y` (targets -1: none): (D, S), (S,), and each of
    `y, *others` renumbered into 0..S-1 (a token outside the S: S, never predicted, still counted)."""
    vocab = mx.array(sorted(set(y.flatten().tolist()) - {-1}), dtype=mx.int32)  # (S,)
    remap = mx.full((w.shape[1],), vocab.size, dtype=mx.int32)
    remap[vocab] = mx.arange(vocab.size, dtype=mx.int32)
    renumber = [mx.where(t < 0, -1, remap[mx.maximum(t, 0)]) for t in (y, *others)]
    return (w[:, vocab], b[vocab], *renumber)


def head_losses(heads: MedusaHeads, w: mx.array, b: mx.array, h: mx.array, y: mx.array) -> tuple[mx.array, mx.array]:
    """Mean cross-entropy over valid targets and top-1 hits per head: (heads,), (heads,) counts."""
    logits = heads(h) @ w + b  # (heads, B, S)
    valid = (y.T >= 0)  # (heads, B)
    target = mx.clip(y.T, 0, w.shape[1] - 1)  # a held-out token outside S: counted as a miss below
    ce = nn.losses.cross_entropy(logits, target, reduction="none") * valid
    hits = ((mx.argmax(logits, axis=-1) == y.T) & valid).sum(axis=1)
    return ce.sum(axis=1) / mx.maximum(valid.sum(axis=1), 1), hits


def evaluate(heads: MedusaHeads, w, b, h, y, batch: int = 256) -> list[float]:
    """Top-1 accuracy per head on (h, y): the greedy acceptance each head would have alone."""
    hits = mx.zeros((heads.count,))
    for i in range(0, h.shape[0], batch):
        hits = hits + head_losses(heads, w, b, h[i : i + batch], y[i : i + batch])[1]
    valid = (y >= 0).sum(axis=0)
    return [round(float(x), 4) for x in (hits / mx.maximum(valid, 1)).tolist()]


def train(model: nn.Module, samples: list[Recorded], heads: int = 4, epochs: float = 2.0, batch: int = 64,
          lr: float = 1e-3, seed: int = 0, show: bool = True) -> tuple[MedusaHeads, dict]:
    """Fit heads on the recorded positions (the last ~10% of samples held out for the report)."""
    mx.random.seed(seed)
    dims = samples[0].hidden.shape[-1]
    hold = len(samples) // 10
    h, y = positions(samples[: len(samples) - hold] or samples, heads)
    hv, yv = positions(samples[len(samples) - hold :], heads) if hold else (h, y)
    w, b, y, yv = restrict(*frozen_head(model, dims), y, yv)
    module = MedusaHeads(dims, heads)
    opt = optim.AdamW(learning_rate=lr, weight_decay=0.0)
    step_fn = nn.value_and_grad(module, lambda hb, yb: head_losses(module, w, b, hb, yb)[0].sum())
    steps = max(1, math.ceil(epochs * h.shape[0] / batch))
    before = evaluate(module, w, b, hv, yv)
    start = time.perf_counter()
    bar = tqdm(range(steps), desc="training medusa heads", unit="step", disable=not show)
    per_epoch = math.ceil(h.shape[0] / batch)
    for step in bar:
        if step % per_epoch == 0:
            order = mx.random.permutation(h.shape[0])  # a fresh shuffle each epoch (seeded)
        idx = order[(step % per_epoch) * batch :][:batch]
        value, grads = step_fn(h[idx], y[idx])
        opt.update(module, grads)
        mx.eval(module.parameters(), opt.state, value)
        loss = float(value) / heads  # mean over heads
        first = loss if step == 0 else first
        bar.set_postfix(loss=f"{loss:.3f}")
    after = evaluate(module, w, b, hv, yv)
    report = {"vocab_trained": int(w.shape[1]), "loss_start": round(first, 4), "loss": round(loss, 4),
              "steps": steps, "positions": int(h.shape[0]), "train_seconds": round(time.perf_counter() - start, 1),
              "heldout_top1_untrained": before, "heldout_top1": after}  # top-1 within the trained tokens
    return module, report
