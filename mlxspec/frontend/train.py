"""`mlxspec train-drafter`: record the target's own answers, fit Medusa heads, save them atomically."""

from __future__ import annotations

import re
import time
from pathlib import Path

import click

from ..errors import MlxspecError

KINDS = ("medusa",)


def output_path(out: str | None, model: str) -> Path:
    """--out PATH (has a / or .safetensors) as given; a NAME (or the model's) under MLXSPEC_HOME/drafters."""
    from ..drafters.medusa import drafter_path

    base = Path(model).stem if model.endswith(".gguf") else model
    name = out or re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-") + "-medusa"
    return drafter_path(name)


def train_drafter(model: str, kind: str, prompts: str | None, tokens: int, heads: int, out: str | None,
                  epochs: float = 2.0, seed: int = 0, max_answer: int = 256, show: bool = True) -> tuple[Path, dict]:
    """Everything `mlxspec train-drafter` does; returns the file written and its config."""
    from ..engine import Engine
    from ..heads import medusa, train
    from ..ollama_store import default_root
    from ..store import Store

    if kind not in KINDS:
        raise MlxspecError(f"--kind {kind!r}: only {', '.join(KINDS)} can be trained")
    if tokens < 16 or not 1 <= heads <= 8 or epochs <= 0 or max_answer < 4:
        raise MlxspecError("--tokens must be >= 16, --heads 1..8, --epochs > 0, --max-answer >= 4")
    texts = train.load_prompts(prompts)
    path = output_path(out, model)
    store = Store(ollama_models=default_root())  # OLLAMA_MODELS, read here at the command's entry
    reference = store.target_of(model)
    begin = time.perf_counter()
    engine = Engine.load(reference, ollama=store.ollama)
    samples = train.record(engine, texts, tokens, max_answer, show)
    recorded = time.perf_counter() - begin
    module, report = train.train(engine.target.model, samples, heads, epochs=epochs, seed=seed, show=show)
    config = {
        "dims": int(samples[0].hidden.shape[-1]),
        "target": reference,
        "target_sha256": medusa.identity(engine.target.model),
        "training_tokens": sum(len(s.ids) - s.answer_start for s in samples),
        "prompts": len(samples),
        "record_seconds": round(recorded, 1),
        "seed": seed,
        **report,
    }
    return medusa.save(path, module, config), config


def register(cli) -> None:
    @cli.command("train-drafter")
    @click.argument("model")
    @click.option("--kind", default="medusa", show_default=True, help="What to train: medusa.")
    @click.option("--prompts", type=click.Path(dir_okay=False), help="JSON list of prompts (default: the shipped set).")
    @click.option("--tokens", type=int, default=16000, show_default=True, help="Answer tokens to record in all.")
    @click.option("--heads", type=int, default=4, show_default=True, help="Medusa heads (tokens guessed per pass).")
    @click.option("--epochs", type=float, default=2.0, show_default=True, help="Passes over the recorded positions.")
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.option("--max-answer", type=int, default=256, show_default=True, help="Tokens at most per answer.")
    @click.option("--out", help="A name (MLXSPEC_HOME/drafters/NAME.safetensors) or a path; default MODEL-medusa.")
    def train_drafter_command(model, kind, prompts, tokens, heads, epochs, seed, max_answer, out):
        """Train a learned drafter for MODEL from the model's own answers (self-distillation)."""
        path, config = train_drafter(model, kind, prompts, tokens, heads, out, epochs, seed, max_answer)
        click.echo(f"wrote {path}: {heads} heads, "
                   f"{config['training_tokens']} tokens, loss {config['loss']}, held-out top-1 per head "
                   f"{config['heldout_top1']} (untrained {config['heldout_top1_untrained']}); "
                   f"use it with --drafter medusa:{path}")
