"""What the target wrote before: n-gram counts over its earlier answers, for drafting new ones.

A small model repeats itself across requests: stock openings, phrasings, the same identifiers in
an editor's completions. Prompt lookup only sees the current request; this memory keeps, for every
n-gram (n = 1..4) of the target's recent answers, how often each token followed it (llama.cpp's
"dynamic" n-gram cache, examples/lookup). A draft comes from it only when the counts are
confident, since a rejected draft row still costs a verify row:

    n-gram length           1     2     3     4
    times seen, at least    2     2     1     1
    share of the favourite  66%   50%   50%   50%

What it buys (SmolLM2 Q4_1, this CPU, benchmarks/bench_memory.py): a conversation asked again
3.3 tokens per target pass (2.3x plain); an editor asking again after the user accepted 16 tokens
of a completion 3.4 (2.7x, against 1.8 without the memory); a new free-form request after 40
others 1.22 against 1.21: the target's stock phrases rarely outlast the context's own matches.

    memory.remember(answer)           # after a request: its output tokens
    memory.continue_(context, k)      # up to k confident next tokens (maybe none)

Bounded: past `max_tokens` remembered tokens the oldest answers are forgotten (counts taken back
out). ~450 bytes a remembered token in CPython dicts: 100k tokens ~45 MB.
"""

from __future__ import annotations

from collections import deque

from ..errors import MlxspecError

MIN_SEEN = {1: 2, 2: 2, 3: 1, 4: 1}  # n -> times the n-gram was seen before it may draft
MIN_SHARE = {1: 0.66, 2: 0.5, 3: 0.5, 4: 0.5}  # n -> the favourite's share of what followed it
MAX_N = 4
DEFAULT_TOKENS = 100_000  # remembered output tokens (Engine.load's lookup_memory, MLXSPEC_LOOKUP_MEMORY)


def lookup_memory_setting(env) -> int:
    """MLXSPEC_LOOKUP_MEMORY: tokens the lookup drafter remembers (default 100000, 0 = none)."""
    value = env.get("MLXSPEC_LOOKUP_MEMORY", "").strip()
    if not value:
        return DEFAULT_TOKENS
    if not value.isdigit():
        raise MlxspecError(f"MLXSPEC_LOOKUP_MEMORY must be a number of tokens (0 = none), not {value!r}")
    return int(value)


class NgramMemory:
    def __init__(self, max_tokens: int = DEFAULT_TOKENS):
        self.max_tokens = max_tokens
        # n -> {n-gram: {next token: count}}
        self.counts: dict[int, dict[tuple, dict[int, int]]] = {n: {} for n in range(1, MAX_N + 1)}
        self.answers: deque[list[int]] = deque()
        self.tokens = 0  # remembered tokens, over all answers kept

    def remember(self, answer: list[int]) -> None:
        """Count this answer's n-grams (an answer longer than the whole memory keeps its end)."""
        answer = list(answer[-self.max_tokens :]) if self.max_tokens > 0 else []
        if len(answer) < 2:
            return
        self._count(answer, +1)
        self.answers.append(answer)
        self.tokens += len(answer)
        while self.tokens > self.max_tokens:
            old = self.answers.popleft()
            self._count(old, -1)
            self.tokens -= len(old)

    def continue_(self, context: list[int], k: int) -> list[int]:
        """Up to k tokens after `context`, each the confident favourite after the longest n-gram
        that has one (drafting stops at the first position with none)."""
        out: list[int] = []
        tail = list(context[-MAX_N:])
        while len(out) < k:
            token = self._favourite(tail)
            if token is None:
                break
            out.append(token)
            tail = (tail + [token])[-MAX_N:]
        return out

    def clear(self) -> None:
        self.__init__(self.max_tokens)

    def _favourite(self, tail: list[int]) -> int | None:
        for n in range(min(MAX_N, len(tail)), 0, -1):
            followers = self.counts[n].get(tuple(tail[-n:]))
            if not followers:
                continue
            token, count = max(followers.items(), key=lambda item: (item[1], -item[0]))  # ties: lowest id
            seen = sum(followers.values())
            if seen >= MIN_SEEN[n] and count >= MIN_SHARE[n] * seen:
                return token
        return None

    def _count(self, seq: list[int], sign: int) -> None:
        for n, table in self.counts.items():
            for i in range(n, len(seq)):
                key = tuple(seq[i - n : i])
                followers = table.setdefault(key, {})
                count = followers.get(seq[i], 0) + sign
                if count > 0:
                    followers[seq[i]] = count
                else:
                    followers.pop(seq[i], None)
                    if not followers:
                        del table[key]
