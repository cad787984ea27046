"""Prompt lookup and its memory of earlier answers (drafters/lookup.py, drafters/ngram_memory.py)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlxspec.drafters.lookup import LookupDrafter
from mlxspec.drafters.ngram_memory import NgramMemory
from mlxspec.engine import Engine
from mlxspec.errors import MlxspecError
from mlxspec.options import GenerateOptions
from mlxspec.sampling import Sampling

GREEDY = Sampling(temperature=0.0)
KEY = mx.random.key(0)


def test_memory_continues_a_remembered_answer():
    memory = NgramMemory()
    memory.remember([5, 6, 7, 8, 9, 10, 11])
    assert memory.continue_([1, 5, 6, 7], 3) == [8, 9, 10]  # the 3-gram, then longer ones, seen once
    assert memory.continue_([1, 2, 3, 6, 7, 8, 9, 10], 4) == [11]  # the answer ends: nothing follows 11
    assert memory.continue_([1, 2, 3], 4) == []  # never seen
    assert memory.tokens == 7


def test_memory_drafts_only_when_its_counts_are_confident():
    memory = NgramMemory()
    memory.remember([0, 1, 40, 2, 3])
    assert memory.continue_([9, 40], 1) == []  # a 1-gram seen once is not enough (needs 2)
    memory.remember([7, 40, 2, 8])
    assert memory.continue_([9, 40], 1) == [2]  # seen twice, always followed by 2
    memory.remember([6, 40, 5, 8])
    memory.remember([4, 40, 3, 8])
    assert memory.continue_([9, 40], 1) == []  # 2 leads with 2 of 4: below the 66% a 1-gram needs
    assert memory.continue_([0, 1, 40], 1) == [2]  # a 3-gram seen once is enough


def test_memory_forgets_its_oldest_answers_past_its_size():
    memory = NgramMemory(max_tokens=10)
    memory.remember([1, 2, 3, 4, 5, 6])
    memory.remember([7, 8, 9, 10, 11, 12])
    assert memory.tokens == 6 and len(memory.answers) == 1  # the first answer made room
    assert memory.continue_([2, 3, 4], 2) == [] and memory.continue_([8, 9, 10], 2) == [11, 12]
    memory.remember([20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31])  # longer than the memory: its end
    assert memory.tokens == 10 and memory.continue_([8, 9, 10], 2) == []
    assert all(t >= 22 for table in memory.counts.values() for key in table for t in key)  # only its end
    off = NgramMemory(max_tokens=0)
    off.remember([1, 2, 3, 4])
    assert off.tokens == 0 and not any(off.counts.values())


def test_the_drafter_remembers_outputs_not_prompts():
    drafter = LookupDrafter()
    prompt = [100, 101, 102, 103]
    drafter.start(prompt)
    context = list(prompt)
    drafter.propose(context, 4, GREEDY, KEY)
    context += [7, 8, 9, 10, 11]  # the decoder extends the same list as the answer is written
    drafter.finish()
    assert list(drafter.memory.answers) == [[7, 8, 9, 10, 11]]
    drafter.start([50, 7, 8, 9])  # a new request whose prompt ends as the old answer began
    draft = drafter.propose([50, 7, 8, 9], 3, GREEDY, KEY)
    assert draft.tokens.tolist() == [10, 11]


def test_a_3_token_match_comes_first_and_a_confident_memory_beats_a_shorter_one():
    drafter = LookupDrafter()
    drafter.memory.remember([1, 2, 3, 4, 5, 6])
    context = [9, 2, 3, 4, 30, 9, 2, 3, 4]  # (2, 3, 4) was followed by 30 in this context
    drafter.start(context)
    assert drafter.propose(context, 4, GREEDY, KEY).tokens.tolist() == [30, 9, 2, 3]  # not the memory's 5
    near_end = [2, 3, 4, 2, 3, 4]  # the context's guess runs out after 3: the memory goes on
    drafter.start(near_end)
    assert drafter.propose(near_end, 4, GREEDY, KEY).tokens.tolist() == [2, 3, 4, 5]
    weak = [3, 9, 1, 2, 3]  # the context matches only (3,), guessing 9; the memory knows (1, 2, 3)
    drafter.start(weak)
    assert drafter.propose(weak, 4, GREEDY, KEY).tokens.tolist() == [4, 5, 6]
    alone = [3, 9, 7, 3]  # nothing in memory: the weak guess is still offered
    drafter.start(alone)
    assert drafter.propose(alone, 4, GREEDY, KEY).tokens.tolist() == [9]


def test_a_remembered_answer_is_drafted_again_and_output_stays_plain(tiny_llama):
    plain = Engine.load(str(tiny_llama))
    lookup = Engine.load(str(tiny_llama), drafter="lookup")
    prompts = ["Once upon a time", "def add(a, b):", "The quick brown fox"]
    options = GenerateOptions(max_tokens=40, draft_length=4, adaptive=False)
    expected = {p: [t for ev in plain.generate(p, GenerateOptions(max_tokens=40)) for t in ev.tokens] for p in prompts}
    accepted = {}
    for rep in range(2):
        for p in prompts:
            events = list(lookup.generate(p, options))
            assert [t for ev in events for t in ev.tokens] == expected[p]
            accepted[rep, p] = events[-1].stats.accepted
    assert lookup.drafter.memory.tokens == 2 * sum(len(v) for v in expected.values())
    for p in prompts:  # asked again, the answer is in memory: more of its drafts are kept
        assert accepted[1, p] > accepted[0, p]


def test_a_strong_guess_is_a_3_token_match_or_a_confident_memory():
    drafter = LookupDrafter()
    assert not drafter.has_guess([1, 2, 9, 1, 2])  # a 2-token match: mostly wrong in prose
    drafter.start([])  # a new request (the context index grows with one request's context)
    assert drafter.has_guess([1, 2, 3, 9, 1, 2, 3])
    drafter.start([])
    drafter.memory.remember([4, 5, 6, 7, 8])
    assert drafter.has_guess([0, 4, 5, 6])  # the memory goes on for two tokens: 7, 8
    assert not drafter.has_guess([0, 5, 6, 7])  # only one (8) follows


def test_the_memory_size_is_a_load_setting(tiny_llama, monkeypatch):
    assert Engine.load(str(tiny_llama), drafter="lookup").drafter.memory.max_tokens == 100_000
    assert Engine.load(str(tiny_llama), drafter="lookup", lookup_memory=500).drafter.memory.max_tokens == 500
    monkeypatch.setenv("MLXSPEC_LOOKUP_MEMORY", "0")  # off: the drafter copies from the context only
    off = Engine.load(str(tiny_llama), drafter="lookup")
    list(off.generate("Once upon a time", GenerateOptions(max_tokens=8, draft_length=2, adaptive=False)))
    assert off.drafter.memory.max_tokens == 0 and off.drafter.memory.tokens == 0
    monkeypatch.setenv("MLXSPEC_LOOKUP_MEMORY", "-3")
    with pytest.raises(MlxspecError, match="MLXSPEC_LOOKUP_MEMORY"):
        Engine.load(str(tiny_llama), drafter="lookup")
    with pytest.raises(MlxspecError, match="0 or more"):
        Engine.load(str(tiny_llama), drafter="lookup", lookup_memory=-1)
