"""A reasoning model's reply split into its thinking and its answer, as Ollama returns them.

Qwen3 / DeepSeek-R1 style models write `<think> ... </think>` before the answer (or their template
opens the tag in the prompt, so the reply starts inside it). With `think` requested, the text
inside goes to `message.thinking` (OpenAI: `reasoning`), the rest to `content`, streamed as it
comes; only a block at the very start counts, and the whitespace after `</think>` is dropped.
Gemma 4 writes `<|channel>thought\n ... <channel|>` instead (Ollama's model/parsers/gemma4.go: the
channel's name is dropped; without `think`, the block is dropped too).
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"
CHANNEL_OPEN, CHANNEL_CLOSE, CHANNEL_NAME = "<|channel>", "<channel|>", "thought\n"  # Gemma 4's


class ThinkSplitter:
    def __init__(self, inside: bool = False, tags: tuple[str, str] = (OPEN, CLOSE), name: str = "",
                 keep: bool = True):
        """`tags` (open, close) of the block; `name`: a channel name that may start it (dropped); `keep`:
        False drops the thinking (a model that thinks when not asked)."""
        self.state = "thinking" if inside else "start"  # start -> thinking -> after -> content
        self.buf = ""
        self.open, self.close, self.name, self.keep = *tags, name, keep
        self.named = not name  # the channel name was dropped (or there is none)

    def feed(self, text: str) -> tuple[str, str]:
        """(thinking, content) that are certain so far; a possible partial tag is held back."""
        thinking, content = self._feed(text)
        return (thinking if self.keep else ""), content

    def _feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        thinking = content = ""
        while True:
            if self.state == "start":
                head = self.buf.lstrip()
                if head.startswith(self.open):
                    self.buf, self.state = head[len(self.open):], "thinking"
                    continue
                if self.open.startswith(head):  # may still become the tag (or is only whitespace so far)
                    return thinking, content
                self.state = "content"
            elif self.state == "thinking":
                if not self.named:  # the channel's name, if the block starts with it
                    if self.name.startswith(self.buf) and self.buf != self.name:
                        return thinking, content  # may still be the name
                    self.buf, self.named = self.buf.removeprefix(self.name), True
                i = self.buf.find(self.close)
                if i >= 0:
                    thinking += self.buf[:i]
                    self.buf, self.state = self.buf[i + len(self.close):], "after"
                    continue
                keep = _partial(self.buf, self.close)
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
        if self.state == "thinking":
            return (rest if self.keep else ""), ""
        return "", rest.lstrip() if self.state == "after" else rest


def _partial(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def opens_thinking(prompt_tail: str, tag: str = OPEN) -> bool:
    """Did the rendered prompt end inside a think block (the template opened it)?"""
    return prompt_tail.rstrip().endswith(tag)


def splitter_for(template: str | None, prompt_tail: str, think) -> ThinkSplitter | None:
    """The splitter a reply needs: a think block where `think` asked for the reasoning; Gemma 4's channel
    (its template writes <|channel>) always, its thinking dropped when not asked for; else None."""
    asked = bool(think) and think != "none"
    if CHANNEL_OPEN in (template or ""):
        named = prompt_tail.endswith(CHANNEL_OPEN + CHANNEL_NAME)  # the prompt opened the channel, name and all
        return ThinkSplitter(named or opens_thinking(prompt_tail, CHANNEL_OPEN), (CHANNEL_OPEN, CHANNEL_CLOSE),
                             "" if named else CHANNEL_NAME, keep=asked)
    return ThinkSplitter(opens_thinking(prompt_tail)) if asked else None
