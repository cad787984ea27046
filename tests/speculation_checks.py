"""Checks several test files share: greedy speculation must give plain decoding's tokens."""

from __future__ import annotations

from mlxspec.options import GenerateOptions


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
