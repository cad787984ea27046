"""mlxspec.hub_gguf: which file of a Hugging Face GGUF repo an hf.co/ORG/REPO[:QUANT] reference names.
The download itself runs against a stand-in hub in tests/frontend/test_pull.py."""

from __future__ import annotations

import pytest

from mlxspec.errors import ModelLoadError
from mlxspec.hub_gguf import choose, is_reference, parse, quant_of

FILES = ["Qwen3.5-9B-Q4_K_M.gguf", "Qwen3.5-9B-UD-Q4_K_XL.gguf", "Qwen3.5-9B-Q8_0.gguf", "mmproj-F16.gguf",
         "README.md", "BF16/Qwen3.5-9B-BF16-00001-of-00002.gguf", "BF16/Qwen3.5-9B-BF16-00002-of-00002.gguf"]


def test_references_follow_ollamas_grammar():
    assert parse("hf.co/unsloth/Qwen3.5-9B-GGUF:Q4_K_M") == ("unsloth/Qwen3.5-9B-GGUF", "Q4_K_M")
    assert parse("huggingface.co/org/repo") == ("org/repo", None) == parse("hf.co/org/repo:latest")
    assert is_reference("HF.co/org/repo:q8_0") and not is_reference("org/repo") and not is_reference("hf.co/repo")


def test_file_names_give_their_quantization():
    assert [quant_of(f) for f in FILES[:3]] == ["Q4_K_M", "UD-Q4_K_XL", "Q8_0"]
    assert quant_of("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert quant_of("BF16/Qwen3.5-9B-BF16-00001-of-00002.gguf") == "BF16"


@pytest.mark.parametrize("quant, want", [(None, "Qwen3.5-9B-Q4_K_M.gguf"), ("q8_0", "Qwen3.5-9B-Q8_0.gguf"),
                                         ("UD-Q4_K_XL", "Qwen3.5-9B-UD-Q4_K_XL.gguf")])
def test_choose_the_asked_or_ollamas_default_quantization(quant, want):
    assert choose(FILES, quant, "u/r") == want


def test_no_default_quantization_takes_the_nearest_and_never_a_projector():
    assert choose(["m-Q8_0.gguf", "m-Q5_K_M.gguf", "mmproj-m-Q4_K_M.gguf"], None, "u/r") == "m-Q5_K_M.gguf"


@pytest.mark.parametrize("files, quant, match", [
    (FILES, "Q2_K", r"has no Q2_K GGUF \(it has: BF16, Q4_K_M, Q8_0, UD-Q4_K_XL\)"),
    (FILES, "BF16", "split into 2 files"),
    (["README.md", "mmproj-F16.gguf"], None, "holds no GGUF model file"),
])
def test_what_cannot_be_loaded_is_said(files, quant, match):
    with pytest.raises(ModelLoadError, match=match):
        choose(files, quant, "u/r")
