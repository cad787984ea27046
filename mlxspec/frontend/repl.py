"""`mlxspec run`: one prompt or an interactive session with a model served by the daemon.

Chat models keep the conversation as messages (/api/chat); models without a chat template
continue from the returned token context (/api/generate).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable

import click

from .client import Client
from .display import AnswerPrinter, WordWrap, terminal_width
from ..options import GenerateOptions, OptionsError
from ..stats import Stats

HELP = """Commands:
  /set parameter <name> <value>   set an option (temperature, num_predict, draft_num_predict, stop, ...)
  /set system <text>              set the system message
  /set verbose | /set quiet       show or hide statistics after each answer
  /set format json                answer in JSON (constrained)
  /set noformat                   answer in free text
  /set think [high|medium|low|max] let the model think first (models that support it)
  /set nothink                    ask the model not to think
  /set wordwrap | /set nowordwrap wrap words at the terminal's width, or not
  /show info                      show the model's details
  /clear                          forget the conversation
  /bye                            exit (also Ctrl-D)
  /? or /help                     this help
Use \"\"\" to begin and end a message of several lines."""


THINK_LEVELS = ("high", "medium", "low", "max")  # besides true/false, as Ollama's `think`


@dataclasses.dataclass
class Session:
    client: Client
    model: str
    chat: bool  # the model has a chat template
    verbose: bool = False
    keep_alive: str | None = None
    options: dict = dataclasses.field(default_factory=dict)
    system: str | None = None
    messages: list = dataclasses.field(default_factory=list)
    context: list = dataclasses.field(default_factory=list)
    echo: Callable = click.echo
    format: str | dict | None = None  # "json" or a JSON schema: the answer is constrained to it
    think: bool | str | None = None  # None: the model's default
    thinks: bool = False  # the model can think (its capabilities say "thinking")
    hide_thinking: bool = False
    wordwrap: bool = True  # wrap words, where the output is a terminal
    terminal: bool = False  # stdout is a terminal: piped output is never wrapped
    width: Callable[[], int] = terminal_width

    def ask(self, text: str) -> None:
        """Stream the answer to `text`; Ctrl-C stops it (the daemon cancels the generation)."""
        body: dict = {"model": self.model, "options": self.options}
        body.update({k: v for k, v in (("keep_alive", self.keep_alive), ("format", self.format), ("think", self.think))
                     if v is not None})
        if self.chat:
            system = [{"role": "system", "content": self.system}] if self.system else []
            body["messages"] = system + self.messages + [{"role": "user", "content": text}]
            path = "/api/chat"
        else:
            body.update(prompt=text, context=self.context, **({"system": self.system} if self.system else {}))
            path = "/api/generate"
        answer, thoughts, final = [], [], None
        printer = AnswerPrinter(self.echo, WordWrap(self.width()) if self.wordwrap and self.terminal else None,
                                self.hide_thinking)
        stream = self.client.stream("POST", path, body)
        try:
            for obj in stream:
                part = obj["message"] if self.chat else obj
                thinking, piece = part.get("thinking") or "", part.get("content" if self.chat else "response") or ""
                answer.append(piece)
                thoughts.append(thinking)
                printer.piece(thinking, piece)
                final = obj if obj.get("done") else final
        except KeyboardInterrupt:
            self.echo("")
            return  # the answer is dropped: the conversation stays as it was
        finally:
            stream.close()  # closes the connection: the daemon stops generating
        printer.close_thinking()
        self.echo("")
        if self.chat:  # the thinking is kept with the answer, as Ollama's CLI keeps it
            reply = {"role": "assistant", "content": "".join(answer), **({"thinking": "".join(thoughts)} if any(thoughts) else {})}
            self.messages += [{"role": "user", "content": text}, reply]
        elif final is not None:
            self.context = final.get("context", [])
        if self.verbose and final is not None:
            self.echo(verbose_report(final), err=True)

    def set_parameter(self, name: str, raw: str) -> None:
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        new = dict(self.options)
        if name == "stop":
            new["stop"] = list(new.get("stop", [])) + [str(value)]
        else:
            new[name] = value
        GenerateOptions.from_dict(new)  # refuse it here, not at the next answer
        self.options = new

    def clear(self) -> None:
        self.messages, self.context = [], []


def verbose_report(final: dict) -> str:
    """Ollama's timing lines, then the speculation statistics of the final object."""
    stats = stats_from(final.get("speculative", {}))
    lines = [
        f"total duration:       {final.get('total_duration', 0) / 1e9:.3f}s",
        f"load duration:        {final.get('load_duration', 0) / 1e9:.3f}s",
        stats.summary(),
    ]
    return "\n".join(lines)


def stats_from(data: dict) -> Stats:
    names = {f.name for f in dataclasses.fields(Stats)}
    return Stats(**{k: v for k, v in data.items() if k in names})


def read_message(read: Callable[[str], str]) -> str:
    """One message: a line, or several between triple quotes."""
    line = read(">>> ")
    if not line.lstrip().startswith('"""'):
        return line
    lines = [line.lstrip()[3:]]
    while not lines[-1].rstrip().endswith('"""'):
        lines.append(read("... "))
    lines[-1] = lines[-1].rstrip()[:-3]
    return "\n".join(lines).strip()


def repl(session: Session, read: Callable[[str], str] = input) -> None:
    """The interactive loop; returns on /bye or end of input."""
    echo = session.echo
    echo("Send a message (/? for help)", err=True)
    while True:
        try:
            text = read_message(read)
        except EOFError:
            echo("")
            return
        except KeyboardInterrupt:
            echo("\nUse Ctrl-D or /bye to exit.", err=True)
            continue
        command = text.strip()
        if not command:
            continue
        if command == "/bye":
            return
        if command.startswith("/"):
            run_command(session, command)
        else:
            session.ask(text)


def run_command(session: Session, command: str) -> None:
    echo = session.echo
    words = command.split(maxsplit=3)
    try:
        if words[:2] == ["/set", "parameter"] and len(words) == 4:
            session.set_parameter(words[2], words[3])
            echo(f"Set parameter '{words[2]}' to '{words[3]}'", err=True)
        elif words[:2] == ["/set", "system"] and len(words) >= 3:
            session.system = command.split(maxsplit=2)[2]
            echo("Set system message.", err=True)
        elif words[:2] in (["/set", "verbose"], ["/set", "quiet"]):
            session.verbose = words[1] == "verbose"
            echo(f"Set '{words[1]}' mode.", err=True)
        elif words[:2] in (["/set", "wordwrap"], ["/set", "nowordwrap"]):
            session.wordwrap = words[1] == "wordwrap"
            echo(f"Set '{words[1]}' mode.", err=True)
        elif words[:2] == ["/set", "format"]:
            set_format(session, words[2:])
        elif words == ["/set", "noformat"]:
            session.format = None
            echo("Disabled format.", err=True)
        elif words[:2] in (["/set", "think"], ["/set", "nothink"]):
            set_think(session, words[1] == "think", words[2:])
        elif words[:2] == ["/show", "info"]:
            echo(show_info(session.client.request("POST", "/api/show", {"model": session.model})))
        elif words == ["/clear"]:
            session.clear()
            echo("Cleared session context.", err=True)
        elif words[0] in ("/?", "/help"):
            echo(HELP)
        else:
            echo(f"Unknown command '{command}'. Type /? for help", err=True)
    except OptionsError as e:
        echo(f"Error: {e}", err=True)


def set_format(session: Session, args: list[str]) -> None:
    """`/set format json`: the only format the REPL takes, as Ollama's."""
    if args != ["json"]:
        session.echo("Invalid or missing format. For 'json' mode use '/set format json'", err=True)
        return
    session.format = "json"
    session.echo("Set format to 'json' mode.", err=True)


def set_think(session: Session, on: bool, args: list[str]) -> None:
    """`/set think [level]` or `/set nothink`; a model that cannot think hears it anyway, with a warning."""
    if args and (not on or args[0] not in THINK_LEVELS or len(args) > 1):
        session.echo(f"Invalid think level '{' '.join(args)}': use /set think [{'|'.join(THINK_LEVELS)}]", err=True)
        return
    session.think = (args[0] if args else True) if on else False
    if not session.thinks:
        session.echo(f"warning: model '{session.model}' does not support thinking output", err=True)
    level = f" to '{args[0]}'" if args else ""
    session.echo(f"Set '{'think' if on else 'nothink'}' mode{level}.", err=True)


def show_info(info: dict) -> str:
    """The `show` summary: architecture, size, context, quantization, drafting."""
    details, model_info, ours = info.get("details", {}), info.get("model_info", {}), info.get("mlxspec", {})
    arch = model_info.get("general.architecture", details.get("family", ""))
    rows = [
        ("architecture", arch),
        ("parameters", details.get("parameter_size", "")),
        ("context length", model_info.get(f"{arch}.context_length", "")),
        ("quantization", details.get("quantization_level", "")),
        ("target", ours.get("target", "")),
        ("drafter", ours.get("drafter") or ("draft-model" if ours.get("draft") else "none")),
        ("draft", ours.get("draft") or ""),
        ("draft quantization", ours.get("draft_quantize") or ""),
        ("capabilities", ", ".join(info.get("capabilities", []))),
        ("template", ours.get("template_source", "")),
        *gguf_rows(ours.get("gguf_conversion")),
    ]
    return "\n".join(f"  {k:<20}{v}" for k, v in rows if v not in ("", None))


def gguf_rows(conversion: dict | None) -> list[tuple[str, str]]:
    """How a GGUF's tensors loaded: the exact ones by type, the requantized ones by type and width
    with the worst tensor's error next to the source format's own rounding error."""
    if not conversion:
        return []
    exact = ", ".join(f"{t} x{n}" for t, n in sorted(conversion.get("exact", {}).items()))
    rows = [("exact tensors", exact or "none")]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in conversion.get("requantized", {}).values():
        groups.setdefault((r["type"], r["mlx"]), []).append(r)
    for (source, target), reports in sorted(groups.items()):
        worst = max(reports, key=lambda r: r["rms_error"] / (r["source_rms"] or 1))
        rows.append(("requantized", f"{source} -> {target} x{len(reports)}: RMS error {worst['rms_error']:.2g}, "
                     f"max {worst['max_error']:.2g} (the {source} rounding itself: RMS {worst['source_rms']:.2g})"))
    return rows
