"""`mlxspec train-drafter`: record the target's own answers, fit an EAGLE head or Medusa heads, save atomically."""

from __future__ import annotations

import re
import time
from pathlib import Path

import click

from ..errors import MlxspecError

KINDS = ("eagle", "medusa")
BATCH = 1  # answers recorded side by side; on this CPU batches are slower (measured), see record_batch.py
LABELS = ("soft", "hard")  # EAGLE's token target: the target's distribution over the draft vocabulary (the default,
# measured better) or its argmax


def output_path(out: str | None, model: str, kind: str = "medusa") -> Path:
    """--out PATH (has a / or .safetensors) as given; a NAME (or the model's) under MLXSPEC_HOME/drafters."""
    from ..heads.files import drafter_path

    base = Path(model).stem if model.endswith(".gguf") else model
    name = out or re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-") + f"-{kind}"
    return drafter_path(name)


def train_drafter(model: str, kind: str, prompts: str | None, tokens: int, heads: int, out: str | None,
                  epochs: float | None = None, seed: int = 0, max_answer: int = 256, show: bool = True,
                  vocab: int = 4096, batch: int = BATCH, labels: str = LABELS[0]) -> tuple[Path, dict]:
    """Everything `mlxspec train-drafter` does; returns the file written and its config."""
    from ..engine import Engine
    from ..heads import eagle, eagle_train, files, medusa, record, train
    from ..home import default_home
    from ..ollama_store import default_root
    from ..store import Store

    if kind not in KINDS:
        raise MlxspecError(f"--kind {kind!r}: only {', '.join(KINDS)} can be trained")
    if labels not in LABELS:
        raise MlxspecError(f"--labels {labels!r}: one of {', '.join(LABELS)}")
    epochs = epochs if epochs is not None else (8.0 if kind == "eagle" else 2.0)
    if tokens < 16 or not 1 <= heads <= 8 or epochs <= 0 or max_answer < 4 or vocab < 16 or not 1 <= batch <= 64:
        raise MlxspecError("--tokens must be >= 16, --heads 1..8, --epochs > 0, --max-answer >= 4, --vocab >= 16, "
                           "--batch 1..64")
    texts = record.load_prompts(prompts)
    path = output_path(out, model, kind)
    store = Store(ollama_models=default_root())  # OLLAMA_MODELS, read here at the command's entry
    reference = store.target_of(model)
    begin = time.perf_counter()
    engine = Engine.load(reference, ollama=store.ollama)
    target = engine.target.model
    sha = files.identity(target)
    keep = record.recording_dir(default_home() / "drafters" / ".recordings", sha, max_answer)
    samples = record.record(engine, texts, tokens, max_answer, show, keep=keep, batch=batch)  # resumes from `keep`
    recorded = time.perf_counter() - begin
    config = {
        "target": reference,
        "target_sha256": sha,
        "training_tokens": sum(len(s.ids) - s.answer_start for s in samples),
        "prompts": len(samples),
        "record_seconds": round(recorded, 1),
        "seed": seed,
        "epochs": epochs,
    }
    if kind == "eagle":
        head, ids, report = eagle_train.train(target, samples, vocab, epochs=epochs, seed=seed,
                                                 soft=labels == "soft", show=show)
        return eagle.save(path, head, ids, {**config, **report}), {**config, **report}
    module, report = train.train(target, samples, heads, epochs=epochs, seed=seed, show=show)
    config = {"dims": int(samples[0].hidden.shape[-1]), **config, **report}
    return medusa.save(path, module, config), config


def register(cli) -> None:
    @cli.command("train-drafter")
    @click.argument("model")
    @click.option("--kind", default="eagle", show_default=True, help="What to train: eagle or medusa.")
    @click.option("--prompts", type=click.Path(dir_okay=False),
                  help="Prompts or your own chat logs: JSON or JSON Lines of strings, {\"prompt\": ...}, "
                       "{\"messages\": [...]} or ShareGPT {\"conversations\": [...]}; the target answers each user "
                       "turn of a log itself (default: the shipped set).")
    @click.option("--tokens", type=int, default=16000, show_default=True, help="Answer tokens to record in all.")
    @click.option("--heads", type=int, default=4, show_default=True, help="Medusa heads (tokens guessed per pass).")
    @click.option("--vocab", type=int, default=4096, show_default=True, help="EAGLE's draft vocabulary (most frequent tokens).")
    @click.option("--epochs", type=float, help="Passes over the recorded data [default: eagle 8, medusa 2].")
    @click.option("--seed", type=int, default=0, show_default=True)
    @click.option("--max-answer", type=int, default=256, show_default=True, help="Tokens at most per answer.")
    @click.option("--batch", type=int, default=BATCH, show_default=True,
                  help="Answers recorded side by side (1: one at a time through the engine).")
    @click.option("--labels", type=click.Choice(LABELS), default=LABELS[0], show_default=True,
                  help="EAGLE learns the target's distribution over its draft vocabulary (soft) or its argmax (hard).")
    @click.option("--out", help="A name (MLXSPEC_HOME/drafters/NAME.safetensors) or a path; default MODEL-KIND.")
    def train_drafter_command(model, kind, prompts, tokens, heads, vocab, epochs, seed, max_answer, batch, labels, out):
        """Train a learned drafter for MODEL from the model's own answers (self-distillation).

        Recordings are kept under MLXSPEC_HOME/drafters/.recordings: an interrupted run resumes."""
        path, config = train_drafter(model, kind, prompts, tokens, heads, out, epochs, seed, max_answer, vocab=vocab,
                                     batch=batch, labels=labels)
        what = f"{heads} heads" if kind == "medusa" else f"one layer, {config['draft_vocab']}-token draft vocabulary"
        per = "per head" if kind == "medusa" else "at draft steps 1 and 2"
        click.echo(f"wrote {path}: {what}, "
                   f"{config['training_tokens']} tokens, loss {config['loss']}, held-out top-1 {per} "
                   f"{config['heldout_top1']} (untrained {config['heldout_top1_untrained']}); "
                   f"use it with --drafter {kind}:{path}")
