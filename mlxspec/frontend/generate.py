"""`mlxspec generate`: load a model in this process and stream one answer, with statistics."""

from __future__ import annotations

import dataclasses

import click

from ..ollama_store import default_root
from ..store import Manifest, Store


def with_overrides(store: Store, name: str, manifest: Manifest, draft, drafter, quantize, draft_quantize) -> Manifest:
    """The manifest with the command line's choices on top (a --draft may be a model name too)."""
    changes: dict = {}
    if quantize:
        changes["quantize"] = quantize
    if draft_quantize:
        changes["draft_quantize"] = draft_quantize
    if draft:
        changes["draft"] = store.target_of(draft)
        changes["drafter"] = "draft-model"
    elif drafter:
        changes["drafter"] = drafter
        if drafter != "draft-model":
            changes["draft"] = None
    manifest = dataclasses.replace(manifest, **changes)
    manifest.validate(name)
    return manifest


def generate_in_process(model, prompt, *, draft, drafter, quantize, draft_quantize, options, chat, verbose) -> None:
    store = Store(ollama_models=default_root())  # OLLAMA_MODELS, read here at the command's entry
    name, manifest = store.resolve(model)
    manifest = with_overrides(store, name, manifest, draft, drafter, quantize, draft_quantize)
    opts = manifest.options({k: v for k, v in options.items() if v is not None})
    if verbose:
        click.echo(f"loading {name} ...", err=True)
    engine = store.load_engine(manifest)
    if chat if chat is not None else engine.tokenizer.has_chat_template:
        system = [{"role": "system", "content": manifest.system}] if manifest.system else []
        ids = engine.chat_prompt(system + [{"role": "user", "content": prompt}])
    else:
        ids = engine.encode(prompt)
    event = None
    try:  # Ctrl-C stops the generator between rounds; the CLI exits 130
        for event in engine.generate(ids, opts):
            click.echo(event.text, nl=False)
    finally:
        click.echo("")
    if verbose and event is not None and event.stats is not None:
        click.echo(event.stats.summary(), err=True)
