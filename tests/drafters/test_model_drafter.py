"""drafters/model.py: a draft model whose layers hold recurrent states (a hybrid draft: Qwen3.5's, Falcon-H1's)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache

from mlx_lm_architectures import architecture_dir
from mlxspec.cache import layer_caches
from mlxspec.drafters.model import ModelDrafter
from mlxspec.loading import load
from mlxspec.options import GenerateOptions
from mlxspec.sampling import Sampling


def states(drafter: ModelDrafter) -> list[mx.array]:
    return [a for c in layer_caches(drafter.kv.cache) if isinstance(c, ArraysCache) for a in c.cache]


@pytest.mark.parametrize("model_type", ["qwen3_next", "falcon_h1"])
def test_rejected_drafts_leave_a_recurrent_draft_s_states(tmp_path, model_type):
    """A round that keeps 1 of 4 drafts: KV rows are trimmed, but recurrent states had taken in all the drafts fed
    (the draft then proposed from a history that never happened: its acceptance fell). Now its states come back from
    before the proposal and read the kept rows again: the states of a draft that read exactly those rows."""
    model = load(str(architecture_dir(tmp_path, model_type))).model
    prompt, greedy = [5 + i % 200 for i in range(30)], Sampling.from_options(GenerateOptions(temperature=0))
    drafter, reference = ModelDrafter(model), ModelDrafter(model)
    for d in (drafter, reference):
        d.start(prompt)
    draft = drafter.propose(prompt, 4, greedy, mx.random.key(0))
    drafter.accept(1)
    kept = draft.tokens[:1].tolist()
    reference.steps(mx.array([prompt[-1:] + kept], dtype=mx.uint32), reference.kv.cache)  # the kept rows, one pass
    assert drafter.seen == len(prompt) + 1 and states(drafter)
    assert all(mx.array_equal(a, b).item() for a, b in zip(states(drafter), states(reference)))
    again = drafter.propose(prompt + kept + [7], 3, greedy, mx.random.key(1))  # and it goes on from there
    assert again.count == 3
