"""One timed generation per call, for each kind of configuration, on the same loaded weights.

Timing is the same for every runner, mlx-lm peers included, measured here on the wall clock:
  - time to first token (TTFT): from the call to the first emitted token (prompt processing + the
    first round);
  - decode tokens/s: tokens emitted after the first emission / time from the first to the last.
Every run starts with the drafter's memory of earlier answers empty (lookup's: a repeat would
otherwise be drafted from its own first answer; benchmarks/bench_memory.py measures that memory).
A cold run drops mlxspec's prefix cache first, so it processes the whole prompt as mlx-lm's
functions always do: TTFT comes from cold runs. Later repeats may run warm (the engine reuses the
prompt's KV cache), which changes nothing after the prompt and saves minutes on a CPU.
Generation stops at an end-of-sequence token (not emitted) or max_tokens, like mlxspec's engine.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass

import mlx.core as mx

from ..drafters import SOURCED, make_drafter, parse_drafter
from ..engine import Engine
from ..loading import LoadedModel, drafter_source
from ..options import GenerateOptions
from ..settings import DecodeSettings
from ..stats import Stats
from . import memory
from .configs import ENGINE, MLX_LM, MLX_LM_SPECULATIVE, Config


@dataclass
class Run:
    tokens: list[int]
    ttft: float
    decode_seconds: float  # first emission -> last emission
    decode_tokens: int  # tokens emitted after the first emission
    stats: Stats
    peak_memory: int

    @property
    def tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


class Clock:
    """Wall-clock marks of a generation: start, first emission, last emission."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first = self.last = None
        self.first_count = 0

    def emitted(self, count: int) -> None:
        if count <= 0:
            return
        now = time.perf_counter()
        if self.first is None:
            self.first, self.first_count = now, count
        self.last = now

    def finish(self, tokens: list[int], stats: Stats) -> Run:
        if self.first is None:
            return Run(tokens, 0.0, 0.0, 0, stats, memory.peak_bytes())
        after_first = len(tokens) - self.first_count
        return Run(tokens, self.first - self.start, self.last - self.first, after_first, stats, memory.peak_bytes())


class Runners:
    """Holds the loaded models and one mlxspec Engine per drafter, built on the same weights."""

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None = None,
        peer_target: LoadedModel | None = None,
        peer_draft: LoadedModel | None = None,
        settings: DecodeSettings | None = None,
    ):
        self.target, self.draft = target, draft
        self.settings = settings or DecodeSettings.from_env()  # as Engine.load reads them: once, for every engine
        self.peer_model = (peer_target or target).model  # mlx-lm's copy: unmodified when mlxspec swaps kernels
        self.peer_draft = (peer_draft or draft).model if draft is not None else None
        self.engines: dict[str, Engine] = {}
        self.eos = set(target.tokenizer.eos_token_ids)

    def engine(self, drafter: str) -> Engine:
        if drafter not in self.engines:
            self.engines[drafter] = self._build(drafter)
        return self.engines[drafter]

    def _build(self, drafter: str) -> Engine:
        draft = self.draft if drafter.startswith("draft-model") else None
        kind, arg = parse_drafter(drafter)
        built = make_drafter(drafter, self.target.model, draft.model if draft else None,
                             compiled=self.settings.compile_steps(), target_file=self.target.path,
                             source=drafter_source(kind, arg) if kind in SOURCED and arg else None)
        return Engine(self.target, built, draft, settings=self.settings)

    def run(self, config: Config, ids: list[int], max_tokens: int, cold: bool = True) -> Run:
        memory.reset_peak()
        if config.runner == ENGINE:
            return self._run_engine(config, ids, max_tokens, cold)
        # The peers run their own copies of the models: mlxspec's kernels are installed per model,
        # so these run mlx-lm's own ops throughout.
        if config.runner == MLX_LM:
            return self._run_mlx_lm(ids, max_tokens)
        if config.runner == MLX_LM_SPECULATIVE:
            return self._run_mlx_lm_speculative(config.k, ids, max_tokens)
        raise ValueError(f"unknown runner {config.runner!r}")

    def _run_engine(self, config: Config, ids: list[int], max_tokens: int, cold: bool) -> Run:
        engine = self.engine(config.drafter if config.speculative else "none")
        if cold:
            forget_prefix(engine)
        engine.drafter.forget()  # no run drafts from an earlier run's answer (lookup's memory)
        opts = GenerateOptions(max_tokens=max_tokens, draft_length=config.k, adaptive=config.adaptive)
        clock, tokens, stats = Clock(), [], None
        for event in engine.generate(ids, opts):
            clock.emitted(len(event.tokens))
            tokens += event.tokens
            stats = event.stats or stats
        return clock.finish(tokens, stats)

    def _run_mlx_lm(self, ids: list[int], max_tokens: int) -> Run:
        gen = importlib.import_module("mlx_lm.generate")
        stats = Stats(drafter="mlx-lm", prompt_tokens=len(ids))
        clock, tokens = Clock(), []
        for token, _ in gen.generate_step(mx.array(ids, dtype=mx.uint32), self.peer_model, max_tokens=max_tokens):
            token = int(token)
            stats.record_round(0, 0)
            if token in self.eos:
                break
            clock.emitted(1)
            tokens.append(token)
        stats.generated_tokens = len(tokens)
        return clock.finish(tokens, stats)

    def _run_mlx_lm_speculative(self, k: int, ids: list[int], max_tokens: int) -> Run:
        """mlx-lm's speculative decoding; its rounds are rebuilt from the from_draft flags."""
        gen = importlib.import_module("mlx_lm.generate")
        stats = Stats(drafter="mlx-lm draft-model", draft_length=k, prompt_tokens=len(ids))
        clock, tokens, kept, round_start = Clock(), [], 0, 0
        steps = gen.speculative_generate_step(
            mx.array(ids, dtype=mx.uint32), self.peer_model, self.peer_draft,
            num_draft_tokens=k, max_tokens=max_tokens,
        )
        for token, _, from_draft in steps:
            token = int(token)
            done = token in self.eos
            kept += bool(from_draft)
            if not from_draft or done:  # a round ends with the target's own token (or at EOS)
                stats.record_round(min(k, max_tokens - round_start), kept)
                kept, round_start = 0, len(tokens) + 1
            if done:
                break
            clock.emitted(1)
            tokens.append(token)
        if kept:  # max_tokens cut the last round after its accepted drafts
            stats.record_round(min(k, max_tokens - round_start), kept)
        stats.generated_tokens = len(tokens)
        return clock.finish(tokens, stats)


def forget_prefix(engine: Engine) -> None:
    """Drop the KV prefixes the engine and its drafter keep between requests (a cold start)."""
    for owner in (engine, engine.drafter):
        kv = getattr(owner, "kv", None)
        if kv is not None and hasattr(kv, "tokens"):
            kv.tokens = None  # PrefixCache rebuilds a cache whose tokens are unknown
