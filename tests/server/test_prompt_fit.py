"""fitting_prompt_ids: a completion's prompt past the context window, cut as Ollama's llm/llama_server.go cuts it."""

from __future__ import annotations

from mlxspec.server.prompts import fitting_prompt_ids

IDS = list(range(100))


def test_a_prompt_that_fits_comes_back_whole():
    assert fitting_prompt_ids(IDS, 101, 4, False) is IDS  # 100 tokens leave one of 101 to answer
    assert fitting_prompt_ids(IDS[:3], 1, 4, False) == IDS[:3]  # a window of one token: nothing to keep (the 400)


def test_the_start_and_the_end_stay_and_half_the_rest_is_freed():
    cut = fitting_prompt_ids(IDS, 60, 4, False)
    assert len(cut) == 60 - (60 - 4) // 2 == 32
    assert cut == IDS[:4] + IDS[-28:]


def test_a_leading_bos_is_kept_beside_num_keep():
    cut = fitting_prompt_ids(IDS, 60, 4, True)
    assert cut == IDS[:5] + IDS[-(60 - (60 - 5) // 2 - 5):] and len(cut) == 33


def test_num_keep_minus_one_keeps_as_much_of_the_start_as_fits():
    assert fitting_prompt_ids(IDS, 60, -1, False) == IDS[:59]  # one token left to answer in
    assert fitting_prompt_ids(IDS, 60, 200, False) == IDS[:59]
    assert fitting_prompt_ids(IDS, 60, 0, False) == IDS[-30:]  # nothing kept: the end alone, half the window
