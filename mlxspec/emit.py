"""The emission stage: every way output ends, and the one place tokens are counted.

Rounds hand over the tokens they produced (kept drafts, then the target's own). The emitter cuts
them at EOS, at the token limit (max_tokens or the context window, whichever is first), at a stop
string, and ends the run on cancel; it detokenizes, holds back text that may begin a stop string,
and adds to `stats.generated_tokens` exactly the tokens it emits. An event's `logprobs` are those of its
tokens; its `text_logprobs` follow the text instead (what the APIs answer): a token's entry once text
from where the token starts has gone out, never those of tokens that start at or past a stop
string's cut, as Ollama's runner drops them (the cut text's tokens are not in the answer; a token
the cut splits keeps its entry).
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
    # the logprobs of the tokens behind `text` (held back with text that may begin a stop string, those
    # of tokens past a stop string's cut never sent): what the APIs answer
    text_logprobs: list[TokenLogprob] = field(default_factory=list)
    done: bool = False
    finish_reason: str | None = None  # on the last event: 'stop', 'length' or 'cancelled'
    stop_string: str | None = None  # on the last event: the stop string that ended the text, if one did
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
        self.eos_ended = False  # the run ended at an end-of-sequence token (taken from a round, never emitted)
        # characters the detokenizer produced / the stop matcher let out so far, and the
        # logprobs (with where each token's text starts) waiting for their text to go out
        self.produced = self.released = 0
        self.held_logprobs: list[tuple[int, TokenLogprob]] = []

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
                self.finish_reason, self.eos_ended = "stop", True
                break
            start = self.produced
            event.text += self._text(t)
            event.tokens.append(t)
            event.from_draft.append(i < from_draft)
            if logprobs is not None:
                event.logprobs.append(logprobs[i])
                self.held_logprobs.append((start, logprobs[i]))
            self.left -= 1
            if self.stops.hit:
                self.finish_reason = "stop"
            elif self.left <= 0:
                self.finish_reason = "length"
            if self.finish_reason is not None:
                break
        event.text_logprobs = self._released_logprobs(everything=not self.stops.stops)
        self.stats.generated_tokens += len(event.tokens)
        return event

    def _released_logprobs(self, everything: bool = False) -> list[TokenLogprob]:
        """The held logprobs of tokens whose text has begun to go out (`everything`: all that are held,
        at the end of a run no stop string cut); past a stop string's cut, none will: dropped."""
        n = len(self.held_logprobs) if everything else sum(start < self.released for start, _ in self.held_logprobs)
        out = [lp for _, lp in self.held_logprobs[:n]]
        self.held_logprobs = [] if self.stops.hit else self.held_logprobs[n:]
        return out

    def close(self) -> Event:
        """The last event: text held back until the end, the finish reason and the statistics."""
        tail = ""
        if self.detok is not None and not self.stops.hit:
            self.detok.finalize()
            tail = self.stops.feed(self.detok.last_segment)
            tail += "" if self.stops.hit else self.stops.flush()
        self.released += len(tail)
        if self.stops.hit:
            self.finish_reason = "stop"
        logprobs = self._released_logprobs(everything=not self.stops.hit)
        return Event(tail, done=True, finish_reason=self.finish_reason or "stop", stats=self.stats, text_logprobs=logprobs,
                     stop_string=self.stops.matched)

    def _text(self, token: int) -> str:
        if self.detok is None:
            return ""
        self.detok.add_token(token)
        segment = self.detok.last_segment
        self.produced += len(segment)
        out = self.stops.feed(segment)
        self.released += len(out)
        return out
