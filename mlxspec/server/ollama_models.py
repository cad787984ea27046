"""Ollama's model management API: tags, show, ps, pull, create, copy, delete (uploads: blobs.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from datetime import datetime, timezone

from aiohttp import web

from .. import modelfile, ollama_store
from ..drafters import LEARNED, SOURCED, parse_drafter
from ..store import Entry, Manifest, PullCancelled, canonical, disk_size
from . import facts
from ..go_jinja import DEFAULT_GO_TEMPLATE
from .references import head_file_for_http, resolve_for_http
from .requests import ApiError, field, model_field, read_json
from .state import STATE, State
from .streams import ndjson
from .template_limits import check_template

routes = web.RouteTableDef()


@routes.get("/api/tags")
async def tags(request: web.Request) -> web.Response:
    state = request.app[STATE]
    entries = await asyncio.to_thread(state.store.list)
    return web.json_response({"models": list(await asyncio.gather(*(_tag(state, e) for e in entries)))})


async def _tag(state: State, entry: Entry) -> dict:
    """One model of /api/tags; Ollama's models say so in `source` (and in their `ollama:` names)."""
    if entry.details is None:
        known = _loaded_facts(state, entry.name, entry.manifest)
        known = (known or await asyncio.to_thread(facts.from_disk, entry.manifest, False)
                 or facts.Facts(format=facts.weights_format(entry.manifest.target)))
    size = entry.size if entry.size is not None else await asyncio.to_thread(disk_size, entry.manifest, state.store.ollama)
    return {
        "name": entry.name,
        "model": entry.name,
        "modified_at": entry.modified_at.isoformat(),
        "size": size,
        "digest": entry.digest.removeprefix("sha256:"),
        "details": entry.details if entry.details is not None else known.details(entry.manifest),
        "source": entry.source,
    }


def _loaded_facts(state: State, name: str, manifest: Manifest) -> facts.Facts | None:
    loaded = state.registry.loaded.get(name)
    return facts.from_engine(loaded.engine, manifest) if loaded and loaded.engine is not None else None


# What `show` says of a model that came without a chat template (a base model, a bare GGUF).
NO_TEMPLATE = ("none came with the model: chat uses Ollama's default {{ .Prompt }} (each user turn verbatim, "
               "then the assistant's reply; system messages are not rendered)")


@routes.post("/api/show")
async def show(request: web.Request) -> web.Response:
    state, body = request.app[STATE], await read_json(request)
    name, manifest = await asyncio.to_thread(state.manifest, model_field(body))
    entry = await asyncio.to_thread(state.store.entry, name)
    ollama = await asyncio.to_thread(state.store.ollama_contents, name) if entry.source == "ollama" else None
    known = _loaded_facts(state, name, manifest) or await asyncio.to_thread(facts.from_disk, manifest)
    if known is None:  # a GGUF file, or weights not downloaded yet: load to learn what it is
        loaded, _ = await state.registry.acquire(name, manifest)
        known = facts.from_engine(loaded.engine, manifest)
        state.registry.release(loaded, None)
    return web.json_response(
        {
            "modelfile": _modelfile(name, manifest),
            "parameters": _parameters(manifest.parameters),
            "template": manifest.template or known.chat_template or DEFAULT_GO_TEMPLATE,
            "system": manifest.system or "",
            "license": "\n".join(ollama.license if ollama else manifest.license or []),
            "messages": manifest.messages or [],
            "details": known.details(manifest),
            "model_info": known.model_info(name),
            "capabilities": known.capabilities(manifest),
            "modified_at": entry.modified_at.isoformat(),
            "mlxspec": {
                **{k: v for k, v in dataclasses.asdict(manifest).items()
                   if k not in ("parameters", "template", "system", "messages", "license")},
                "drafter": manifest.drafter_name,
                "chat": bool(manifest.template or known.chat_template),
                "template_source": "manifest" if manifest.template else "model" if known.chat_template else NO_TEMPLATE,
                **({"ollama": ollama_store.describe(state.store.ollama, ollama)} if ollama else {}),
                **({"gguf_conversion": known.gguf_conversion} if known.gguf_conversion else {}),
            },
        }
    )


def _modelfile(name: str, manifest: Manifest) -> str:
    try:
        return modelfile.render(name, manifest)
    except modelfile.ModelfileError as e:  # a text holding its own closing quotes: say so, show the rest
        return f"# {e}\n"


def _parameters(params: dict) -> str:
    """Ollama's text form: `key value`, one stop string per line."""
    lines = []
    for key, value in params.items():
        for v in value if isinstance(value, list) else [value]:
            lines.append(f'{key} "{v}"' if isinstance(v, str) else f"{key} {v}")
    return "\n".join(lines)


@routes.get("/api/ps")
async def ps(request: web.Request) -> web.Response:
    state = request.app[STATE]
    models = []
    # as Ollama: the model kept longest first
    for name, loaded in sorted(state.registry.loaded.items(), key=lambda kv: -kv[1].expires_at):
        if loaded.engine is None:
            continue
        known = facts.from_engine(loaded.engine, loaded.manifest)
        digest = state.store.entry(name).digest.removeprefix("sha256:") if state.store.exists(name) else ""
        expires = min(loaded.expires_at, 253402300799.0)  # 'forever' is the year 9999
        models.append(
            {
                "name": name, "model": name, "size": loaded.size, "size_vram": loaded.size, "digest": digest,
                "details": known.details(loaded.manifest),
                "expires_at": datetime.fromtimestamp(expires, timezone.utc).isoformat(),
                "context_length": known.context_length,
                "drafter": loaded.engine.info.get("drafter"),
                "draft": loaded.manifest.draft,
            }
        )
    return web.json_response({"models": models})


@routes.post("/api/pull")
async def pull(request: web.Request) -> web.StreamResponse:
    state, body = request.app[STATE], await read_json(request)
    name = model_field(body)
    await asyncio.to_thread(state.store.pull_manifest, name)  # a bad or unknown name: 400/404 up front
    cancel = threading.Event()
    updates = _start_pull(state, name, cancel)
    try:
        if field(body, "stream", bool, True):
            return await ndjson(request, updates)
        async for _ in updates:
            pass
        return web.json_response({"status": "success"})
    finally:
        cancel.set()  # a client that left abandons the download; no manifest is written


async def _start_pull(state: State, name: str, cancel: threading.Event):
    """Progress objects of a pull running in a thread; raises its error at the end."""
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()

    def progress(ref: str, done: int, total: int) -> None:
        if cancel.is_set():
            raise PullCancelled("pull cancelled")
        loop.call_soon_threadsafe(queue.put_nowait, ("progress", (ref, done, total)))

    def work() -> None:
        try:
            result = ("done", state.store.pull(name, progress))
        except BaseException as e:  # noqa: BLE001  # handed to the request, raised there
            result = ("error", e)
        loop.call_soon_threadsafe(queue.put_nowait, result)

    yield {"status": "pulling manifest"}
    loop.run_in_executor(None, work)
    last = None
    while True:
        kind, value = await queue.get()
        while kind == "progress" and not queue.empty():  # only the latest of what piled up meanwhile
            kind, value = queue.get_nowait()
        if kind == "error":
            raise value
        if kind == "done":
            break
        if value == last:  # two byte counters (received, written) often agree
            continue
        last = ref, done, total = value
        yield {"status": f"pulling {ref}", "digest": ref, "total": total, "completed": done}
    yield {"status": "writing manifest"}
    yield {"status": "success"}


@routes.post("/api/create")
async def create(request: web.Request) -> web.StreamResponse:
    state, body = request.app[STATE], await read_json(request)
    name = canonical(model_field(body))
    for key, why in REFUSED.items():
        if body.get(key):
            raise ApiError(400, why)
    manifest, saved = await asyncio.to_thread(_create, state, request, body, name)
    if not field(body, "stream", bool, True):
        return web.json_response({"status": "success"})

    async def statuses():
        for status in (f"using {manifest.target}", f"writing manifest {saved}", "success"):
            yield {"status": status}

    return await ndjson(request, statuses())


def _create(state: State, request: web.Request, body: dict, name: str) -> tuple[Manifest, str]:
    """Build and save under the store's lock: a delete meanwhile cannot remove the folder of uploaded
    files the new model is made of before its manifest names it."""
    with state.store.lock:
        manifest = _created_manifest(state, request, body)
        return manifest, state.store.save(name, manifest)


def _reference(state: State, ref: str, what: str, trusted: bool) -> Manifest:
    return resolve_for_http(state.store, ref, what, state.settings.model_dirs, trusted)


# What /api/create refuses by name (Ollama fields mlxspec has no counterpart for).
REFUSED = {
    "adapters": "ADAPTER (LoRA adapters) is not supported by mlxspec: merge the adapter into the weights first",
    "renderer": "RENDERER (Ollama's built-in prompt renderers) is not supported: give a template",
    "parser": "PARSER (Ollama's built-in output parsers) is not supported",
    "remote_host": "remote_host (a model on another server) is not supported",
}


def _created_manifest(state: State, request: web.Request, body: dict) -> Manifest:
    """A manifest from `from` (a stored or shipped model, else a reference) or `files` (uploaded blobs), and
    the given fields: as Ollama, parameters merge over the base's, messages replace its, licenses add to its."""
    trusted = state.is_local_user(request)
    base = _base(state, body, trusted)
    keys = ("draft", "drafter", "quantize", "draft_quantize", "template", "system", "description")
    changes = {k: v for k in keys if (v := field(body, k, str)) is not None}
    if "template" in changes and (why := check_template(changes["template"])):
        raise ApiError(400, f"template does not parse: {why}")  # refused now, not at every request
    if draft_files := _files(body, "draft_files"):
        if "draft" in changes:
            raise ApiError(400, "give either draft or draft_files (uploaded blobs), not both")
        changes["draft"] = str(state.store.blobs.model_from_files(draft_files, "draft_files"))
    elif "draft" in changes:
        changes["draft"] = _reference(state, changes["draft"], "draft", trusted).target
    if "draft" in changes:
        # a draft model means the draft-model drafter (left implicit, as the base had it, for round trips)
        changes.setdefault("drafter", base.drafter if base.drafter in (None, "draft-model") else "draft-model")
    elif changes.get("drafter") not in (None, "draft-model"):
        changes["draft"] = None  # another drafter replaces the draft model
    kind, colon, source = (changes.get("drafter") or "").partition(":")
    if kind in SOURCED and colon:  # where its weights are read: held to what `from` may name
        changes["drafter"] = f"{kind}:" + _reference(state, source, f"the {kind} drafter's source", trusted).target
    elif kind in LEARNED and colon:  # a head file: a name in MLXSPEC_HOME, or a path held likewise
        changes["drafter"] = f"{kind}:" + head_file_for_http(source, f"the {kind} drafter's file",
                                                            state.settings.model_dirs, trusted)
    if body.get("draft_length") is not None:
        changes["draft_length"] = field(body, "draft_length", int)
    if params := field(body, "parameters", dict):
        changes["parameters"] = {**base.parameters, **params}
    if messages := field(body, "messages", list):
        changes["messages"] = [_message(m, i) for i, m in enumerate(messages)]
    if (licenses := _licenses(body)) is not None:
        changes["license"] = (base.license or []) + licenses
    manifest = dataclasses.replace(base, **changes)
    _check_early_exit(manifest)
    return manifest


def _check_early_exit(manifest: Manifest) -> None:
    """early-exit:N stops before the target's last layer: refused now where the target's config.json is on
    disk (a GGUF's count is read at load), not at every request to the model."""
    kind, layers = parse_drafter(manifest.drafter_name)
    known = facts.from_disk(manifest, tokenizer=False) if kind == "early-exit" and layers is not None else None
    total = known.num_layers if known else None
    if isinstance(total, int) and not 1 <= layers < total:
        raise ApiError(400, f"drafter early-exit:{layers}: the target has {total} layers, choose 1..{total - 1}")


def _base(state: State, body: dict, trusted: bool) -> Manifest:
    """What the model is made of: `from`, or `files` ({name: digest} of blobs uploaded with /api/blobs:
    one .gguf file, or a safetensors model's files), as Ollama takes either."""
    given, files = field(body, "from", str), _files(body, "files")
    if files and given:
        raise ApiError(400, "give either from or files (uploaded blobs), not both")
    if files:
        return Manifest(target=str(state.store.blobs.model_from_files(files)))
    if given is None:
        raise ApiError(400, "from is required (or files: blobs uploaded with /api/blobs)")
    return _reference(state, given, "from", trusted)


def _files(body: dict, key: str) -> dict:
    """`files` / `draft_files`: {file name: digest}; names and digests are checked where the folder is made."""
    return field(body, key, dict) or {}


def _message(m, i: int) -> dict:
    if not isinstance(m, dict) or m.get("role") not in modelfile.ROLES or not isinstance(m.get("content"), str):
        raise ApiError(400, f"messages[{i}] must be {{\"role\": system|user|assistant, \"content\": text}}")
    return {"role": m["role"], "content": m["content"]}


def _licenses(body: dict) -> list[str] | None:
    """`license`: a string or a list of strings (Ollama's two forms)."""
    value = body.get("license")
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return value
    raise ApiError(400, "license must be a string or a list of strings")


@routes.post("/api/copy")
async def copy(request: web.Request) -> web.Response:
    state, body = request.app[STATE], await read_json(request)
    source = field(body, "source", str, required=True)
    destination = field(body, "destination", str, required=True)
    await asyncio.to_thread(state.store.copy, source, destination)
    return web.Response()


@routes.delete("/api/delete")
async def delete(request: web.Request) -> web.Response:
    state, body = request.app[STATE], await read_json(request)
    name = model_field(body)
    await asyncio.to_thread(state.store.delete, name)  # an ollama: name is refused: Ollama's store is read-only
    await state.registry.unload(canonical(name))
    return web.Response()
