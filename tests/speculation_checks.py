"""Checks several test files share: greedy speculation must give plain decoding's tokens; and a layer that breaks
row invariance on purpose, to see the checks catch it."""

from __future__ import annotations

import mlx.nn as nn

from mlxspec.options import GenerateOptions


class RowCountDependent(nn.Module):
    """A layer whose arithmetic changes with the number of rows, as MLX's GPU matmuls do: from 3 rows on its
    results are scaled by `factor`."""

    def __init__(self, inner: nn.Module, factor: float = 1 + 1e-3):
        super().__init__()
        self.inner, self.factor = inner, factor

    def __call__(self, x):
        y = self.inner(x)
        return y * self.factor if x.shape[-2] > 2 else y  # 3 rows and more: other bits


def assert_drafts_keep_plain_tokens(plain, drafted, prompts: list[str], max_tokens: int, lengths=(1, 3)) -> None:
    """Greedy decoding with `drafted` at each fixed draft length gives `plain`'s tokens, having drafted some,
    and its statistics say the run was exact."""
    options = dict(max_tokens=max_tokens, temperature=0)
    for k in lengths:
        for prompt in prompts:
            want = [t for e in plain.generate(prompt, GenerateOptions(**options)) for t in e.tokens]
            events = list(drafted.generate(prompt, GenerateOptions(draft_length=k, adaptive=False, **options)))
            assert [t for e in events for t in e.tokens] == want, (k, prompt)
            assert events[-1].stats.drafted > 0 and events[-1].stats.exact
