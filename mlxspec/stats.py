"""Statistics of one generation: one object, reported everywhere (API, daemon, CLI, bench)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Stats:
    drafter: str = "none"
    draft_length: int = 0  # k at the end of the run (adaptive drafters change it)
    rounds: int = 0  # draft/verify rounds == target forward passes after the prompt
    drafted: int = 0  # tokens proposed by the drafter
    accepted: int = 0  # drafted tokens the target kept
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: rounds where draft i was kept
    drafted_per_position: list[int] = field(default_factory=list)  # [i]: rounds that drafted position i
    host_syncs: int = 0  # host read-backs during decoding (one per round by design)
    backoffs: int = 0  # times adaptive speculation fell back to plain decoding for losing time
    tree_rounds: int = 0  # of the rounds, those that verified a draft tree (draft_width > 1: tree.py)
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV came from the previous request (shared prefix)
    generated_tokens: int = 0  # tokens emitted to the caller
    prompt_time: float = 0.0  # seconds: prompt processing (prefill) of target and drafter
    decode_time: float = 0.0  # seconds: from the end of prefill to the last token
    exact: bool | None = None  # verify rows equal one-row steps on this device (greedy = plain); None: unknown
    trees: str | None = None  # a request that asked for draft_width > 1 but ran chains: why (tree.tree_refusal)

    @property
    def target_passes(self) -> int:
        return self.rounds

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens produced per target pass (accepted drafts + the target's own token)."""
        return self.generated_tokens / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.decode_time if self.decode_time > 0 else 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_time if self.prompt_time > 0 else 0.0

    def record_round(self, drafted: int, accepted: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        for per_pos, count in ((self.drafted_per_position, drafted), (self.accepted_per_position, accepted)):
            if len(per_pos) < count:
                per_pos.extend([0] * (count - len(per_pos)))
            for i in range(count):
                per_pos[i] += 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            target_passes=self.target_passes,
            acceptance_rate=round(self.acceptance_rate, 4),
            mean_accepted_length=round(self.mean_accepted_length, 4),
            tokens_per_second=round(self.tokens_per_second, 3),
        )
        return d

    def summary(self) -> str:
        """A few human lines, as the CLI prints with --verbose."""
        lines = [
            f"prompt: {self.prompt_tokens} tokens in {self.prompt_time:.3f}s "
            f"({self.prompt_tokens_per_second:.1f} tok/s)",
            f"decode: {self.generated_tokens} tokens in {self.decode_time:.3f}s ({self.tokens_per_second:.1f} tok/s)",
            f"drafter: {self.drafter} (k={self.draft_length}), target passes: {self.rounds}, "
            f"tokens per pass: {self.mean_accepted_length:.2f}",
            f"drafted: {self.drafted}, accepted: {self.accepted} ({100 * self.acceptance_rate:.1f}%)"
            + (f", tree rounds: {self.tree_rounds}" if self.tree_rounds else "")
            + (f", trees: {self.trees}" if self.trees else ""),
            f"exact: {'unknown' if self.exact is None else 'yes' if self.exact else 'no'}",
        ]
        if self.drafted_per_position:
            per_pos = " ".join(
                f"{a}/{d}" for a, d in zip(self.accepted_per_position + [0] * 64, self.drafted_per_position)
            )
            lines.append(f"accepted per draft position: {per_pos}")
        return "\n".join(lines)
