"""The engine: a target model, a drafter, and `generate()` streaming events with statistics.

    engine = Engine.load("path/or/repo-or.gguf", draft="small-model", quantize="q4")
    for event in engine.generate("Once upon a time", GenerateOptions(max_tokens=64)):
        print(event.text, end="")
    print(event.stats.summary())          # the last event has done=True and the statistics

The engine knows nothing of HTTP or terminals. Weights load once; any number of requests follow,
one at a time (a lock serialises them). Stopping the generator early (close, break, cancel flag)
leaves the engine ready for the next request: per-request state (KV caches) lives in the loop.
"""

from __future__ import annotations

import os
import threading
from typing import Iterator

import mlx.core as mx

from . import loading
from .adaptive import CostModel
from .cache import speculable, store_kv_in_half
from .prefix_cache import PrefixCache
from .constraints import Constraint, format_grammar, grammar_tokenizer
from .decode import Decoder
from .drafters import SOURCED, Drafter, FeatureTap, NoDrafter, check_compatible, make_drafter, parse_drafter
from .drafters.ngram_memory import lookup_memory_setting
from .emit import Event  # noqa: F401  (streamed by generate; the server imports it from here)
from .errors import MlxspecError, PromptError
from .exactness import RowInvariance
from .features import logits_size, vocabulary_size
from .kernels import registry
from .kernels.cpu import ACTIVATION_SETTINGS
from .loading import LoadedModel
from .logprobs import token_bytes
from .options import GenerateOptions
from .settings import DecodeSettings

KERNEL_ENV = {"1": True, "0": False, "ops": "ops", "exact": "exact"}  # MLXSPEC_KERNELS -> the setting
KERNEL_SETTINGS = tuple(KERNEL_ENV.values())  # Engine.load(kernels=...)
from .stats import Stats
from .step_graph import StepGraphs
from .tree import chain_pass, target_takes_trees, tree_sizes

GPU_TREE_WIDTH = 3  # a draft tree's candidates per depth on GPUs by default (the adaptive controller may use fewer)

DEFAULT_DRAFT_LENGTH = 4


class Engine:
    def __init__(
        self,
        target: LoadedModel,
        drafter: Drafter | None = None,
        draft: LoadedModel | None = None,
        draft_length: int = DEFAULT_DRAFT_LENGTH,
        settings: DecodeSettings | None = None,
    ):
        self.target = target
        self.draft = draft
        self.drafter = drafter or NoDrafter()
        self.draft_length = draft_length if not isinstance(self.drafter, NoDrafter) else 0
        self._lock = threading.Lock()
        self.costs = CostModel()  # what rounds cost on this machine: learned once, kept across requests
        self.tree_costs: dict[int, CostModel] = {}  # the same for tree rounds, per width
        self.kv = PrefixCache(target.model)  # the last request's KV cache: a shared prefix is reused
        self._token_bytes = None  # token id -> bytes, built on first use
        self.kernels: dict = {"disabled": "not requested"}  # what use_kernels did (for doctor / show)
        self.settings = settings or DecodeSettings.from_env()  # read once, here: the MLXSPEC_* variables
        # decoding passes through compiled graphs (kernels are installed by now: the graphs capture them)
        self.steps = StepGraphs(target.model, enabled=self.settings.compile_steps())
        # is speculation exact here? per row count, through the passes decoding runs: tree passes too where
        # tree rounds may run, built as tree rounds build them (compiled on GPUs, the CPU's fused blocks eagerly)
        self.takes_trees = trees = self.drafter.trees and target_takes_trees(target.model)  # once: a request asks this
        self.rows = RowInvariance(target.model, forward=self.steps if self.steps.off is None else None,
                                  trees=chain_pass(target.model, self.steps) if trees else None)
        # candidates per draft depth when a request does not say (options.draft_width): > 1 verifies trees. On a
        # GPU, where a pass's extra rows cost little, the adaptive controller may try trees of GPU_TREE_WIDTH and
        # keeps them only where they time faster; on the CPU (a row ~16% of a step) chains
        self.draft_width = GPU_TREE_WIDTH if trees and registry.device_backend_name() != "cpu" else 1
        self.speculable = speculable(target.model)  # can every layer undo rejected drafts? else plain
        self.exact: bool | None = None  # for the last request: its verify rows equal one-row steps
        self._grammar_tokenizer = None  # llguidance's view of the tokenizer (structured output)
        # Ids a prompt may hold: rows of the embedding table (the draft model's too, if smaller).
        self.vocab_size = min(vocabulary_size(m.model) for m in (target, draft) if m is not None)

    @classmethod
    def load(
        cls,
        target: str,
        *,
        draft: str | None = None,
        drafter: str | None = None,
        quantize: str | None = None,
        draft_quantize: str | None = None,
        draft_length: int = DEFAULT_DRAFT_LENGTH,
        min_confidence: float | None = None,
        progress=None,
        kernels: bool | str | None = None,
        ollama=None,
        kv_cache: str | None = None,
        activations: str | None = None,
        lookup_memory: int | None = None,
        context: int | None = None,
    ) -> "Engine":
        """Load a target and its drafter, one of DRAFTERS ('draft-model' needs `draft`; 'mtp:SOURCE' and
        'eagle3:SOURCE' read their weights from a path or a repo id, fetched here: loading.drafter_source).

        A draft whose tokenizer differs from the target's raises IncompatibleDraftError here,
        before any generation. `progress`: a tqdm class for repo downloads. `min_confidence` > 0
        makes a draft model, an EAGLE head or the mtp block stop a proposal after a token it gives less
        than that probability (one extra host read-back per draft step); None: 0 (off), but mtp's
        drafters.MTP_MIN_CONFIDENCE (llama.cpp's recommended p-min for MTP heads). `kernels`: use mlxspec's verify-path kernels where
        they pass their self-check on this device (mlxspec.kernels.install_timed); None reads
        MLXSPEC_KERNELS (0 = off; "ops" = the per-op kernels without fused layers; "exact" = keep
        them on a GPU even where they cost more than install_timed's budget: exactness over speed),
        the one place that setting is read. `ollama`: the OllamaStore
        `ollama:NAME[:TAG]` references are read from (None: OLLAMA_MODELS, read in loading.load).
        `kv_cache`: how a GGUF model's float32 keys and values are stored, 'f16' (default, as llama.cpp:
        on the CPU, and on a GPU where mlxspec's attention kernel stays, `gpu_attention_kept`) or 'f32';
        None reads MLXSPEC_KV_CACHE_TYPE, here only.
        `activations`: what the CPU matmuls multiply 4/8-bit weights by: 'f32', or 'q8' (each 32 values
        rounded to int8, integer dot products: llama.cpp's arithmetic); 'auto' (default) is q8 for GGUF
        models where the CPU has int8 dot products (AVX-512 VNNI), else f32; None reads
        MLXSPEC_ACTIVATIONS, here only. Either way speculation keeps plain decoding's tokens.
        `lookup_memory`: output tokens of earlier requests the lookup drafter remembers (n-gram
        counts in memory, drafts/ngram_memory.py; 0 = none); None reads MLXSPEC_LOOKUP_MEMORY, here
        only (default 100000). `context`: the context window to load for (Ollama's num_ctx at load time; a
        Modelfile's PARAMETER num_ctx): a GGUF with LongRoPE factors (Phi-3/4) takes its long factors
        past its original context and its short ones within it, as llama.cpp does (gguf_rope.py);
        None: the short ones. Other models ignore it.
        """
        if kernels is None:
            env = os.environ.get("MLXSPEC_KERNELS", "1")
            if env not in KERNEL_ENV:
                raise MlxspecError(f"MLXSPEC_KERNELS={env!r}: use 1 (on, the default), 0 (off), ops or exact")
            kernels = KERNEL_ENV[env]
        if kernels not in KERNEL_SETTINGS:
            raise MlxspecError(f"unknown kernels setting {kernels!r} (True, False, 'ops' or 'exact')")
        kv_cache = kv_cache or os.environ.get("MLXSPEC_KV_CACHE_TYPE") or "f16"
        activations = activations or os.environ.get("MLXSPEC_ACTIVATIONS") or "auto"
        if activations not in ACTIVATION_SETTINGS:
            raise MlxspecError(f"unknown activations {activations!r} (one of {', '.join(ACTIVATION_SETTINGS)})")
        lookup_memory = lookup_memory_setting(os.environ) if lookup_memory is None else lookup_memory
        if lookup_memory < 0:
            raise MlxspecError(f"lookup_memory must be 0 or more tokens, not {lookup_memory}")
        drafter = drafter or ("draft-model" if draft else "none")
        kind, arg = parse_drafter(drafter)
        if (kind == "draft-model") != bool(draft):
            raise MlxspecError("a draft model goes with the draft-model drafter, and it needs one")
        tgt = loading.load(target, quantize, progress, ollama, kv_cache, context)
        dft = None
        if kind == "draft-model":
            same = draft == target and (draft_quantize or None) == (quantize or None)
            dft = tgt if same else loading.load(draft, draft_quantize, progress, ollama, kv_cache, context)  # one copy when identical
            check_compatible(tgt.tokenizer, dft.tokenizer)
        settings = DecodeSettings.from_env()  # read once, here: the MLXSPEC_* variables
        kernel_report = (_use_kernels(tgt, dft, fuse=kernels != "ops", activations=activations,
                                      timed=kernels != "exact", compiled=settings.compile_steps())
                         if kernels else {"disabled": "kernels off"})
        if kv_cache == "f16" and gpu_attention_kept(kernel_report):
            for m in {id(m): m for m in (tgt, dft) if m is not None and loading.is_gguf(m)}.values():
                store_kv_in_half(m.model)
        for m in {id(m): m for m in (tgt, dft) if m is not None}.values():
            m.info = loading.model_info(m)  # as installed: layers widened to 8 bits hold more bytes
        # Drafters are built after the swap: an early-exit view copies the target's module tree.
        source = loading.drafter_source(kind, arg, progress, ollama) if kind in SOURCED and arg else None
        built = make_drafter(drafter, tgt.model, dft.model if dft else None, min_confidence, lookup_memory,
                             compiled=settings.compile_steps(), target_file=tgt.path, source=source)
        if kernels:
            from .kernels import install_kernels

            act = _activations_run(kernel_report)  # as the target runs
            for i, module in enumerate(built.kernel_modules()):  # a learned drafter's own layers
                kernel_report[f"drafter{i}"] = install_kernels(module, fuse=kernels != "ops", activations=act)
        engine = cls(tgt, built, dft, draft_length, settings)
        engine.kernels = kernel_report
        k = engine.draft_length  # measured now, not inside the first request
        if engine.speculable:  # (a cache that cannot undo rows cannot be rewound for the check either)
            engine.rows.holds(k + 1, tree_sizes(k, engine.draft_width) if built.trees else ())
        return engine

    # -- facts -------------------------------------------------------------------------------

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def context_length(self) -> int:
        return int(self.target.info["context_length"])

    @property
    def window_note(self) -> str:
        """What a prompt past the window can do about it, where the model says (gguf_rope.py)."""
        longrope = self.target.config.get("longrope") or {}
        if longrope.get("factors") != "short":
            return ""
        return (f" (this model's original context; PARAMETER num_ctx up to {longrope['trained_context_length']} "
                "in a Modelfile loads its long one)")

    @property
    def info(self) -> dict:
        return {
            "target": self.target.reference,
            "draft": self.draft.reference if self.draft else None,
            "drafter": self.drafter.name,
            "draft_length": self.draft_length,
            **self.target.info,
            "draft_weight_bytes": self.draft.info["weight_bytes"] if self.draft and self.draft is not self.target else 0,
            "activations": _activations_run(self.kernels),
            "compiled_steps": "on" if self.steps.off is None else self.steps.off,
            **({} if self.speculable else {"speculation": "off: a layer's cache cannot undo rejected drafts"}),
        }

    # -- prompts -----------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def token_bytes(self, token: int) -> bytes:
        """A token's bytes (logprobs show them: a piece may end mid-character)."""
        if self._token_bytes is None:
            self._token_bytes = token_bytes(self.tokenizer)
        return self._token_bytes(token)

    def chat_prompt(self, messages: list[dict], chat_template: str | None = None, *, prefill: bool | None = None,
                    **template_kwargs) -> list[int]:
        """Token ids of a chat, rendered with the model's own chat template (or `chat_template`, Jinja).
        A chat ending with an assistant message is continued (`prefill`; None: decided by `continues`)."""
        if chat_template is not None:
            template_kwargs["chat_template"] = chat_template
        elif not getattr(self.tokenizer, "has_chat_template", False):
            raise MlxspecError("this model has no chat template")
        prefill = continues(messages) if prefill is None else prefill
        turn = {"continue_final_message": True, "add_generation_prompt": False} if prefill else {"add_generation_prompt": True}
        try:
            return list(self.tokenizer.apply_chat_template(messages, **turn, **template_kwargs))
        except ValueError as e:  # HF's check that the template shows the message it is to continue
            if prefill and "continue_final_message" in str(e):
                raise PromptError("the chat template does not show the final assistant message as it was "
                                  "given, so the model cannot continue it") from None
            raise

    # -- generation --------------------------------------------------------------------------

    def generate(
        self,
        prompt: str | list[int],
        options: GenerateOptions | None = None,
        *,
        cancel: threading.Event | None = None,
        format: str | dict | None = None,
        tap: FeatureTap | None = None,
    ) -> Iterator[Event]:
        """Stream Events; the last one has done=True, the finish reason and the statistics.
        `format`: "json" or a JSON schema; the output follows it (constraints.py; FormatError if invalid).
        `tap`: plain decoding that hands the target's hidden states to `tap` (heads/record.py)."""
        options = options or GenerateOptions()
        constraint = Constraint(self.grammar_tokenizer(), format_grammar(format)) if format else None
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.check_ids(ids)
        k = self.draft_length if options.draft_length is None else options.draft_length
        k = 0 if isinstance(self.drafter, NoDrafter) or tap is not None or not self.speculable else k  # plain rounds
        drafter = self.drafter if k > 0 else (tap or NoDrafter())
        with self._lock:
            # Verify passes run up to k+1 rows: exact only if each equals a one-row step (checked once per M).
            width = options.draft_width or (self.draft_width if options.adaptive else 1)  # fixed rounds: as asked
            self.exact = self.rows.holds(k + 1, tree_sizes(k, width) if drafter.trees else ())
            stats = Stats(drafter=drafter.name, draft_length=k if k > 0 else 0, exact=self.exact)
            decoder = Decoder(
                self.target.model,
                drafter,
                ids,
                options,
                draft_length=k,
                eos_ids=set(self.tokenizer.eos_token_ids),
                context_length=self.context_length,
                stats=stats,
                cancel=cancel,
                adaptive=options.adaptive,
                costs=self.costs,
                width=width,
                tree_costs=self.tree_costs,
                kv=self.kv,
                settings=self.settings,
                steps=self.steps,
                window_note=self.window_note,
                detokenizer=self.tokenizer.detokenizer,
                constraint=constraint,
                takes_trees=self.takes_trees,
            )
            try:
                yield from decoder
            finally:
                drafter.finish()

    def grammar_tokenizer(self):
        """llguidance's tokenizer for this model's vocabulary (built on first use, about a second)."""
        if self._grammar_tokenizer is None:
            model = self.target.model
            self._grammar_tokenizer = grammar_tokenizer(self.tokenizer._tokenizer, logits_size(model),
                                                        self.tokenizer.eos_token_ids)
        return self._grammar_tokenizer

    def check_ids(self, ids: list[int]) -> None:
        """An id past the embedding table would read outside it (a crash, not an error): refuse it."""
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise PromptError(f"prompt token id {bad} is outside the model's vocabulary: "
                              f"ids are 0..{self.vocab_size - 1} (vocabulary size {self.vocab_size})")


def continues(messages: list[dict]) -> bool:
    """Does the chat end with the assistant's words to continue (a "prefill"), as Ollama's renderers
    decide: the last message is the assistant's. One that only called tools waits for their results instead."""
    last = messages[-1] if messages else {}
    return last.get("role") == "assistant" and not last.get("tool_calls")


def resolve_activations(setting: str, model: LoadedModel) -> str:
    """'auto' -> 'q8' for a GGUF model where the CPU kernels multiply int8 on VNNI (llama.cpp runs
    those files with int8 activations too), and for any model with mxfp4 layers there (gpt-oss: the
    CPU kernel runs them with int8 activations only; MLX's CPU op is 20-140x slower), else 'f32';
    'f32'/'q8' as given."""
    if setting != "auto":
        return setting
    from .kernels.cpu import q8_fast

    gguf = "gguf_conversion" in model.config  # a .gguf file or an Ollama blob (gguf.load_gguf)
    mxfp4 = any(getattr(m, "mode", None) == "mxfp4" for _, m in model.model.named_modules())
    return "q8" if (gguf or mxfp4) and mx.default_device() == mx.cpu and q8_fast() else "f32"


def _activations_run(kernel_report: dict) -> str:
    """What the target's matmuls multiply by, from its kernel report ('f32' with kernels off)."""
    return kernel_report.get("target", {}).get("layers", {}).get("activations", "f32")


def gpu_attention_kept(report: dict) -> bool:
    """Does the target run mlxspec's attention kernel on a GPU for good: attention routed, and the
    kernels kept (within the timing budget, or kernels='exact')? Then a GGUF model's float32 keys and
    values can be stored as float16: the GPU kernels read float32 queries over a float16 cache exactly,
    so each step reads half the cache bytes. (On the CPU, loading.load decides at load time.)"""
    target = report.get("target") or {}
    timed = target.get("timed")
    kept = timed.get("kept", False) if isinstance(timed, dict) else True  # a str: kernels='exact', not timed
    return target.get("backend", "cpu") != "cpu" and bool((target.get("attention") or {}).get("routed")) and kept


def _use_kernels(target: LoadedModel, draft: LoadedModel | None, fuse: bool = True, activations: str = "f32",
                 timed: bool = True, compiled: bool = False) -> dict:
    """Install mlxspec's kernels in each model where they passed their self-check on this device.

    A kernel that cannot build or disagrees with its reference is reported (one warning) and MLX's
    own op stays: the reference defines the result, kernels only make it faster. timed=False keeps
    the target's kernels on a GPU whatever they cost (kernels="exact"). compiled: decoding will run
    compiled step graphs, so the timing does too (the Python of building a step is not part of it).
    """
    from .kernels import install_kernels
    from .kernels.install import install_timed

    act = resolve_activations(activations, target)
    steps = StepGraphs if compiled else None
    report = {"target": install_timed(target.model, fuse=fuse, activations=act, steps=steps) if timed
              else install_kernels(target.model, fuse=fuse, activations=act) | {"timed": "not timed: kernels='exact'"}}
    if draft is not None and draft is not target:  # the draft's bits never reach the output
        report["draft"] = install_kernels(draft.model, fuse=fuse, activations=resolve_activations(activations, draft))
    return report
