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
from ..options import GenerateOptions, OptionsError
from ..stats import Stats

HELP = """Commands:
  /set parameter <name> <value>   set an option (temperature, num_predict, draft_num_predict, stop, ...)
  /set system <text>              set the system message
  /set verbose | /set quiet       show or hide statistics after each answer
  /show info                      show the model's details
  /clear                          forget the conversation
  /bye                            exit (also Ctrl-D)
  /? or /help                     this help
Use \"\"\" to begin and end a message of several lines."""


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

    def ask(self, text: str) -> None:
        """Stream the answer to `text`; Ctrl-C stops it (the daemon cancels the generation)."""
        body: dict = {"model": self.model, "options": self.options}
        if self.keep_alive is not None:
            body["keep_alive"] = self.keep_alive
        if self.chat:
            system = [{"role": "system", "content": self.system}] if self.system else []
            body["messages"] = system + self.messages + [{"role": "user", "content": text}]
            path = "/api/chat"
        else:
            body.update(prompt=text, context=self.context, **({"system": self.system} if self.system else {}))
            path = "/api/generate"
        answer, final = [], None
        stream = self.client.stream("POST", path, body)
        try:
            for obj in stream:
                piece = obj["message"]["content"] if self.chat else obj.get("response", "")
                answer.append(piece)
                self.echo(piece, nl=False)
                final = obj if obj.get("done") else final
        except KeyboardInterrupt:
            self.echo("")
            return  # the answer is dropped: the conversation stays as it was
        finally:
            stream.close()  # closes the connection: the daemon stops generating
        self.echo("")
        if self.chat:
            self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": "".join(answer)}]
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
