"""Early exit cuts an mlx-lm decoder's own layers; a model that wraps its language model (Gemma 4, Qwen3.5)
is refused with the drafter error, not an AttributeError from inside the load."""

from __future__ import annotations

import pytest

from model_factory import make_gemma4_dir, make_qwen35_checkpoint
from mlxspec.engine import Engine
from mlxspec.errors import MlxspecError


@pytest.mark.parametrize("make", [lambda p: make_gemma4_dir(p, layers=8), make_qwen35_checkpoint],
                         ids=["gemma4", "qwen3_5"])
@pytest.mark.parametrize("spec", ["early-exit", "early-exit:1"])
def test_a_wrapped_model_is_refused_by_name(tmp_path, make, spec):
    target = make(tmp_path / "target")
    with pytest.raises(MlxspecError, match="early exit needs an mlx-lm decoder.*wrapper around its language model"):
        Engine.load(str(target), drafter=spec)


def test_a_decoder_whose_layers_are_a_module_is_refused_by_name(tmp_path):
    """PLaMo's `.model.layers` is a module around the list: refused as such, not as 'the model has 1 layer'."""
    from mlx_lm_architectures import architecture_dir

    with pytest.raises(MlxspecError, match="early exit needs an mlx-lm decoder with .model.layers"):
        Engine.load(str(architecture_dir(tmp_path, "plamo2")), drafter="early-exit")
