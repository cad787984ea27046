"""Early exit cuts an mlx-lm decoder's own layers, inside a model that wraps its language model too (Gemma 4,
Qwen3.5, Gemma 3n, PLaMo: the decoder found where mlx-lm keeps it); a model without a list of blocks, or whose cut
does not run, is refused with the drafter error, not an AttributeError from inside the load or a request."""

from __future__ import annotations

import pytest

from mlx_lm_architectures import architecture_dir
from model_factory import make_gemma4_dir, make_qwen35_checkpoint
from mlxspec.engine import Engine
from mlxspec.errors import MlxspecError
from mlxspec.options import GenerateOptions


@pytest.mark.parametrize("make", [lambda p: make_gemma4_dir(p, layers=8), make_qwen35_checkpoint,
                                  lambda p: architecture_dir(p, "gemma3n"), lambda p: architecture_dir(p, "plamo2")],
                         ids=["gemma4", "qwen3_5", "gemma3n", "plamo2"])  # (PLaMo: its blocks in a module of their own)
def test_a_wrapped_model_drafts_with_its_first_layers(tmp_path, make):
    """The view cuts the wrapped decoder (the model itself keeps every layer) and greedy output is plain decoding's."""
    from mlxspec.drafters.selfdraft import decoder_of

    target = str(make(tmp_path / "target"))
    options = GenerateOptions(max_tokens=16, temperature=0, draft_length=3, adaptive=False)
    want = [t for e in Engine.load(target).generate("the cat sat on the mat", options) for t in e.tokens]
    engine = Engine.load(target, drafter="early-exit:1")
    events = list(engine.generate("the cat sat on the mat", options))
    assert [t for e in events for t in e.tokens] == want
    assert events[-1].stats.drafted > 0 and events[-1].stats.drafter == "early-exit:1"
    assert len(decoder_of(engine.target.model).layers) > 1  # the target's own decoder is whole


def test_a_model_without_a_list_of_blocks_is_refused_by_name():
    """Nothing early exit could cut: the drafter error (a 400 in the daemon), not an AttributeError from the load."""
    import mlx.nn as nn

    from mlxspec.drafters import make_drafter

    with pytest.raises(MlxspecError, match="early exit needs an mlx-lm decoder with its blocks as a list"):
        make_drafter("early-exit", nn.Sequential(nn.Linear(4, 4)))


def test_a_body_that_counts_its_blocks_is_cut_whole_and_a_cut_that_cannot_run_is_refused(tmp_path, monkeypatch):
    """Kimi K3 loops over its own `num_layers`: the view sets it (BLOCK_COUNTS) and drafts exactly; without that
    the cut view's forward fails, which the load now finds and refuses by name (it was a 500 in every request)."""
    from mlxspec.drafters import selfdraft

    target = str(architecture_dir(tmp_path, "kimi_k3"))
    options = GenerateOptions(max_tokens=12, temperature=0, draft_length=3, adaptive=False)
    want = [t for e in Engine.load(target).generate("the cat sat on the mat", options) for t in e.tokens]
    events = list(Engine.load(target, drafter="early-exit:1").generate("the cat sat on the mat", options))
    assert [t for e in events for t in e.tokens] == want and events[-1].stats.drafted > 0
    monkeypatch.setattr(selfdraft, "BLOCK_COUNTS", ())
    with pytest.raises(MlxspecError, match="early exit after 1 layers does not run on mlx_lm.models.kimi_k3: IndexError"):
        Engine.load(target, drafter="early-exit:1")
