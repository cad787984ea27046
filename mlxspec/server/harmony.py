"""gpt-oss's replies in OpenAI's harmony format -> thinking, content and tool calls, as Ollama returns them.

A harmony reply is a run of messages, each `<|channel|>NAME[ to=RECIPIENT][<|constrain|>json]<|message|>
BODY` ended by `<|end|>` (more follows, after `<|start|>assistant`), `<|call|>` (a tool call: the
model waits for its result) or `<|return|>` (done). The prompt ends with `<|start|>assistant`, so the
reply starts at a header. Channels: `analysis` is the reasoning (-> thinking), `final` the answer
(-> content), `commentary` to `functions.NAME` a call whose body is its JSON arguments; commentary
without a recipient is a preamble for the user (-> content). The engine stops at `<|call|>` and
`<|return|>` (they end generation), so a reply usually ends inside its last body.

    s = HarmonySplitter()
    thinking, content = s.feed(text)      # per streamed piece; a possible partial marker is held back
    thinking, content = s.finish()        # at the end; s.calls then holds the tool calls
"""

from __future__ import annotations

import json
import re

from .tool_calls import ToolCall

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN)
_RECIPIENT = re.compile(r"to=([^\s<]+)")


def is_harmony(template: str | None) -> bool:
    """Does this chat template write harmony (gpt-oss)?"""
    return bool(template) and CHANNEL in template and MESSAGE in template


class HarmonySplitter:
    def __init__(self):
        self.state = "header"  # header -> body -> (header ...) -> done
        self.header = self.buf = self.call_body = ""
        self.channel = self.recipient = None
        self.calls: list[ToolCall] = []
        self.opened = False  # has any message body begun?

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        thinking = content = ""
        while self.buf:
            i = min((j for j in (self.buf.find(m) for m in MARKERS) if j >= 0), default=-1)
            if i < 0:  # no whole marker: keep back what may begin one
                keep = max((n for m in MARKERS for n in range(1, len(m)) if self.buf.endswith(m[:n])), default=0)
                t, c = self._text(self.buf[: len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep :]
                return thinking + t, content + c
            t, c = self._text(self.buf[:i])
            thinking, content = thinking + t, content + c
            marker = next(m for m in MARKERS if self.buf.startswith(m, i))
            self.buf = self.buf[i + len(marker) :]
            self._marker(marker)
        return thinking, content

    def finish(self) -> tuple[str, str]:
        """Flush what was held (the end of generation ends the last message, e.g. at <|call|>)."""
        rest, self.buf = self.buf, ""
        thinking, content = self._text(rest)
        if not self.opened and self.header.strip():
            content += self.header  # no message ever opened: the model ignored harmony; lose nothing
        self._end_message()
        return thinking, content

    # ---------------------------------------------------------------- internals

    def _text(self, text: str) -> tuple[str, str]:
        if not text or self.state == "done":
            return "", ""
        if self.state == "header":
            self.header += text
        elif self.recipient:
            self.call_body += text
        else:
            return (text, "") if self.channel == "analysis" else ("", text)
        return "", ""

    def _marker(self, marker: str) -> None:
        if marker == START:
            self._end_message()
            self.state, self.header = "header", ""
        elif marker in (CHANNEL, CONSTRAIN):
            self.state = "header"
            self.header += marker
        elif marker == MESSAGE:
            self.channel = (self.header.split(CHANNEL, 1)[1].split()[0].split("<|")[0]
                            if CHANNEL in self.header and self.header.split(CHANNEL, 1)[1].split() else None)
            found = _RECIPIENT.search(self.header)
            self.recipient = found.group(1) if found else None
            self.state, self.header, self.opened = "body", "", True
        else:  # END, CALL, RETURN
            self._end_message()
            self.state = "done" if marker == RETURN else "header"

    def _end_message(self) -> None:
        if self.recipient:
            name = self.recipient.removeprefix("functions.")
            try:
                args = json.loads(self.call_body) if self.call_body.strip() else {}
            except ValueError:
                args = None
            if isinstance(args, dict):
                self.calls.append(ToolCall(name, args))
        self.channel = self.recipient = None
        self.call_body = ""
