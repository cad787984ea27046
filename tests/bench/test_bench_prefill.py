"""benchmarks/bench_prefill.py, run small: each run is cold (the whole prompt goes through the model,
not a kept prefix) and yields the first token plain decoding yields."""

from __future__ import annotations

from benchmark_scripts import load
from mlxspec.options import GenerateOptions


def test_every_run_processes_the_whole_prompt(tiny_llama):
    script = load("bench_prefill")
    runner = script.EngineRunner(str(tiny_llama))
    ids = script.readme_ids(runner.engine, 40)
    assert len(ids) == 40
    want = next(e.tokens[0] for e in runner.engine.generate(ids, GenerateOptions(max_tokens=1, temperature=0)))
    for _ in range(2):
        seconds, token = runner.first_token(ids)
        assert token == want and seconds > 0
        assert runner.cached_tokens == 0  # cold: no kept prefix reused
