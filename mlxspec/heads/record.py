"""Recording for self-distillation: the target answers chat prompts greedily; we keep its features.
Prompts are strings or chats (a user's own logs, up to a user turn: prompt_files.py).

    record(engine, prompts, tokens)   -> [Recorded(ids, answer_start, hidden)], one per prompt

Each answer is the target's own greedy continuation, so a drafter trained on it learns exactly what
verification will accept. The final hidden states (the features each position had while decoding)
are kept as the target decodes (drafters.base.FeatureTap): the answer's last token, never read
back, is left out. With `batch` > 1, that many answers are decoded side by side in one target pass
per step instead (record_batch.py: meant for GPUs; slower on a 2-core CPU). With `keep=DIR` each
sample is written there as it is recorded (one file each, atomically), and a later run with the
same target and settings picks them up: an interrupted `train-drafter` resumes instead of starting
over.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from tqdm import tqdm

from ..drafters.base import FeatureTap
from ..errors import MlxspecError
from .prompt_files import PROMPTS_FILE, Prompt, load_prompts  # noqa: F401  (what callers read prompts with)
from .record_batch import record_wave


MIN_ANSWER = 3  # answer tokens a sample needs to be kept


@dataclass
class Recorded:
    ids: list[int]  # prompt + the target's greedy answer (but its last token, see above)
    answer_start: int  # index of the first answer token
    hidden: mx.array  # (len(ids), D) final hidden states, float32


def recording_dir(root: Path, target_sha256: str, max_answer: int) -> Path:
    """Where one target's recordings at one answer length are kept (a sample per prompt)."""
    return Path(root) / f"{target_sha256[:16]}-a{max_answer}"


def record(engine, prompts: list[Prompt], tokens: int, max_answer: int = 256, show: bool = True,
           keep: Path | None = None, batch: int = 1) -> list[Recorded]:
    """Greedy answers to `prompts` (chat template when the model has one) until `tokens` answer
    tokens, in the prompts' order. `batch` > 1 decodes that many answers side by side
    (record_batch.py); the last wave takes about as many prompts as the tokens left need."""
    chat = getattr(engine.tokenizer, "has_chat_template", False)
    out, total, i = [], 0, 0
    bar = tqdm(total=tokens, desc="recording answers", unit="tok", disable=not show)
    while i < len(prompts) and tokens - total >= MIN_ANSWER:  # fewer left: no answer could be kept
        budget = min(max_answer, tokens - total + 1)  # an answer cut at its budget keeps one token less
        mean = total / len(out) if out else max_answer  # answer tokens per prompt so far
        size = min(max(1, batch), math.ceil(budget / max(mean, 1)))  # the last wave: about what is left
        wave = []  # (prompt ids, a kept sample or None): answered together
        for prompt in prompts[i : i + size]:
            ids = prompt_ids(engine, prompt, chat)
            if len(ids) + budget > engine.context_length:  # a long chat log: no room for an answer
                continue
            wave.append((ids, _load(keep, ids, budget) if keep else None))
        i += size
        fresh = iter(_answer(engine, [ids for ids, s in wave if s is None], budget))
        for ids, sample in wave:
            if sample is None:
                sample = _sample(ids, *next(fresh))
                if sample is None:
                    continue
                if keep:
                    _store(keep, sample, budget)
            if total < tokens:  # a wave's answers past the total asked are kept on disk only
                out.append(sample)
                total += len(sample.ids) - sample.answer_start
                bar.update(len(sample.ids) - sample.answer_start)
    bar.close()
    if not out:
        raise MlxspecError("the target produced no usable answers for these prompts")
    return out


def prompt_ids(engine, prompt: Prompt, chat: bool) -> list[int]:
    """A prompt's token ids: through the chat template where the model has one, else its turns' text."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if chat:
        return engine.chat_prompt(messages)
    return engine.encode("\n\n".join(m["content"] for m in messages))


def _answer(engine, prompts: list[list[int]], budget: int) -> list[tuple[list[int], mx.array | None]]:
    """(greedy answer, hidden rows of every position read) per prompt: one at a time through the
    engine (the features it decoded with), or side by side."""
    from ..options import GenerateOptions

    if len(prompts) > 1:
        return record_wave(engine, prompts, budget)
    out = []
    for ids in prompts:
        opts = GenerateOptions(max_tokens=budget, temperature=0.0, draft_length=0)
        tap = FeatureTap()  # the features of every position the target read, as it decoded
        answer = [t for event in engine.generate(ids, opts, tap=tap) for t in event.tokens]
        out.append((answer, tap.features()))
    return out


def _sample(ids: list[int], answer: list[int], hidden: mx.array | None) -> Recorded | None:
    """Prompt + answer with the rows the target read (an answer cut at its budget has no row for
    its last token, which is then left out); None for an answer too short to train on."""
    rows = 0 if hidden is None else min(hidden.shape[0], len(ids) + len(answer))
    if rows - len(ids) < MIN_ANSWER:
        return None
    sample = Recorded((ids + answer)[:rows], len(ids), hidden[:rows].astype(mx.float32))
    mx.eval(sample.hidden)
    return sample


def _key(ids: list[int], budget: int) -> str:
    return hashlib.sha256(json.dumps([ids, budget]).encode()).hexdigest()[:24]


def _load(keep: Path, ids: list[int], budget: int) -> Recorded | None:
    path = Path(keep) / f"{_key(ids, budget)}.safetensors"
    if not path.is_file():
        return None
    try:
        tensors = mx.load(str(path))
        seq = tensors["ids"].tolist()
        if seq[: len(ids)] != ids:
            return None
        return Recorded(seq, len(ids), tensors["hidden"])
    except (OSError, RuntimeError, ValueError, KeyError):
        return None  # a damaged file is recorded again


def _store(keep: Path, sample: Recorded, budget: int) -> None:
    keep = Path(keep)
    keep.mkdir(parents=True, exist_ok=True)
    path = keep / f"{_key(sample.ids[: sample.answer_start], budget)}.safetensors"
    tmp = path.with_name(f".{path.stem}.tmp.safetensors")
    mx.save_safetensors(str(tmp), {"ids": mx.array(sample.ids, dtype=mx.int32), "hidden": sample.hidden})
    os.replace(tmp, path)
