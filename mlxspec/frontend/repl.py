"""`mlxspec run`: one prompt or an interactive session with a model served by the daemon.

Chat models keep the conversation as messages (/api/chat); models without a chat template
continue from the returned token context (/api/generate).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Callable

import click

from .client import ApiError, Client
from .display import AnswerPrinter, WordWrap, terminal_width
from ..options import GenerateOptions, OptionsError
from ..stats import Stats

SET_HELP = """  /set parameter <name> <value>   set an option (temperature, num_predict, draft_num_predict, stop, ...)
  /set system <string>            set the system message (\"\"\" for several lines)
  /set verbose | /set quiet       show or hide statistics after each answer
  /set format json                answer in JSON (constrained)
  /set noformat                   answer in free text
  /set think [high|medium|low|max] let the model think first (models that support it)
  /set nothink                    ask the model not to think
  /set wordwrap | /set nowordwrap wrap words at the terminal's width, or not"""

SHOW_HELP = """  /show info                      show the model's details
  /show license | modelfile       show the model's license, or its Modelfile
  /show parameters                show the model's parameters, and this session's
  /show system | template         show the system message, or the prompt template"""

HELP = f"""Commands:
{SET_HELP}
{SHOW_HELP}
  /load <model>                   load another model: the conversation starts over
  /save <model>                   save this session (system, parameters, conversation) as a model
  /clear                          forget the conversation
  /bye or /exit                   exit (also Ctrl-D)
  /? or /help [set|show]          this help, or its /set or /show part
Use \"\"\" to begin and end a message of several lines."""

PARAMETERS_HELP = """Available Parameters:
  /set parameter seed <int>               random number seed
  /set parameter num_predict <int>        tokens to generate at most
  /set parameter temperature <float>      0 is greedy decoding
  /set parameter top_k <int>              pick from the top k tokens
  /set parameter top_p <float>            pick from the tokens within this probability
  /set parameter num_ctx <int>            the context size
  /set parameter draft_num_predict <int>  tokens drafted per round (0: no speculation)
  /set parameter stop <string> <string> ...   stop at any of these (replaces the earlier ones)"""


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
    think_set: bool = False  # the user chose `think` (--think, /set think): a /load keeps it
    thinks: bool = False  # the model can think (its capabilities say "thinking")
    hide_thinking: bool = False
    wordwrap: bool = True  # wrap words, where the output is a terminal
    terminal: bool = False  # stdout is a terminal: piped output is never wrapped
    width: Callable[[], int] = terminal_width
    saved_messages: list = dataclasses.field(default_factory=list)  # the model's own conversation (/save keeps it)

    def adopt(self, model: str, info: dict) -> None:
        """Take on a model from its /api/show answer; the conversation starts over."""
        self.model, self.chat = model, bool(info.get("mlxspec", {}).get("chat"))
        self.thinks = "thinking" in (info.get("capabilities") or [])
        if not self.think_set:  # as Ollama's CLI: a model that can think does, unless told otherwise
            self.think = True if self.thinks else None
        self.saved_messages = list(info.get("messages") or [])
        self.clear()

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
                with self.client.reading(f"POST {path}"):
                    thinking, piece = _texts(obj, self.chat)
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
            with self.client.reading(f"POST {path}"):  # its statistics
                report = verbose_report(final)
            self.echo(report, err=True)

    def set_parameter(self, name: str, raw: list[str]) -> None:
        """As Ollama's /set parameter: one value, or for stop the words given (replacing the earlier ones)."""
        values = [_json_or_text(word) for word in raw]
        new = dict(self.options)
        if name == "stop":
            new["stop"] = [str(v) for v in values]
        else:
            new[name] = values[0] if len(values) == 1 else " ".join(raw)
        GenerateOptions.from_dict(new)  # refuse it here, not at the next answer
        self.options = new

    def save(self, name: str) -> None:
        """/save NAME: a model made of this one with the session's system message, parameters and conversation."""
        body: dict = {"model": name, "from": self.model}
        if self.system:
            body["system"] = self.system
        if self.options:
            body["parameters"] = self.options
        if self.messages:  # they replace the model's own: keep those first
            body["messages"] = self.saved_messages + self.messages
        self.client.request("POST", "/api/create", {**body, "stream": False})

    def clear(self) -> None:
        self.messages, self.context = [], []


def _texts(obj: dict, chat: bool) -> tuple[str, str]:
    """A streamed object's (thinking, text): its message's (chat) or its own thinking and response."""
    part = obj["message"] if chat else obj
    thinking, text = part.get("thinking") or "", part.get("content" if chat else "response") or ""
    if not isinstance(thinking, str) or not isinstance(text, str):
        raise TypeError("the thinking and the text must be strings")
    return thinking, text


def _json_or_text(word: str):
    try:
        return json.loads(word)
    except ValueError:
        return word


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


MULTILINE = re.compile(r'\s*(/set\s+system\s+)?"""')  # a message, or a system message, of several lines


def read_message(read: Callable[[str], str]) -> tuple[str, bool]:
    """One entry: a line, or several between triple quotes (also after /set system), and whether it was
    a \"\"\" block: as in Ollama's CLI such a block is always a message, even one that starts with '/'."""
    line = read(">>> ")
    opened = MULTILINE.match(line)
    if not opened:
        return line, False
    lines = [line[opened.end():]]
    while not lines[-1].rstrip().endswith('"""'):
        lines.append(read("... "))
    lines[-1] = lines[-1].rstrip()[:-3]
    text = "\n".join(lines).strip()
    return (f"/set system {text}", False) if opened.group(1) else (text, True)


def repl(session: Session, read: Callable[[str], str] = input) -> None:
    """The interactive loop; returns on /bye, /exit or end of input."""
    echo = session.echo
    echo("Send a message (/? for help)", err=True)
    while True:
        try:
            text, message = read_message(read)
        except EOFError:
            echo("")
            return
        except KeyboardInterrupt:
            echo("\nUse Ctrl-D or /bye to exit.", err=True)
            continue
        command = text.strip()
        if not command:
            continue
        if not message and command.split()[0] in ("/bye", "/exit"):
            return
        try:
            if not message and command.startswith("/"):
                run_command(session, command)
            else:
                session.ask(text)
        except ApiError as e:  # the daemon refused this one request: the session goes on
            echo(f"Error: {e}", err=True)


def run_command(session: Session, command: str) -> None:
    words = command.split()
    try:
        if words[0] == "/set":
            set_command(session, command, words[1:])
        elif words[0] == "/show":
            show_command(session, words[1:])
        elif words[0] in ("/load", "/save") and len(words) != 2:
            session.echo(f"Usage:\n  {words[0]} <model>", err=True)
        elif words[0] == "/load":
            load_model(session, words[1])
        elif words[0] == "/save":
            session.save(words[1])
            session.echo(f"Created new model '{words[1]}'", err=True)
        elif words == ["/clear"]:
            session.clear()
            session.echo("Cleared session context.", err=True)
        elif words[0] in ("/?", "/help"):
            part = {"set": SET_HELP, "show": SHOW_HELP}.get(words[1].lstrip("/") if len(words) > 1 else "")
            session.echo(f"Commands:\n{part}" if part else HELP)
        else:
            session.echo(f"Unknown command '{command}'. Type /? for help", err=True)
    except OptionsError as e:
        session.echo(f"Error: {e}", err=True)


def set_command(session: Session, command: str, args: list[str]) -> None:
    echo = session.echo
    what = args[0] if args else ""
    if what == "parameter" and len(args) >= 3:
        session.set_parameter(args[1], args[2:])
        echo(f"Set parameter '{args[1]}' to '{', '.join(args[2:])}'", err=True)
    elif what == "parameter":
        echo(PARAMETERS_HELP, err=True)
    elif what == "system" and len(args) >= 2:
        session.system = command.split(maxsplit=2)[2]
        echo("Set system message.", err=True)
    elif what in ("verbose", "quiet"):
        session.verbose = what == "verbose"
        echo(f"Set '{what}' mode.", err=True)
    elif what in ("wordwrap", "nowordwrap"):
        session.wordwrap = what == "wordwrap"
        echo(f"Set '{what}' mode.", err=True)
    elif what == "format":
        set_format(session, args[1:])
    elif what == "noformat" and len(args) == 1:
        session.format = None
        echo("Disabled format.", err=True)
    elif what in ("think", "nothink"):
        set_think(session, what == "think", args[1:])
    elif what in ("", "system"):
        echo(f"Commands:\n{SET_HELP}", err=True)
    else:
        echo(f"Unknown command '/set {what}'. Type /? for help", err=True)


def show_command(session: Session, args: list[str]) -> None:
    """/show PART, as Ollama's: the session's own system message and parameters come first."""
    echo = session.echo
    if len(args) != 1:
        echo(f"Commands:\n{SHOW_HELP}", err=True)
        return
    if args[0] not in ("info", "license", "modelfile", "parameters", "system", "template"):
        echo(f"Unknown command '/show {args[0]}'. Type /? for help", err=True)
        return
    info = show_reply(session.client, session.model)
    with session.client.reading("POST /api/show"):
        for text in _show_part(session, info, args[0]):
            echo(text)


def _show_part(session: Session, info: dict, part: str) -> list[str]:
    """The lines /show PART prints from the model's /api/show answer."""
    if part == "info":
        return [show_info(info)]
    if part == "parameters":
        lines = ["Model defined parameters:\n" + _indented(info.get("parameters") or "No parameters were specified.")]
        if session.options:
            lines.append("User defined parameters:\n" + _indented("\n".join(f"{k:<30} {v}" for k, v in session.options.items())))
        return lines
    if part == "system":
        return [session.system or info.get("system") or "No system message was specified for this model."]
    return [info.get(part) or f"No {part} was specified for this model."]


def _indented(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def show_reply(client: Client, model: str) -> dict:
    """The model's /api/show answer; one without a `details` object (which every daemon sends, Ollama's
    too) is another server's, an UnexpectedReply."""
    info = client.json_object("POST", "/api/show", {"model": model})
    with client.reading("POST /api/show"):
        if not isinstance(info["details"], dict):
            raise TypeError("details is not an object")
    return info


def load_model(session: Session, model: str) -> None:
    """/load MODEL: another model, loaded now; one the daemon does not have leaves the session as it was."""
    session.echo(f"Loading model '{model}'", err=True)
    try:
        info = show_reply(session.client, model)
    except ApiError as e:
        if e.status != 404:
            raise
        session.echo(f"Couldn't find model '{model}'", err=True)
        return
    with session.client.reading("POST /api/show"):
        session.adopt(model, info)
    session.client.request("POST", "/api/generate", {"model": model, **({"keep_alive": session.keep_alive}
                                                                         if session.keep_alive else {})})


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
