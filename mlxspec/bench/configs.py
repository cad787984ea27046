"""What a benchmark compares: configurations of mlxspec's engine and mlx-lm's own decoders.

Every configuration decodes the same prompts with the same target. `plain` (mlxspec with nothing
drafted) is the baseline every speedup is a ratio to, measured in the same run.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..drafters import parse_drafter
from ..errors import MlxspecError

ENGINE, MLX_LM, MLX_LM_SPECULATIVE = "mlxspec", "mlx-lm", "mlx-lm-speculative"
DRAFTER_KINDS = ("lookup", "early-exit", "draft-model", "medusa", "eagle", "eagle3", "mtp")
PLAIN = "plain"


@dataclass(frozen=True)
class Config:
    label: str  # unique, shown in the table and chart
    runner: str  # ENGINE, MLX_LM or MLX_LM_SPECULATIVE
    drafter: str = "none"  # for ENGINE: none, lookup, early-exit[:N], draft-model, medusa:NAME, eagle:NAME, eagle3:SOURCE, mtp[:SOURCE]
    k: int = 0  # draft length (the maximum, when adaptive)
    adaptive: bool = False

    @property
    def speculative(self) -> bool:
        return self.k > 0


def parse_csv(text: str | None, what: str) -> list[str]:
    items = [t.strip() for t in (text or "").split(",") if t.strip()]
    if not items:
        raise MlxspecError(f"{what}: give a comma-separated list, e.g. {what}=1,2,4")
    return items


def parse_draft_lengths(text: str) -> list[int]:
    out = []
    for item in parse_csv(text, "--draft-lengths"):
        if not item.isdigit() or not 1 <= int(item) <= 32:
            raise MlxspecError(f"--draft-lengths: {item!r} is not a draft length in 1..32")
        out.append(int(item))
    return sorted(set(out))


def parse_drafters(text: str | None, has_draft: bool) -> list[str]:
    """'lookup,early-exit:12' -> validated names.

    Default: lookup, and draft-model when a draft is given. Early exit is asked for by name: on
    MLX's CPU backend its rounds cost several plain steps (a deep draft plus a k+1-row verify), so
    it would take most of a default run's minutes to show a slowdown the adaptive mode avoids.
    """
    if text is None:
        return ["lookup"] + (["draft-model"] if has_draft else [])
    names = parse_csv(text, "--drafters")
    for name in names:
        try:
            kind, _ = parse_drafter(name)
        except MlxspecError as e:
            raise MlxspecError(f"--drafters: {e}") from None
        if kind not in DRAFTER_KINDS:  # 'none' is the plain row every run has
            raise MlxspecError(f"--drafters: {name!r} is the plain row every run has; use {', '.join(DRAFTER_KINDS)}")
    if "draft-model" in names and not has_draft:
        raise MlxspecError("--drafters draft-model needs a draft model: add --draft REF")
    return list(dict.fromkeys(names))


def build_configs(drafters: list[str], draft_lengths: list[int], *, peers: bool = True,
                  adaptive: bool = True) -> list[Config]:
    """plain, then per drafter each fixed k and adaptive (k up to the largest), then the peers."""
    configs = [Config(PLAIN, ENGINE)]
    for d in drafters:
        configs += [Config(f"{d} k={k}", ENGINE, d, k) for k in draft_lengths]
        if adaptive:
            configs.append(Config(f"{d} adaptive", ENGINE, d, max(draft_lengths), adaptive=True))
    if peers:
        configs.append(Config("mlx-lm generate", MLX_LM))
        if "draft-model" in drafters:
            configs += [Config(f"mlx-lm speculative k={k}", MLX_LM_SPECULATIVE, "draft-model", k)
                        for k in draft_lengths]
    return configs
