"""EAGLE drafting: a one-layer draft model running on the target's own features (heads/eagle.py).

The head keeps a KV cache of its own. Entry t holds (c_t, h_{t-1}): the token at t and the target's
feature of the position before. The target's features arrive with each round's verify pass
(`accept(n, hidden)`), and the prompt's with `start`; they wait in `pending` until the next
proposal feeds them (one short prefill of the head), which also yields f_T, the feature the first
draft is read from. Draft steps then feed (d_i, f) with the head's own predicted feature; their
cache entries are taken out again after verification, since the target's real features replace
them. Nothing here reads back to the host: the drafts stay lazy until the verify pass is read.
Where decoding passes are compiled (step_graph.py: on GPUs by default), each draft step -- feed one
token and feature, read the draft logits -- replays a compiled graph (DraftSteps) instead of building one.

Greedy: each draft is the argmax over the draft vocabulary. Sampling: each draft is drawn from q_i,
the sampling law over the draft vocabulary (zero elsewhere), which is exactly what rejection
sampling needs to keep the target's distribution.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from ..cache import PREFILL_CHUNK, PrefillCancelled, rewind
from ..errors import MlxspecError
from ..features import head as target_head
from ..features import vocabulary_size
from ..features import embedding, tap
from ..heads import eagle3, mtp
from ..heads.eagle import DraftHead, read
from ..heads.files import check_target, drafter_path
from ..sampling import Sampling, probabilities, sample
from ..step_graph import StepGraphs
from .base import Draft, Drafter


class EagleDrafter(Drafter):
    wants_hidden = True
    trees = True

    def __init__(self, target: nn.Module, name_or_path: str, bits: int | None = 8, compiled: bool = False,
                 min_confidence: float = 0.0):
        """`min_confidence` > 0: a chain stops after a draft the head gives less than that probability (a
        host read-back per draft step, overlapped with the next step)."""
        self.min_confidence = min_confidence
        path = drafter_path(name_or_path)
        if not path.is_file():
            raise MlxspecError(f"no eagle drafter at {path}: train one with `mlxspec train-drafter MODEL --kind eagle`")
        head, vocab, self.config = read(path)
        check_target(self.config, target, path)
        self.draft_head = DraftHead(target, vocab)
        self._setup(target, head, f"eagle:{name_or_path}", compiled)
        group = next((g for g in (64, 32) if self.head.dims % g == 0), None)
        if bits and group:  # its bits never reach the output: only speed and acceptance; layers whose inputs the
            # group does not divide (an MLP's intermediate size: stories260K's 172) stay as they are
            nn.quantize(self.head, group_size=group, bits=bits, class_predicate=_divisible(group))

    def _setup(self, target: nn.Module, head: nn.Module, name: str, compiled: bool) -> None:
        """What every feature-level head shares, once self.draft_head (features -> draft logits) is set."""
        self.head, self.name = head, name
        self.embed = head.embed if "embed" in head else embedding(target)
        self.vocab = self.draft_head.vocab  # (V',) draft index -> token id
        self.vocab_size = int(self.draft_head.module_rows)
        self.head.set_dtype(self.embed(mx.array([0])).dtype)  # run in the target's activation dtype
        self.syncs = 0  # host read-backs made by confidence checks
        self.cache: list = []
        self.pending: list[mx.array] = []  # target features (m, D) not yet fed to the head
        self.next = 1  # the token paired with pending[0][0]: pending rows pair with context[next:]
        self.drafted = 0  # cache entries written from predicted features, past the real ones
        self.steps = DraftSteps(self, compiled)  # its draft steps: compiled graphs (on GPUs), or eager
        self.cancel = None  # the request's cancel flag, checked between prompt chunks (bind_cancel)

    def kernel_modules(self) -> list[nn.Module]:
        return [self.head, self.draft_head] if isinstance(self.draft_head, nn.Module) else [self.head]

    def bind_cancel(self, cancel) -> None:
        self.cancel = cancel

    def start(self, prompt: list[int], hidden: mx.array | None = None) -> None:
        self.cache, self.drafted, self.next = [KVCache()], 0, 1
        self.pending = [] if hidden is None or hidden.shape[0] == 0 else [hidden]
        if self.pending and hidden.shape[0] > 1:  # prefill the head now, all but the newest row, a chunk at a time:
            rows = hidden.shape[0] - 1  # a client that left stops it at the next chunk, as the target's prefill
            for i in range(0, rows, PREFILL_CHUNK):
                if i and self.cancel is not None and self.cancel.is_set():
                    raise PrefillCancelled(i)
                end = min(i + PREFILL_CHUNK, rows)
                self._feed(prompt[1 + i : 1 + end], hidden[i:end])
                mx.eval([c.state for c in self.cache])
            self.pending, self.next = [hidden[-1:]], hidden.shape[0]

    def propose(self, context: list[int], k: int, sampling: Sampling, key: mx.array, width: int = 1) -> Draft:
        rows = sum(p.shape[0] for p in self.pending)
        if rows == 0 or k <= 0:
            return Draft.empty()
        assert self.next + rows == len(context), (self.next, rows, len(context))  # features up to c_T's
        features = self.pending[0] if len(self.pending) == 1 else mx.concatenate(self.pending)
        f = self._feed(context[self.next :], features)[-1]  # (D,) f_T
        self.pending, self.next = [], len(context)
        tree = width > 1 and sampling.greedy
        keys = mx.random.split(key, k) if not sampling.greedy else [None] * k
        tokens, probs = [], []
        logits = self.draft_head(f)  # (V',)
        for i in range(k):
            if tree:  # the favourite continues the chain; the runners-up are leaves beside it
                ranked = mx.argsort(-logits)[:width]
                index = ranked[0]
                tokens.append(self.vocab[ranked])
            elif sampling.greedy:
                index = mx.argmax(logits)
                tokens.append(self.vocab[index][None])
            else:
                q = probabilities(logits[None], sampling)[0]  # (V',): the law this draft is drawn from
                index = sample(q[None], keys[i])[0]
                probs.append(mx.zeros((self.vocab_size,), q.dtype).at[self.vocab].add(q))
                tokens.append(self.vocab[index][None])
            sure = None if tree or not self.min_confidence else (mx.softmax(logits) if sampling.greedy else q)[index]
            if i + 1 < k:  # the next step reads this draft with the head's own predicted feature
                f, logits = self._draft_step(self.vocab[index], f)
                self.drafted += 1
                if sure is not None:  # the next step computes while this draft's probability is read
                    mx.async_eval(logits)
                    if self._unsure(sure):
                        break  # this draft was unsure: keep it, stop the chain (the queued step is rewound)
        if tree:
            return Draft.favourites_tree(mx.stack(tokens))  # (k, w): favourite first at every depth
        return Draft(mx.concatenate(tokens).astype(mx.uint32), mx.stack(probs) if probs else None, len(tokens))

    def _unsure(self, probability: mx.array) -> bool:
        self.syncs += 1
        return probability.item() < self.min_confidence

    def accept(self, n: int, hidden: mx.array | None = None) -> None:
        rewind(self.cache, self.drafted)  # predicted-feature entries; the real features follow
        self.drafted = 0
        if hidden is not None:  # (n+1, D): features of c_T and the n kept drafts
            self.pending.append(hidden)

    def finish(self) -> None:
        self.cache, self.pending, self.drafted = [], [], 0

    def _draft_step(self, token: mx.array, f: mx.array) -> tuple[mx.array, mx.array]:
        """(draft token id, its position's feature (D,)) -> (the next feature (D,), its draft logits (V',))."""
        out = self.steps.replay("feed", (token.reshape(1), f[None]), self.cache)
        if out is None:  # compiled steps off (or not applicable): built here
            f = self._feed(None, f[None], token=token)[-1]
            return f, self.draft_head(f)
        return out[0][0], out[1][0]

    def _feed(self, tokens: list[int] | None, features: mx.array, token: mx.array | None = None) -> mx.array:
        """(m, D) features of positions t-1 with the tokens at t -> (m, D) predicted features at t."""
        ids = mx.array(tokens, dtype=mx.uint32) if token is None else token.reshape(1)
        out = []
        for i in range(0, ids.shape[0], PREFILL_CHUNK):
            e = self.embed(ids[i : i + PREFILL_CHUNK])[None]  # (1, m, D)
            h = features[i : i + PREFILL_CHUNK][None]
            out.append(self.head(e, h, self.cache[0], "causal" if e.shape[1] > 1 else None)[0])
        return out[0] if len(out) == 1 else mx.concatenate(out)


# llama.cpp's recommended --spec-draft-p-min for its draft-mtp: Unsloth measured Qwen3.5/3.6 MTP at ~1.4x
# without it and ~1.8x with it (each MTP draft step also reads the whole output head: stopping unsure chains
# early saves draft steps as well as verify rows). Not measured here (no Qwen3.5 file offline).
MTP_MIN_CONFIDENCE = 0.75


class MtpDrafter(EagleDrafter):
    """The model's own multi-token-prediction block (heads/mtp.py: Qwen3.5's, Qwen3-Next's) drafting as an
    EAGLE head does: the same features, cache and draft steps; its logits over the whole vocabulary through
    the target's head (or the block's own), so nothing is copied and every token can be drafted."""

    def __init__(self, target: nn.Module, path: Path | None, compiled: bool = False,
                 min_confidence: float = MTP_MIN_CONFIDENCE, source: Path | None = None):
        """`path`: the GGUF or checkpoint directory the target was read from; `source`: where the block is
        to be read instead (mtp:PATH), a GGUF, a checkpoint or a drafter folder."""
        self.min_confidence = min_confidence
        where = source or path
        if where is None:
            raise MlxspecError("the mtp drafter reads the model's multi-token-prediction block from its files, "
                               "and this model was not loaded from any")
        head = mtp.from_gguf(where, target) if where.is_file() else mtp.from_checkpoint(where, target)
        self.draft_head = FullHead(head.head if "head" in head else target_head(target), target)
        self.config = {"kind": "mtp", "file": str(where)}
        self._setup(target, head, "mtp", compiled)


class Eagle3Drafter(EagleDrafter):
    """A published EAGLE-3 head (heads/eagle3.py) drafting in EAGLE's loop: fed the inputs of three of the
    target's layers (tapped: features.tap) where EAGLE reads its final hidden state, its own output after."""

    def __init__(self, target: nn.Module, path: Path, compiled: bool = False, min_confidence: float = 0.0,
                 bits: int | None = 8):
        self.min_confidence = min_confidence
        head, self.draft_head, self.config = eagle3.read(path, target)
        self.feature_layers = tuple(self.config["feature_layers"])
        try:
            tap(target, self.feature_layers)
        except ValueError as e:
            raise MlxspecError(f"{path.name}: {e}") from None
        self._setup(target, head, "eagle3", compiled)
        self.draft_head.set_dtype(self.embed(mx.array([0])).dtype)
        group = next((g for g in (64, 32) if self.head.dims % g == 0), None)
        if bits and group:  # as an EAGLE head's: its bits reach acceptance only, never the output
            for module in (self.head, self.draft_head):
                nn.quantize(module, group_size=group, bits=bits, class_predicate=_divisible(group))


def _divisible(group: int):
    return lambda p, m: hasattr(m, "to_quantized") and m.weight.shape[-1] % group == 0


class FullHead:
    """A head over the whole vocabulary: draft index i is token i."""

    def __init__(self, head, target: nn.Module):
        self.head, self.module_rows = head, vocabulary_size(target)
        self.vocab = mx.arange(self.module_rows, dtype=mx.uint32)

    def __call__(self, f: mx.array) -> mx.array:
        return self.head(f)


class DraftSteps(StepGraphs):
    """EAGLE's draft steps as compiled graphs over the head's KV cache (step_graph.py): 'feed' takes
    (token (1,), feature (1, D)) to (the next feature (1, D), its draft logits (1, V'))."""

    def __init__(self, drafter: EagleDrafter, enabled: bool):
        super().__init__(None, enabled)
        self.drafter = drafter

    def _pass(self, name: str, inputs: tuple, views: list) -> list[mx.array]:
        token, f = inputs
        d, view = self.drafter, views[0]
        nxt = d.head(d.embed(token)[None], f[None], view, view.make_mask(1))[0]  # (1, D)
        return [nxt, d.draft_head(nxt)]
