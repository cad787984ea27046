"""The `mlxspec` command: Ollama's verbs over the daemon's HTTP API, plus in-process `generate`.

Every caller's mistake is one line on stderr and exit status 1; no traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from importlib.metadata import version as package_version
from pathlib import Path

import click

from ..address import LOOPBACK
from .client import Client, DaemonUnreachable
from ..errors import MlxspecError
from ..options import OptionsError

# Verbs whose modules are heavy (MLX, benchmarks): imported only when asked for, so the CLI starts fast.
LAZY_VERBS = {"bench": "mlxspec.frontend.bench", "doctor": "mlxspec.frontend.bench"}


class Cli(click.Group):
    def list_commands(self, ctx):
        return sorted(super().list_commands(ctx) + list(LAZY_VERBS))

    def get_command(self, ctx, name):
        if name in LAZY_VERBS:
            return getattr(importlib.import_module(LAZY_VERBS[name]), name)
        return super().get_command(ctx, name)

    def main(self, *args, **kwargs):
        """Errors become one line on stderr and exit status 1."""
        try:
            return super().main(*args, **{**kwargs, "standalone_mode": False})
        except click.exceptions.Abort as e:
            if isinstance(e.__context__, KeyboardInterrupt):  # Ctrl-C, which click makes an Abort: status 130
                sys.exit(130)
            click.echo("Aborted.", err=True)
        except click.ClickException as e:
            click.echo(f"Error: {e.format_message()}", err=True)
        except (MlxspecError, OptionsError, OSError) as e:  # OSError: a home that is a file, a full disk ...
            click.echo(f"Error: {e}", err=True)
        except KeyboardInterrupt:
            click.echo("", err=True)
            sys.exit(130)
        sys.exit(1)


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_version("mlxspec"), "-v", "--version", prog_name="mlxspec")  # -v as Ollama
def cli():
    """Speculative decoding on MLX, served the way Ollama serves models."""


HEAVY_VERBS = ("serve", "generate", "bench", "train-drafter")  # verbs that run MLX in this process


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if argv is None and args[:1] and args[0] in HEAVY_VERBS:
        from ..bench.blas_preload import ensure_fast_blas

        ensure_fast_blas()  # Linux: re-exec with an installed OpenBLAS when it is proven to work
    code = cli.main(args=argv, prog_name="mlxspec")
    sys.exit(code if isinstance(code, int) else 0)


# -- the daemon ----------------------------------------------------------------------------------


@cli.command()
def serve():
    """Run the daemon in the foreground (MLXSPEC_HOST, default 127.0.0.1:11435)."""
    from ..server import Settings, serve as run_server
    from ..store import Store

    try:
        settings = Settings.from_env()
    except ValueError as e:
        raise MlxspecError(str(e)) from None
    host, port = settings.host, settings.port
    store = Store(ollama_models=settings.ollama_models)
    store.home.mkdir(parents=True, exist_ok=True)
    pid_file = store.home / "serve.pid"
    pid_file.write_text(str(os.getpid()))

    def ready() -> None:
        click.echo(f"mlxspec {package_version('mlxspec')} listening on http://{host}:{port} (models in {store.home})", err=True)

    try:
        run_server(host, port, store, settings, on_ready=ready)
    except OSError as e:
        raise MlxspecError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    finally:
        pid_file.unlink(missing_ok=True)


def ensure_daemon(c: Client) -> None:
    """Start a daemon in the background when none answers on a local address, and say so."""
    if c.is_running():
        return
    if c.host not in LOOPBACK:
        raise DaemonUnreachable(f"no mlxspec daemon answers at {c.url}")
    from ..store import Store

    home = Store().home
    home.mkdir(parents=True, exist_ok=True)
    log = home / "serve.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlxspec", "serve"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            env={**os.environ, "MLXSPEC_HOST": f"{c.host}:{c.port}"},
        )
    click.echo(f"No daemon answered at {c.url}: started one in the background (pid {proc.pid}, log {log}).", err=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise MlxspecError(f"the daemon exited at start (status {proc.returncode}); see {log}")
        if c.is_running(timeout=1):
            return
        time.sleep(0.2)
    raise MlxspecError(f"the daemon did not answer within 60 s; see {log}")


@cli.group()
def daemon():
    """Run `mlxspec serve` at login: launchd (macOS) or systemd --user (Linux)."""


@daemon.command("install")
def daemon_install():
    from . import service

    click.echo(service.install())


@daemon.command("uninstall")
def daemon_uninstall():
    from . import service

    click.echo(service.uninstall())


@daemon.command("status")
def daemon_status():
    from . import service

    c = Client()
    click.echo(service.status())
    click.echo(f"daemon at {c.url}: {'answering' if c.is_running() else 'not answering'}")


# -- talking to a model ----------------------------------------------------------------------------


class BareFlagValues(click.Command):
    """Options whose value may be left out, as cobra's NoOptDefVal in Ollama's CLI: a bare `--think`
    means `--think=true` and never takes the next word (the prompt) for its value."""

    bare = {"--think": "true"}

    def parse_args(self, ctx, args):
        end = args.index("--") if "--" in args else len(args)
        args = [f"{a}={self.bare[a]}" if a in self.bare and i < end else a for i, a in enumerate(args)]
        return super().parse_args(ctx, args)


@cli.command(cls=BareFlagValues)
@click.argument("model")
@click.argument("prompt", nargs=-1)
@click.option("--verbose", is_flag=True, help="Print timings, tok/s and speculation statistics.")
@click.option("--keepalive", help="How long the model stays loaded afterwards (e.g. 5m, 0, -1).")
@click.option("--format", "format_", metavar="json|SCHEMA", help="Response format: json, or a JSON schema.")
@click.option("--think", metavar="[=false|high|medium|low|max]",
              help="Thinking for models that support it (on by default where they do): --think, --think=false, or a level.")
@click.option("--hidethinking", is_flag=True, help="Don't print the thinking (if the model thinks).")
@click.option("--nowordwrap", is_flag=True, help="Don't wrap words to the next line (piped output never wraps).")
def run(model, prompt, verbose, keepalive, format_, think, hidethinking, nowordwrap):
    """Answer PROMPT (or stdin), or chat interactively when neither is given; an empty PROMPT ("") only loads
    the model (as Ollama's preload)."""
    from .repl import Session, repl

    answer_format, think = format_option(format_), think_option(think)  # refused before any daemon is called
    c = Client()
    ensure_daemon(c)
    info = show_or_pull(c, model)
    text = " ".join(prompt)
    if not sys.stdin.isatty():
        piped = sys.stdin.read()
        text = f"{piped.rstrip()}\n\n{text}".strip() if piped.strip() else text
    session = Session(c, model, chat=False, verbose=verbose, keep_alive=keepalive, format=answer_format, think=think,
                      think_set=think is not None, hide_thinking=hidethinking, wordwrap=not nowordwrap,
                      terminal=sys.stdout.isatty())
    with c.reading("POST /api/show"):
        session.adopt(model, info)  # its chat template, whether it thinks, its saved conversation
    only_load = not text and (bool(prompt) or not (sys.stdin.isatty() and sys.stdout.isatty()))  # as Ollama: `run M ""`
    if sys.stderr.isatty():  # loading a large model takes a while: say so
        click.echo(f"loading {model} ...", err=True)
    if sys.stderr.isatty() or only_load:
        c.request("POST", "/api/generate", {"model": model, **({"keep_alive": keepalive} if keepalive else {})})
    if text:
        session.ask(text)
    elif not only_load:
        _load_history()
        repl(session)


def format_option(value: str | None) -> str | dict | None:
    """--format: "json", or a JSON schema given as JSON text (sent as Ollama's `format`)."""
    if value is None or value == "json":
        return value
    try:
        schema = json.loads(value)
    except ValueError:
        schema = None
    if not isinstance(schema, dict):
        raise click.BadParameter("must be json or a JSON schema object", param_hint="--format")
    return schema


def think_option(value: str | None) -> bool | str | None:
    """--think's value as Ollama's `think`: true, false or an effort level; None when not given."""
    if value is None:
        return None
    if value in ("", "true", "false"):
        return value != "false"
    from .repl import THINK_LEVELS

    if value in THINK_LEVELS:
        return value
    raise click.BadParameter(f"{value!r}: must be true, false, high, medium, low, or max", param_hint="--think")


def show_or_pull(c: Client, model: str) -> dict:
    """The model's /api/show answer, pulling it first when the daemon does not have it (as Ollama)."""
    from .client import ApiError
    from .repl import show_reply

    try:
        return show_reply(c, model)
    except ApiError as e:
        if e.status != 404:
            raise
    pull_with_progress(c, model)
    return show_reply(c, model)


def _load_history() -> None:
    try:
        import readline  # noqa: F401  # gives input() line editing and history
    except ImportError:
        return
    from ..store import Store

    path = Store().home / "history"
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    import atexit

    atexit.register(lambda: _save_history(readline, path))


def _save_history(readline, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        readline.write_history_file(path)
    except OSError:
        pass


@cli.command()
@click.argument("model")
@click.argument("prompt")
@click.option("--draft", help="A draft model reference (same tokenizer as the target).")
@click.option("--drafter", help="How to draft: none, draft-model, lookup, early-exit[:LAYERS], medusa:NAME|PATH, "
              "eagle:NAME|PATH, eagle3:SOURCE (a published EAGLE-3 head: folder or repo id), mtp[:SOURCE].")
@click.option("--quantize", help="Quantize the target on load: q4, q8, q4g32 ...")
@click.option("--draft-quantize", help="Quantize the draft on load.")
@click.option("-n", "--max-tokens", type=int, help="Tokens to generate (default 256; -1: until EOS or context end).")
@click.option("--temperature", type=float, help="0 (the default) is greedy decoding.")
@click.option("--seed", type=int)
@click.option("--draft-length", type=int, help="Tokens drafted per round (0: no speculation).")
@click.option("--draft-width", type=int, help="Candidates per draft depth: > 1 verifies a tree (EAGLE, greedy).")
@click.option("--chat/--no-chat", default=None, help="Apply the chat template (default: when the model has one).")
@click.option("--verbose/--quiet", default=True, help="Print the statistics at the end.")
def generate(model, prompt, draft, drafter, quantize, draft_quantize, max_tokens, temperature, seed, draft_length, draft_width,
             chat, verbose):
    """Generate in this process, no daemon: MODEL is a model name or a reference (path, repo id,
    .gguf, pypi:package/file, ollama:NAME[:TAG]); PROMPT '-' reads stdin. Options left out come from the model's
    parameters, else the engine's defaults."""
    from .generate import generate_in_process

    if prompt == "-":
        prompt = sys.stdin.read()
    generate_in_process(
        model, prompt, draft=draft, drafter=drafter, quantize=quantize, draft_quantize=draft_quantize,
        options={"num_predict": max_tokens, "temperature": temperature, "seed": seed, "draft_num_predict": draft_length,
                 "draft_width": draft_width},
        chat=chat, verbose=verbose,
    )


# -- model management -------------------------------------------------------------------------------

from .models import register as _register_model_verbs  # noqa: E402  (verbs need `cli` above)
from .models import pull_with_progress  # noqa: E402

_register_model_verbs(cli)

from .train import register as _register_train_verbs  # noqa: E402

_register_train_verbs(cli)
