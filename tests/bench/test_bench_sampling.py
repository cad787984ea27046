"""benchmarks/bench_sampling.py, run small: its timing rows exist for every sampling setting, and its
mlx-lm reference draws what mlxspec's math draws (one law, two implementations)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from benchmark_scripts import load
from mlxspec.engine import Engine
from mlxspec.options import GenerateOptions
from mlxspec.sampling import Sampling, probabilities, sample


def test_rows_for_every_setting(tiny_llama):
    script = load("bench_sampling")
    math = script.math_ms(vocab=2000, repeats=2)
    assert set(math) == set(script.SETTINGS) - {"greedy"} and all(set(r) == {"mlxspec", "mlx-lm"} for r in math.values())
    rates = script.engine_tok_s(Engine.load(str(tiny_llama)), tokens=4, repeats=1)
    assert set(rates) == set(script.SETTINGS) and all(r > 0 for r in rates.values())


def test_the_reference_draws_from_the_same_law():
    script = load("bench_sampling")
    s = Sampling.from_options(GenerateOptions(temperature=0.8, top_k=4, top_p=0.9))
    logits = mx.array([[2.0, 1.5, 1.4, 0.3, -1.0, 0.2]])
    keys = mx.random.split(mx.random.key(0), 3000)
    ours = np.bincount(np.array([sample(probabilities(logits, s), k).item() for k in keys]), minlength=6)
    theirs = np.bincount(np.array([script.mlx_lm_draw(logits, s, k).item() for k in keys]), minlength=6)
    assert ours[4:].sum() == theirs[4:].sum() == 0 and ours[3] > 0  # top_p 0.9 keeps four here (0.845 above the fourth)
    assert np.abs(ours / 3000 - theirs / 3000).max() < 0.05
