"""Drafters: everything that can guess the target's next tokens behind one `propose` interface."""

from pathlib import Path

from ..heads.gemma4_assistant import is_assistant
from .assistant import AssistantDrafter
from .base import Draft, Drafter, FeatureTap, NoDrafter
from .eagle import MTP_MIN_CONFIDENCE, Eagle3Drafter, EagleDrafter, MtpDrafter
from .lookup import LookupDrafter
from .medusa import MedusaDrafter
from .ngram_memory import NgramMemory
from .model import ModelDrafter, check_compatible
from .selfdraft import EarlyExitDrafter

# Names a user can ask for; early-exit takes a layer count: "early-exit:12" (default: half);
# medusa and eagle take their file: "eagle:NAME" (MLXSPEC_HOME/drafters/NAME.safetensors) or "eagle:PATH".
# mtp: the model's own multi-token-prediction block (Qwen3.5's GGUFs and original checkpoints carry one);
# "mtp:SOURCE" reads it from elsewhere: a checkpoint directory, a drafter folder, a repo id or a GGUF; a Gemma 4
# assistant's folder (model_type gemma4_assistant) makes it that model's own drafter (drafters/assistant.py).
# eagle3:SOURCE: an EAGLE-3 head published for the model (a folder or a repo id).
DRAFTERS = ("none", "draft-model", "lookup", "early-exit", "medusa", "eagle", "eagle3", "mtp")
LEARNED = ("medusa", "eagle")  # drafters trained by `mlxspec train-drafter`, named by their file
SOURCED = ("mtp", "eagle3")  # drafters read from a folder or repo a caller fetches first (loading.drafter_source)


def parse_drafter(spec: str) -> tuple[str, int | str | None]:
    """'lookup' -> ('lookup', None); 'early-exit:12' -> ('early-exit', 12);
    'medusa:NAME' -> ('medusa', 'NAME'), 'eagle:NAME' likewise; 'mtp:SOURCE' -> ('mtp', 'SOURCE'); bad names raise."""
    from ..errors import MlxspecError

    kind, _, arg = spec.partition(":")
    if kind in LEARNED:
        if not arg:
            raise MlxspecError(f"the {kind} drafter needs its file: {kind}:NAME or {kind}:PATH")
        return kind, arg
    if kind == "mtp":
        return kind, arg or None
    if kind == "eagle3":
        if not arg:
            raise MlxspecError("the eagle3 drafter needs its head: eagle3:PATH or eagle3:ORG/REPO")
        return kind, arg
    if kind not in DRAFTERS or (arg and (kind != "early-exit" or not arg.isdigit())):
        raise MlxspecError(f"unknown drafter {spec!r}: use one of {', '.join(DRAFTERS)} "
                           "(early-exit:LAYERS, medusa:NAME, eagle:NAME, eagle3:SOURCE, mtp:SOURCE)")
    return kind, int(arg) if arg else None


def make_drafter(spec: str, target, draft=None, min_confidence: float | None = None, lookup_memory: int | None = None,
                 compiled: bool = False, target_file=None, source=None) -> Drafter:
    """The drafter `spec` names, over these mlx-lm models (`draft` for 'draft-model'); `min_confidence`: a
    draft model's, EAGLE's or mtp's chain stops after a draft it gives less than that probability (None: 0,
    never, but mtp's MTP_MIN_CONFIDENCE); `lookup_memory`:
    output tokens lookup remembers across requests (None: ngram_memory.DEFAULT_TOKENS); `compiled`: a
    draft model's or an EAGLE head's steps run through compiled graphs (step_graph.py); `target_file`:
    the GGUF or directory the target was read from (mtp reads its block there); `source`: the local path
    'mtp:SOURCE' or 'eagle3:SOURCE' resolved to (loading.drafter_source fetches a repo id)."""
    from ..errors import MlxspecError

    kind, arg = parse_drafter(spec)
    if (kind == "draft-model") != (draft is not None):
        raise MlxspecError("a draft model goes with the draft-model drafter, and it needs one")
    if kind == "lookup":
        return LookupDrafter(memory=None if lookup_memory is None else NgramMemory(lookup_memory))
    if kind == "early-exit":
        try:
            return EarlyExitDrafter(target, arg)
        except ValueError as e:
            raise MlxspecError(str(e)) from None
    if kind == "medusa":
        return MedusaDrafter(target, arg)
    if kind == "eagle":
        return EagleDrafter(target, arg, compiled=compiled, min_confidence=min_confidence or 0.0)
    if kind == "mtp":
        if arg is not None and source is None:
            raise MlxspecError(f"the block of {spec!r} was not fetched: resolve its source first (Engine.load does)")
        confidence = MTP_MIN_CONFIDENCE if min_confidence is None else min_confidence
        if source is not None and is_assistant(Path(source)):  # Gemma 4's: its own drafter, over the target's cache
            return AssistantDrafter(target, Path(source), confidence, compiled)
        return MtpDrafter(target, target_file, compiled, confidence, source)
    if kind == "eagle3":
        if source is None:
            raise MlxspecError(f"the head of {spec!r} was not fetched: resolve its source first (Engine.load does)")
        return Eagle3Drafter(target, Path(source), compiled, min_confidence or 0.0)
    if kind == "draft-model":
        return ModelDrafter(draft, min_confidence or 0.0, compiled)
    return NoDrafter()


__all__ = [
    "make_drafter",
    "parse_drafter",
    "DRAFTERS",
    "SOURCED",
    "LEARNED",
    "Draft",
    "Drafter",
    "Eagle3Drafter",
    "EagleDrafter",
    "EarlyExitDrafter",
    "LookupDrafter",
    "MedusaDrafter",
    "MtpDrafter",
    "ModelDrafter",
    "NoDrafter",
    "check_compatible",
]
