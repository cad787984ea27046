"""EAGLE self-distillation: the head learns the target's next feature and token from its own answers.

For each recorded sequence c_0..c_{n-1} with features h_0..h_{n-1} (record.py), entry t (t = 1..n-1)
reads (c_t, h_{t-1}) and is trained toward
    regression   f_t ~ h_t                       smooth L1 over the feature
    token        W[vocab] f_t -> y_t             cross-entropy, y_t = the target's next token after t
and a second, unrolled step (as the drafter runs it) reads its own f_t in place of h_t at t+1:
entry t+1 of step two sees (c_{t+1}, f_t) and attends to the real entries before it, so the head
learns to draft from its own features, not only from the target's (EAGLE-3's training-time test).
Features get a little noise (EAGLE-1) so a slightly-off feature still drafts well.

y_t is the token after position t the target itself chose: the answer's next token, and over the
prompt the target's argmax there. The draft vocabulary is the `vocab` most frequent y.
"""

from __future__ import annotations

import math
import time
from collections import Counter

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from tqdm import tqdm

from ..features import head as target_head
from .eagle import EagleHead, block_config
from .record import Recorded
from .train import frozen_head


def next_tokens(model: nn.Module, s: Recorded) -> list[int]:
    """y_t for t = 0..n-2: the token the target chose after position t (argmax over the prompt)."""
    head = target_head(model)
    guess = mx.argmax(head(s.hidden[: s.answer_start - 1].astype(mx.float32)), axis=-1).tolist() if s.answer_start > 1 else []
    return guess + s.ids[s.answer_start :]


def draft_vocabulary(ys: list[list[int]], size: int) -> mx.array:
    counts = Counter(t for y in ys for t in y)
    return mx.array(sorted(t for t, _ in counts.most_common(size)), dtype=mx.int32)


OUTSIDE = -2  # label of a token outside the draft vocabulary: never trained on, scored as a miss (-1: no label)


class Batches:
    """Sequences padded to a common length: inputs (B, L, D) x2, targets (B, L, D), labels (B, L)."""

    def __init__(self, model: nn.Module, samples: list[Recorded], ys: list[list[int]], vocab: mx.array, size: int,
                 answers_only: bool = False):
        remap = mx.full((target_head_rows(model),), OUTSIDE, dtype=mx.int32)
        remap[vocab] = mx.arange(vocab.size, dtype=mx.int32)
        embed = model.model.embed_tokens
        self.items = []
        for s, y in sorted(zip(samples, ys), key=lambda p: len(p[0].ids)):
            ids = mx.array(s.ids[1:], dtype=mx.uint32)  # c_1..c_{n-1}
            labels = remap[mx.array(y[1:] + [0], dtype=mx.int32)]  # y_1..y_{n-2}, then none for t = n-1
            labels[-1] = -1
            if answers_only:  # score answers only: a chat template's fixed system prompt is learned by heart
                labels = mx.where(mx.arange(labels.size) >= s.answer_start - 2, labels, -1)
            self.items.append((embed(ids).astype(mx.float32), s.hidden[:-1], s.hidden[1:], labels))
        self.size = size
        self.groups = [self.items[i : i + size] for i in range(0, len(self.items), size)]

    def batch(self, group: list) -> tuple[mx.array, ...]:
        length = max(item[0].shape[0] for item in group)
        pad = [[(0, length - item[0].shape[0]), (0, 0)] for item in group]
        e = mx.stack([mx.pad(item[0], p) for item, p in zip(group, pad)])
        h_in = mx.stack([mx.pad(item[1], p) for item, p in zip(group, pad)])
        h_out = mx.stack([mx.pad(item[2], p) for item, p in zip(group, pad)])
        y = mx.stack([mx.pad(item[3], [(0, length - item[3].shape[0])], constant_values=-1) for item in group])
        valid = mx.stack([mx.arange(length) < item[0].shape[0] for item in group])
        return e, h_in, h_out, y, valid


def target_head_rows(model: nn.Module) -> int:
    head = target_head(model)
    module = getattr(head, "__self__", head)
    return int(module["weight"].shape[0])


def _project(attn, x: mx.array, offset: int = 0):
    B, L, _ = x.shape
    q = attn.q_proj(x).reshape(B, L, attn.n_heads, -1).transpose(0, 2, 1, 3)
    k = attn.k_proj(x).reshape(B, L, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    v = attn.v_proj(x).reshape(B, L, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    return attn.rope(q, offset=offset), attn.rope(k, offset=offset), v


def forward_two(head: EagleHead, e: mx.array, h_in: mx.array) -> tuple[mx.array, mx.array]:
    """(B, L, D) embeddings and input features -> step-one features f (B, L, D) and step-two
    features g (B, L, D), where g_t reads (c_t, f_{t-1}) over the real entries < t, and itself."""
    block = head.layer
    attn = block.self_attn
    B, L, D = e.shape
    x1 = head.fc(mx.concatenate([e, h_in], axis=-1))
    f = block(x1, "causal")
    prev = mx.concatenate([mx.zeros_like(f[:, :1]), f[:, :-1]], axis=1)
    x2 = head.fc(mx.concatenate([e, prev], axis=-1))
    q1, k1, v1 = _project(attn, block.input_layernorm(x1))
    q2, k2, v2 = _project(attn, block.input_layernorm(x2))
    # step two at t: keys of step one at positions < t, then its own key at t
    reps = attn.n_heads // attn.n_kv_heads
    k1, v1, k2, v2 = (mx.repeat(a, reps, axis=1) if reps > 1 else a for a in (k1, v1, k2, v2))
    s_prev = (q2 @ k1.transpose(0, 1, 3, 2)) * attn.scale  # (B, H, L, L)
    s_self = (q2 * k2).sum(axis=-1, keepdims=True) * attn.scale  # (B, H, L, 1)
    before = mx.arange(L)[None, :] < mx.arange(L)[:, None]  # strictly earlier positions
    s_prev = mx.where(before, s_prev, -mx.inf)
    weights = mx.softmax(mx.concatenate([s_prev, s_self], axis=-1).astype(mx.float32), axis=-1)
    out = weights[..., :L] @ v1 + weights[..., L:] * v2  # (B, H, L, hd)
    out = attn.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))
    h = x2 + out
    g = h + block.mlp(block.post_attention_layernorm(h))
    return f, g


def losses(head: EagleHead, w: mx.array, b: mx.array, batch: tuple, noise: float, key: mx.array | None,
           cls_weight: float, soft: bool = False) -> tuple[mx.array, mx.array]:
    """Total loss (scalar) and hits (2,) of steps one and two on one padded batch. soft: the token
    term is the KL divergence from the target's own distribution over the draft vocabulary (its
    head on h_t), at every position, instead of the cross-entropy against its argmax y_t."""
    e, h_in, h_out, y, valid = batch
    if key is not None and noise > 0:
        scale = noise * mx.sqrt(mx.mean(h_in * h_in, axis=-1, keepdims=True))
        h_in = h_in + scale * mx.random.normal(h_in.shape, key=key)
    f, g = forward_two(head, e, h_in)
    mask = valid[..., None].astype(mx.float32)
    count = mx.maximum(valid.sum(), 1)
    reg = (nn.losses.smooth_l1_loss(f, h_out, reduction="none") * mask).sum() / (count * f.shape[-1])
    # step two: g_t ~ h_t as well (it stands where f_t would, one draft later); its t = 0 has no f_{-1}
    later = valid & (mx.arange(valid.shape[1]) > 0)[None]
    reg2 = (nn.losses.smooth_l1_loss(g, h_out, reduction="none") * later[..., None]).sum() / (
        mx.maximum(later.sum(), 1) * f.shape[-1])
    known = (y >= 0) & valid
    if soft:  # (B, L, V') the target's law over the draft vocabulary, and its log
        log_teacher = nn.log_softmax(mx.stop_gradient(h_out @ w + b), axis=-1)
        teacher = mx.exp(log_teacher)
    total, hits = reg + 0.5 * reg2, []
    for feats, where, weight in ((f, valid, 1.0), (g, later, 0.5)):
        logits = feats @ w + b
        labelled = known & where
        if soft:  # every position has a soft label, one whose argmax lies outside the draft vocabulary too
            # KL(teacher || head): the cross-entropy less the teacher's own entropy, so 0 is a perfect fit
            ce, counted = (teacher * (log_teacher - nn.log_softmax(logits, axis=-1))).sum(axis=-1), where
        else:
            ce, counted = nn.losses.cross_entropy(logits, mx.maximum(y, 0), reduction="none"), labelled
        total = total + weight * cls_weight * (ce * counted).sum() / mx.maximum(counted.sum(), 1)
        hits.append(((mx.argmax(logits, axis=-1) == y) & labelled).sum())
    return total, mx.stack(hits)


def evaluate(head: EagleHead, w, b, batches: Batches) -> list[float]:
    """Top-1 of the target's next token at draft steps one and two (held-out sequences), over every
    labelled position: a token outside the draft vocabulary counts as a miss, as it is at run time."""
    hits, known, known2 = mx.zeros((2,)), 0, 0
    for group in batches.groups:
        batch = batches.batch(group)
        hits = hits + losses(head, w, b, batch, 0.0, None, 1.0)[1]
        y, valid = batch[3], batch[4]
        k = (y != -1) & valid
        known += int(k.sum())
        known2 += int((k & (mx.arange(y.shape[1]) > 0)[None]).sum())
    return [round(float(hits[0]) / max(known, 1), 4), round(float(hits[1]) / max(known2, 1), 4)]


def train(model: nn.Module, samples: list[Recorded], vocab_size: int = 4096, epochs: float = 8.0,
          batch: int = 2, lr: float = 3e-4, noise: float = 0.1, cls_weight: float = 1.0, seed: int = 0,
          warmup: int = 20, clip: float = 1.0, weight_decay: float = 0.0, intermediate: int | None = None,
          soft: bool = True, show: bool = True) -> tuple[EagleHead, mx.array, dict]:
    """Fit an EAGLE head on the recorded sequences (the last ~10% held out for the report).
    soft: learn the target's distribution over the draft vocabulary (False: only its argmax)."""
    mx.random.seed(seed)
    ys = [next_tokens(model, s) for s in samples]
    hold = len(samples) // 10
    train_set = samples[: len(samples) - hold] or samples
    vocab = draft_vocabulary(ys[: len(train_set)], vocab_size)
    dims = samples[0].hidden.shape[-1]
    w_full, b_full = frozen_head(model, dims)
    w, b = w_full[:, vocab], b_full[vocab]
    data = Batches(model, train_set, ys[: len(train_set)], vocab, batch)
    held = Batches(model, samples[len(samples) - hold :] if hold else train_set, ys[len(train_set) :] if hold else ys,
                   vocab, batch, answers_only=True)
    config = block_config(model)
    if intermediate:  # a narrower MLP than the target's: fewer weights to learn the data by heart
        config["intermediate_size"] = intermediate
    head = EagleHead(config)
    before = evaluate(head, w, b, held)
    steps = max(1, math.ceil(epochs * len(data.groups)))
    schedule = optim.cosine_decay(lr, steps, lr * 0.05)
    if 0 < warmup < steps:  # a linear ramp first: Adam's early steps on a fresh block are erratic
        schedule = optim.join_schedules([optim.linear_schedule(lr * 0.01, lr, warmup),
                                         optim.cosine_decay(lr, steps - warmup, lr * 0.05)], [warmup])
    opt = optim.AdamW(learning_rate=schedule, weight_decay=weight_decay)
    key = mx.random.key(seed)
    step_fn = nn.value_and_grad(head, lambda bt, k: losses(head, w, b, bt, noise, k, cls_weight, soft)[0])
    start, first = time.perf_counter(), None
    bar = tqdm(range(steps), desc="training eagle head", unit="step", disable=not show)
    for step in bar:
        if step % len(data.groups) == 0:
            order = mx.random.permutation(len(data.groups)).tolist()  # a fresh order each epoch (seeded)
        key, sub = mx.random.split(key)
        value, grads = step_fn(data.batch(data.groups[order[step % len(data.groups)]]), sub)
        if clip > 0:  # a bad batch must not throw the block off (losses spiked 10x without it)
            grads, _ = optim.clip_grad_norm(grads, clip)
        opt.update(head, grads)
        mx.eval(head.parameters(), opt.state, value)
        first = float(value) if first is None else first
        bar.set_postfix(loss=f"{float(value):.3f}")
    after = evaluate(head, w, b, held)
    report = {"block": config, "dims": int(dims), "draft_vocab": int(vocab.size),
              "coverage": _coverage(ys[len(train_set):] or ys, vocab),
              "loss_start": round(first, 4), "loss": round(float(value), 4), "steps": steps,
              "positions": sum(len(s.ids) - 1 for s in train_set), "train_seconds": round(time.perf_counter() - start, 1),
              "heldout_top1_untrained": before, "heldout_top1": after,
              "labels": "soft" if soft else "hard"}  # [step one, step two]
    return head, vocab, report


def _coverage(ys: list[list[int]], vocab: mx.array) -> float:
    """Share of the target's (held-out) tokens that the draft vocabulary holds: a ceiling on acceptance."""
    inside = set(vocab.tolist())
    all_y = [t for y in ys for t in y]
    return round(sum(t in inside for t in all_y) / max(len(all_y), 1), 4)
