"""A second, smaller model of the same tokenizer as drafter (classic speculative decoding).

Its k steps are queued lazily with `mx.async_eval`: nothing is read back to the host, so the
target's verify pass is built on top of still-running draft work and the round syncs once.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ..cache import PrefillCancelled, has_states, restore, rewind, snapshot
from ..prefix_cache import PrefixCache
from ..errors import IncompatibleDraftError
from ..sampling import Sampling, probabilities, sample
from ..step_graph import StepGraphs
from .base import Draft, Drafter


class ModelDrafter(Drafter):
    name = "draft-model"

    def __init__(self, model: nn.Module, min_confidence: float = 0.0, compiled: bool = False):
        self.model = model
        self.steps = StepGraphs(model, enabled=compiled)  # its draft steps: compiled graphs (on GPUs), or eager
        self.kv = PrefixCache(model)  # kept across requests: a shared prompt prefix is not recomputed
        # Stop a proposal after a token whose draft probability is below this (0 = never). Each
        # check reads one number back while the next draft step computes: a sync per draft step,
        # so it is opt-in; the engine's cost-based k choice needs no syncs.
        self.min_confidence = min_confidence
        self.syncs = 0  # host read-backs made by confidence checks
        self.seen = 0  # context tokens held in the cache
        self.base = 0  # context length at the last proposal
        self.fed = 0  # drafts of the last proposal that went through the model (so sit in the cache)
        self.proposing = False
        self.context: list[int] = []
        self.stateful = False  # recurrent layers (a hybrid draft: Qwen3.5's): rejected drafts cannot be trimmed out
        self.before: tuple[int, list] | None = None  # (seen, snapshot) before the proposal, where stateful
        self.drafted: mx.array | None = None  # the last proposal's tokens (uint32), lazy
        self.cancel = None  # the request's cancel flag, checked between prompt chunks (bind_cancel)

    def bind_cancel(self, cancel) -> None:
        self.cancel = cancel

    def start(self, prompt: list[int], hidden: mx.array | None = None) -> None:
        try:
            self.kv.prepare(prompt[:-1], cancel=self.cancel)
        except PrefillCancelled:  # the client left: finish() keeps the chunks read, for its retry
            self.context = self.kv.tokens or []
            self.seen = len(self.context)
            raise
        self.seen = len(prompt) - 1
        self.context = prompt  # the loop's token list (only ever appended to): no copy per round
        self.kv.tokens = None  # in use: set again by finish()
        self.stateful = has_states(self.kv.cache)

    def propose(self, context: list[int], k: int, sampling: Sampling, key: mx.array) -> Draft:
        self.proposing = True  # cache offsets run ahead of `seen` until the proposal is complete
        self.before = (self.seen, snapshot(self.kv.cache)) if self.stateful else None
        x = mx.array(context[self.seen :], dtype=mx.uint32)[None]  # (1, new tokens)
        keys = None if sampling.greedy else mx.random.split(key, k)
        tokens, probs, confidence = [], [], []
        for i in range(k):
            logits = self.steps(x, self.kv.cache)[0, -1]  # (V_draft,)
            q = probabilities(logits, sampling) if not sampling.greedy else None
            t = mx.argmax(logits, axis=-1) if q is None else sample(q, keys[i])
            mx.async_eval(t)  # start computing; no read-back
            if self.min_confidence > 0 and i > 0 and self._unsure(confidence[-1]):
                break  # drafts[i-1] was unsure: keep it, drop the step just queued
            tokens.append(t)
            probs.append(q)
            if self.min_confidence > 0:
                confidence.append(mx.softmax(logits)[t] if q is None else q[t])
            x = t.reshape(1, 1).astype(mx.uint32)
        n = len(tokens)
        # The cache holds the context and drafts[:n-1], and drafts[n-1] too when we stopped early.
        self.fed = n if n < k else n - 1
        self.context = context
        self.proposing = False
        self.seen = len(context) + self.fed
        self.base = len(context)
        stacked_probs = None if sampling.greedy else mx.stack(probs)
        self.drafted = mx.stack(tokens).astype(mx.uint32)
        return Draft(self.drafted, stacked_probs, n)

    def _unsure(self, confidence: mx.array) -> bool:
        self.syncs += 1
        return confidence.item() < self.min_confidence

    def accept(self, n: int, hidden: mx.array | None = None) -> None:
        valid = self.base + min(n, self.fed)
        if valid < self.seen and self.before is not None:  # recurrent states took in rejected drafts: back to before
            at, saved = self.before  # the proposal, then its kept rows again (one pass; its logits unused)
            rewind(self.kv.cache, self.seen - at)
            restore(saved)
            kept = mx.concatenate([mx.array(self.context[at : self.base], dtype=mx.uint32),
                                   self.drafted[: valid - self.base]])
            if kept.size:
                self.steps(kept[None], self.kv.cache)
        else:
            rewind(self.kv.cache, self.seen - valid)
        self.seen = valid

    def finish(self) -> None:
        """Keep the cache for the next request, holding tokens known on the host.

        After a completed round the loop has appended the kept drafts to the context; a request cut
        off before that keeps only the context its last proposal extended.
        """
        if self.kv.cache is None or self.proposing:
            return  # cut off mid-proposal: tokens stays None, so the next request rebuilds the cache
        if len(self.context) < self.seen:  # the kept drafts never reached the host
            if self.stateful:
                return  # recurrent states cannot be trimmed back to the context: rebuilt next request
            rewind(self.kv.cache, self.seen - self.base)
            self.seen = self.base
        self.kv.tokens = self.context[: self.seen]


def check_compatible(target_tokenizer, draft_tokenizer) -> None:
    """Refuse a draft whose token ids mean other text than the target's (checked before generating)."""
    t_vocab, d_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if t_vocab != d_vocab:
        only_t = len(t_vocab.keys() - d_vocab.keys())
        only_d = len(d_vocab.keys() - t_vocab.keys())
        moved = sum(1 for tok, i in t_vocab.items() if tok in d_vocab and d_vocab[tok] != i)
        raise IncompatibleDraftError(
            f"the draft's tokenizer differs from the target's: vocabulary sizes {len(d_vocab)} vs {len(t_vocab)}, "
            f"{only_t} tokens only in the target, {only_d} only in the draft, {moved} with other ids"
        )
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        t, d = getattr(target_tokenizer, attr, None), getattr(draft_tokenizer, attr, None)
        if t is not None and d is not None and t != d:
            raise IncompatibleDraftError(f"the draft's {attr} is {d}, the target's is {t}")
    t_special = set(getattr(target_tokenizer, "all_special_tokens", []))
    d_special = set(getattr(draft_tokenizer, "all_special_tokens", []))
    if t_special != d_special:
        raise IncompatibleDraftError(
            f"the draft's special tokens differ from the target's: {sorted(t_special ^ d_special)[:5]}"
        )
