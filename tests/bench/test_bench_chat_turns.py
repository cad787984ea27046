"""benchmarks/bench_chat_turns.py's repeat, small: a hybrid model's next turn reuses its kept cache."""

from __future__ import annotations

from benchmark_scripts import load
from mlxspec.engine import Engine
from model_factory import make_model_dir


def test_a_next_turn_reuses_the_history_and_its_answer(tmp_path):
    bench = load("bench_chat_turns")
    engine = Engine.load(str(make_model_dir(tmp_path / "qwen3-next", "qwen3_next", layers=4, seed=3)))
    run = bench.next_turn(engine, [5 + i % 200 for i in range(60)])  # asserts the same next token both ways
    assert run["cached_tokens"] == 60 + 16 - 1 and run["prompt_tokens"] == 60 + 16 + 8
