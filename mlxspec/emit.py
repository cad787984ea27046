"""The emission stage: every way output ends, and the one place tokens are counted.

Rounds hand over the tokens they produced (kept drafts, then the target's own). The emitter cuts
them at EOS, at the token limit (max_tokens or the context window, whichever is first), at a stop
string, and ends the run on cancel; it detokenizes, holds back text that may begin a stop string,
and adds to `stats.generated_tokens` exactly the tokens it emits.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .logprobs import TokenLogprob
from .stats import Stats
from .stops import StopMatcher


@dataclass
class Event:
    text: str = ""  # new text since the previous event
    tokens: list[int] = field(default_factory=list)  # token ids behind it
    from_draft: list[bool] = field(default_factory=list)  # per token: proposed by the drafter and kept
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per token, where the options asked for them
    done: bool = False
    finish_reason: str | None = None  # on the last event: 'stop', 'length' or 'cancelled'
    stats: Stats | None = None  # on the last event


class Emitter:
    def __init__(
        self,
        limit: int,
        eos_ids: set[int],
        stats: Stats,
        *,
        stops: list[str] = (),
        detokenizer=None,
        cancel: threading.Event | None = None,
    ):
        if stops and detokenizer is None:
            raise ValueError("stop strings need a detokenizer")
        self.left = limit  # tokens that may still be emitted
        self.eos_ids, self.stats, self.cancel = eos_ids, stats, cancel
        self.detok, self.stops = detokenizer, StopMatcher(list(stops))
        self.finish_reason: str | None = None

    def ended(self) -> bool:
        """Before a round: has the run ended (now also on cancel, or when no token may follow)?"""
        if self.finish_reason is None:
            if self.cancel is not None and self.cancel.is_set():
                self.finish_reason = "cancelled"
            elif self.left <= 0:
                self.finish_reason = "length"
        return self.finish_reason is not None

    def emit(self, tokens: list[int], from_draft: int, logprobs: list[TokenLogprob] | None = None) -> Event:
        """A round's tokens, the first `from_draft` of them drafted (and their logprobs, if any) -> the
        event to stream."""
        event = Event()
        for i, t in enumerate(tokens):
            if t in self.eos_ids:
                self.finish_reason = "stop"
                break
            event.text += self._text(t)
            event.tokens.append(t)
            event.from_draft.append(i < from_draft)
            if logprobs is not None:
                event.logprobs.append(logprobs[i])
            self.left -= 1
            if self.stops.hit:
                self.finish_reason = "stop"
            elif self.left <= 0:
                self.finish_reason = "length"
            if self.finish_reason is not None:
                break
        self.stats.generated_tokens += len(event.tokens)
        return event

    def close(self) -> Event:
        """The last event: text held back until the end, the finish reason and the statistics."""
        tail = ""
        if self.detok is not None and not self.stops.hit:
            self.detok.finalize()
            tail = self.stops.feed(self.detok.last_segment)
            tail += "" if self.stops.hit else self.stops.flush()
        if self.stops.hit:
            self.finish_reason = "stop"
        return Event(tail, done=True, finish_reason=self.finish_reason or "stop", stats=self.stats)

    def _text(self, token: int) -> str:
        if self.detok is None:
            return ""
        self.detok.add_token(token)
        return self.stops.feed(self.detok.last_segment)
