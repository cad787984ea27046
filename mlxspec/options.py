"""Generation options: one validated dataclass shared by the engine, the daemon and the CLI.

Names follow Ollama's `options` (Modelfile PARAMETER names) so the daemon can pass a request's
options straight through; `from_dict` turns a caller's mistake into an `OptionsError` (HTTP 400).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from .errors import MlxspecError

MAX_TOP_LOGPROBS = 20  # alternatives per token, as Ollama allows
MAX_DRAFT_LENGTH = 32  # a chain verifies at most 33 rows (kernels.passes.DECODE_ROWS bounds every decoding pass)


# Below this temperature logits / T overflow float32 (1e-39 is flushed to 0: 0/0 = NaN, then token 0
# forever); the distribution is one-hot long before, so such temperatures are greedy decoding.
MIN_TEMPERATURE = 1e-3
# repeat_penalty divides logits (in the model's dtype, float16 included): 0.01 scales them by 100 at
# most, which stays finite; smaller values overflow to inf/NaN and are refused.
MIN_REPEAT_PENALTY = 0.01


def context_window(num_ctx: int | None, model_context: int) -> int:
    """The tokens a request may hold, prompt and answer: num_ctx where given, never past the model's context."""
    return min(num_ctx or model_context, model_context)


class OptionsError(MlxspecError, ValueError):
    """A caller's invalid option: the message names the option and what is allowed (`option`: our field)."""

    def __init__(self, message: str, option: str | None = None):
        super().__init__(message)
        self.option = option


@dataclass
class GenerateOptions:
    max_tokens: int = 256  # Ollama's num_predict; -1 means until EOS or the context is full
    temperature: float = 0.0  # 0 = greedy (argmax), exact token for token
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    seed: int | None = None  # reproducible sampling when set
    stop: list[str] = field(default_factory=list)
    repeat_penalty: float = 1.0  # 1 = off
    repeat_last_n: int = 64
    num_ctx: int | None = None  # context window; None = the model's own
    # a prompt past the context window (/api/generate, truncate on) keeps its first num_keep tokens (and a BOS),
    # then its tail: Ollama's context shift (-1: as many from the start as fit)
    num_keep: int = 4
    draft_length: int | None = None  # tokens drafted per round; 0 = no speculation; None = engine default
    adaptive: bool = True  # adapt the draft length and back off to plain decoding when it does not pay
    # candidates per draft depth: > 1 verifies a tree of drafts (greedy, a drafter that drafts trees, a target
    # whose tree passes run: tree.target_takes_trees); None = the engine's default
    draft_width: int | None = None
    # log-probabilities of the emitted tokens (Event.logprobs), each with this many most likely
    # alternatives (0..20); None = none (Ollama's logprobs + top_logprobs, OpenAI's)
    logprobs: int | None = None

    def __post_init__(self) -> None:
        self.validate()
        if self.temperature < MIN_TEMPERATURE:
            self.temperature = 0.0  # greedy: see MIN_TEMPERATURE

    def validate(self) -> None:
        def check(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise OptionsError(f"invalid option {name}={shown(getattr(self, name))}: {what}", name)

        check(_is_int(self.max_tokens) and self.max_tokens >= -1, "max_tokens", "must be an integer >= -1")
        check(_is_num(self.temperature) and 0 <= self.temperature <= 100, "temperature", "must be a number in [0, 100]")
        check(_is_int(self.top_k) and self.top_k >= 0, "top_k", "must be an integer >= 0")
        check(_is_num(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be a number in (0, 1]")
        check(_is_num(self.min_p) and 0 <= self.min_p < 1, "min_p", "must be a number in [0, 1)")
        check(self.seed is None or _is_int(self.seed) and 0 <= self.seed < 2**64, "seed", "must be an integer in [0, 2^64)")
        check(
            isinstance(self.stop, list) and all(isinstance(s, str) and s for s in self.stop),
            "stop",
            "must be a list of non-empty strings",
        )
        check(
            _is_num(self.repeat_penalty) and MIN_REPEAT_PENALTY <= self.repeat_penalty <= 10,
            "repeat_penalty",
            f"must be a number in [{MIN_REPEAT_PENALTY}, 10] (1 = off)",
        )
        check(_is_int(self.repeat_last_n) and self.repeat_last_n >= -1, "repeat_last_n", "must be an integer >= -1")
        check(self.num_ctx is None or (_is_int(self.num_ctx) and self.num_ctx >= 1), "num_ctx", "must be an integer >= 1")
        check(_is_int(self.num_keep) and self.num_keep >= -1, "num_keep", "must be an integer >= -1")
        check(
            self.draft_length is None or (_is_int(self.draft_length) and 0 <= self.draft_length <= MAX_DRAFT_LENGTH),
            "draft_length",
            f"must be an integer in [0, {MAX_DRAFT_LENGTH}]",
        )
        check(isinstance(self.adaptive, bool), "adaptive", "must be true or false")
        check(self.draft_width is None or (_is_int(self.draft_width) and 1 <= self.draft_width <= 8),
              "draft_width", "must be an integer in [1, 8]")
        check(self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_TOP_LOGPROBS), "logprobs",
              f"must be an integer in [0, {MAX_TOP_LOGPROBS}] (alternatives per token)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    # Ollama option name -> our field name, where they differ.
    OLLAMA_NAMES = {"num_predict": "max_tokens", "draft_num_predict": "draft_length"}
    # Ollama runner options we accept and ignore (with their types): they tune llama.cpp, not this engine.
    # Fields a request sets beside its options (APIs' own fields), not options: not in from_dict or Modelfiles.
    REQUEST_FIELDS = ("logprobs",)
    IGNORED = {"num_batch": int, "num_gpu": int, "main_gpu": int, "num_thread": int,
               "use_mmap": bool, "use_mlock": bool, "numa": bool, "low_vram": bool,
               # what the `ollama` client still offers and Ollama's server no longer reads (it ignores them too)
               "mirostat": int, "mirostat_tau": float, "mirostat_eta": float, "tfs_z": float, "penalize_newline": bool,
               "f16_kv": bool, "logits_all": bool, "vocab_only": bool, "embedding_only": bool}
    # Ollama's options this engine does not apply: taken at the value that turns them off (Ollama's default), any
    # other value refused
    OFF_ONLY = {"typical_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}

    @classmethod
    def names(cls) -> dict[str, type]:
        """Every option name `from_dict` accepts (Ollama's, ours, the ignored runner ones) -> int, float,
        bool or list (of strings): what a Modelfile PARAMETER line may set."""
        hints = typing.get_type_hints(cls)
        kinds = {}
        for f in dataclasses.fields(cls):
            if f.name in cls.REQUEST_FIELDS:
                continue
            hint = str(hints[f.name])
            kinds[f.name] = list if "list" in hint else bool if "bool" in hint else float if "float" in hint else int
        for ours, theirs in ((v, k) for k, v in cls.OLLAMA_NAMES.items()):
            kinds[theirs] = kinds[ours]
        return {**kinds, **cls.IGNORED, **dict.fromkeys(cls.OFF_ONLY, float)}

    @classmethod
    def from_dict(cls, options: dict[str, Any] | None, **overrides: Any) -> "GenerateOptions":
        """Build from Ollama-style options; unknown names and wrong types raise OptionsError."""
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise OptionsError("options must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)} - set(cls.REQUEST_FIELDS)
        ints = {name: kind is int for name, kind in cls.names().items()}
        kwargs: dict[str, Any] = {}
        given: dict[str, str] = {}  # our field -> the name the caller used (Ollama's num_predict ...)
        for key, value in {**options, **overrides}.items():
            if key in cls.IGNORED:  # not applied, but still of its type (as Ollama checks them)
                kind = cls.IGNORED[key]
                if value is not None and not _IS_KIND[kind](value):
                    raise OptionsError(f"invalid option {key}={shown(value)}: must be {_KINDS[kind]}", key)
                continue
            if key in cls.OFF_ONLY:
                if value is not None and value != cls.OFF_ONLY[key]:
                    raise OptionsError(f"invalid option {key}={shown(value)}: not supported (only {cls.OFF_ONLY[key]:g}, "
                                       "which turns it off)", key)
                continue
            name = cls.OLLAMA_NAMES.get(key, key)
            if name not in known:
                raise OptionsError(f"unknown option {shown(key)}")
            if value is None and name not in ("seed", "num_ctx", "draft_length"):
                continue
            if name == "seed" and value == -1:
                value = None  # llama.cpp's and Ollama's "random seed"
            if name == "stop" and isinstance(value, str):
                value = [value]
            if _integral_float(value) and ints.get(name):  # JSON has one number type: 4.0 is 4 (as Ollama)
                value = int(value)
            kwargs[name], given[name] = value, key
        try:
            return cls(**kwargs)
        except OptionsError as e:  # named as the caller named it
            key = given.get(e.option or "", e.option)
            if key == e.option:
                raise
            raise OptionsError(str(e).replace(f"option {e.option}=", f"option {key}=", 1), e.option) from None


_KINDS = {bool: "true or false", int: "an integer", float: "a number"}


def shown(value: Any, limit: int = 60) -> str:
    """repr(value) for an error message, cut short: a 4000-digit number or a list of 10,000 stop strings is
    named, not echoed whole."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _integral_float(x: Any) -> bool:
    return isinstance(x, float) and x.is_integer()


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_bool(x: Any) -> bool:
    return isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_integral(x: Any) -> bool:
    return _is_int(x) or _integral_float(x)


_IS_KIND = {bool: _is_bool, int: _is_integral, float: _is_number}


def _is_num(x: Any) -> bool:
    """A finite number; an integer past float's range (JSON's 1 followed by 400 zeros) is not one."""
    if not _is_number(x):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # math.isfinite converts an int to a float first
        return False
