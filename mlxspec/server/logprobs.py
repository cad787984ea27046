"""Logprobs in the APIs' shapes (the engine's TokenLogprob: ids and values; here: text and bytes).

    Ollama   "logprobs": [{token, logprob, bytes, top_logprobs?: [{token, logprob, bytes}]}] per chunk
    OpenAI   chat: choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs}]}
             completions: choices[].logprobs = {tokens, token_logprobs, top_logprobs, text_offset}

Requests: Ollama's `logprobs` (bool) and `top_logprobs` (0..20); OpenAI chat's the same; OpenAI
completions' `logprobs` (an integer: alternatives per token, 0..20 here, 5 at OpenAI).
"""

from __future__ import annotations

import codecs
from typing import Callable

from ..logprobs import TokenLogprob
from ..options import MAX_TOP_LOGPROBS
from .requests import ApiError, field

Bytes = Callable[[int], bytes]


def requested(body: dict, flag: str = "logprobs") -> int | None:
    """Alternatives per token the request asks for (None: no logprobs), from `logprobs` + `top_logprobs`."""
    on, top = field(body, flag, bool, False), field(body, "top_logprobs", int, 0)
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")
    return top if on else None


def requested_count(body: dict) -> int | None:
    """OpenAI completions: `logprobs` is itself the number of alternatives (null: none)."""
    count = field(body, "logprobs", int)
    if count is not None and not 0 <= count <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}")
    return count


def _entry(token: int, logprob: float, pieces: Bytes) -> dict:
    raw = pieces(token)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def ollama(logprobs: list[TokenLogprob], pieces: Bytes, top: bool) -> list[dict]:
    """Ollama's: the alternatives only where the request asked for some (top_logprobs > 0)."""
    out = []
    for lp in logprobs:
        entry = _entry(lp.token, lp.logprob, pieces)
        if top:
            entry["top_logprobs"] = [_entry(t, v, pieces) for t, v in lp.top]
        out.append(entry)
    return out


def openai_chat(logprobs: list[TokenLogprob], pieces: Bytes) -> dict:
    return {"content": [{**_entry(lp.token, lp.logprob, pieces), "top_logprobs": [_entry(t, v, pieces) for t, v in lp.top]}
                        for lp in logprobs]}


class TextOffsets:
    """Where each token starts in the text the tokens spell, across a stream's chunks (a character
    may span tokens: a token that ends inside one moves the offset only once the character is whole)."""

    def __init__(self):
        self.decoder, self.chars = codecs.getincrementaldecoder("utf-8")(errors="replace"), 0

    def take(self, raw: bytes) -> int:
        at, self.chars = self.chars, self.chars + len(self.decoder.decode(raw))
        return at


def _legacy_text(raw: bytes) -> str:
    """OpenAI's legacy token text: the piece, or `bytes:\\xNN...` where it is not whole UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def openai_completion(logprobs: list[TokenLogprob], pieces: Bytes, offsets: TextOffsets) -> dict:
    """The legacy shape: parallel lists, alternatives as {token text: logprob}, each token's offset in the text."""
    raws = [pieces(lp.token) for lp in logprobs]
    return {"tokens": [_legacy_text(raw) for raw in raws], "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{_legacy_text(pieces(t)): v for t, v in lp.top} for lp in logprobs],
            "text_offset": [offsets.take(raw) for raw in raws]}
