"""Stop strings on a text stream: emit only text that cannot be the start of a stop string."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.held = ""  # text that might still turn into a stop string
        self.hit = False
        self.matched: str | None = None  # the stop string that cut the text (the first in it)

    def feed(self, text: str) -> str:
        """Add streamed text; return what is safe to emit (everything before a stop string)."""
        if not self.stops:
            return text
        self.held += text
        found = [(i, s) for i, s in ((self.held.find(s), s) for s in self.stops) if i >= 0]
        if found:
            at, self.matched = min(found, key=lambda f: f[0])
            out, self.held, self.hit = self.held[:at], "", True
            return out
        keep = max((_overlap(self.held, s) for s in self.stops), default=0)
        out = self.held[: len(self.held) - keep]
        self.held = self.held[len(out) :]
        return out

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest end of `text` that is a beginning of `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
