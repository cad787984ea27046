"""A reasoning model's reply split into its thinking and its answer, as Ollama returns them.

Qwen3 / DeepSeek-R1 style models write `<think> ... </think>` before the answer (or their template
opens the tag in the prompt, so the reply starts inside it). With `think` requested, the text
inside goes to `message.thinking` (OpenAI: `reasoning`), the rest to `content`, streamed as it
comes; only a block at the very start counts, and the whitespace after `</think>` is dropped.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


class ThinkSplitter:
    def __init__(self, inside: bool = False):
        self.state = "thinking" if inside else "start"  # start -> thinking -> after -> content
        self.buf = ""

    def feed(self, text: str) -> tuple[str, str]:
        """(thinking, content) that are certain so far; a possible partial tag is held back."""
        self.buf += text
        thinking = content = ""
        while True:
            if self.state == "start":
                head = self.buf.lstrip()
                if head.startswith(OPEN):
                    self.buf, self.state = head[len(OPEN):], "thinking"
                    continue
                if OPEN.startswith(head):  # may still become the tag (or is only whitespace so far)
                    return thinking, content
                self.state = "content"
            elif self.state == "thinking":
                i = self.buf.find(CLOSE)
                if i >= 0:
                    thinking += self.buf[:i]
                    self.buf, self.state = self.buf[i + len(CLOSE):], "after"
                    continue
                keep = _partial(self.buf, CLOSE)
                thinking += self.buf[: len(self.buf) - keep]
                self.buf = self.buf[len(self.buf) - keep:]
                return thinking, content
            elif self.state == "after":
                self.buf = self.buf.lstrip()
                if not self.buf:
                    return thinking, content
                self.state = "content"
            else:
                content += self.buf
                self.buf = ""
                return thinking, content

    def finish(self) -> tuple[str, str]:
        rest, self.buf = self.buf, ""
        return (rest, "") if self.state == "thinking" else ("", rest.lstrip() if self.state == "after" else rest)


def _partial(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def opens_thinking(prompt_tail: str) -> bool:
    """Did the rendered prompt end inside a think block (the template opened it)?"""
    tail = prompt_tail.rstrip()
    return tail.endswith(OPEN)
