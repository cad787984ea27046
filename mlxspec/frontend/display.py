"""How `mlxspec run` prints an answer as it streams: word wrap to the terminal, and the thinking.

As Ollama's CLI (cmd/cmd.go displayResponse): on a terminal, a word that would run past the line
is moved whole to the next one (the cursor steps back over its printed part, which is cleared),
a word too long for a line is broken; thinking comes first, between "Thinking..." and
"...done thinking.". Piped output is never wrapped.
"""

from __future__ import annotations

import shutil
import unicodedata
from typing import Callable

MARGIN = 5  # Ollama leaves 5 columns free at the end of a line
THINKING, DONE_THINKING = "Thinking...\n", "...done thinking.\n\n"


def human_size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def terminal_width() -> int:
    return shutil.get_terminal_size((80, 24)).columns


def char_width(ch: str) -> int:
    """Columns a character takes: 2 for East Asian wide ones, 0 for combining marks."""
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def text_width(text: str) -> int:
    return sum(map(char_width, text))


class WordWrap:
    """Text in, text to print out (with cursor moves), one streamed piece at a time."""

    def __init__(self, width: int):
        self.limit = width - MARGIN  # a line holds at most this many columns
        self.column = 0
        self.word = ""  # the current word's characters already printed on this line

    def feed(self, text: str) -> str:
        if self.limit < MARGIN:  # a terminal this narrow: wrapping would only scramble it (Ollama: < 10)
            return text
        return "".join(self._char(ch) for ch in text)

    def _char(self, ch: str) -> str:
        if ch in "\r\n":
            self.column, self.word = 0, ""
            return ch
        width = char_width(ch)
        if self.column + width <= self.limit:
            out = ch
            self.column += width
        elif ch in " \t":  # the line is full at a space: the break replaces it
            self.column, self.word = 0, ""
            return "\n"
        elif self.word and text_width(self.word) <= self.limit - MARGIN:  # move the word to the next line
            moved = text_width(self.word)
            out = f"\x1b[{moved}D\x1b[K\n{self.word}{ch}"
            self.column = moved + width
        else:  # no word to move, or one longer than a line: break it here
            out = f"\n{ch}"
            self.column, self.word = width, ""
        self.word = "" if ch in " \t" or width >= 2 else self.word + ch  # wide characters break anywhere
        return out


class AnswerPrinter:
    """Prints one streamed answer: its thinking (unless hidden) between Ollama's markers, then the
    content, through word wrap when it is on."""

    def __init__(self, echo: Callable, wrap: WordWrap | None = None, hide_thinking: bool = False):
        self.echo, self.wrap, self.hide_thinking = echo, wrap, hide_thinking
        self.thinking = False  # inside the thinking block
        self.last = ""  # the last text printed

    def piece(self, thinking: str, content: str) -> None:
        if thinking and not self.hide_thinking:
            if not self.thinking:
                self._print(THINKING)
                self.thinking = True
            self._print(thinking)
        if content:
            self.close_thinking()
            self._print(content)

    def close_thinking(self) -> None:
        if self.thinking:  # the answer begins (or ends): close the thinking block on a line of its own
            self._print(("" if self.last.endswith("\n") else "\n") + DONE_THINKING)
            self.thinking = False

    def _print(self, text: str) -> None:
        self.last = text
        self.echo(self.wrap.feed(text) if self.wrap else text, nl=False)
