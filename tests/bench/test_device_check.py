"""benchmarks/device_check.sh runs only on a lent GPU machine, where a typo costs device minutes: checked here
statically. Every step of its default order has a case arm, every step it runs through bench_gpu.py names a
section that script measures, and the script parses."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
SCRIPT = (BENCHMARKS / "device_check.sh").read_text()


def case_arms() -> set[str]:
    body = SCRIPT[SCRIPT.index("run_step() {"):SCRIPT.index("esac")]
    return set(re.findall(r"^\s+([a-z][a-z-]*)\)", body, re.MULTILINE))


def test_every_step_of_the_default_order_has_a_case_arm():
    order = re.search(r"for s in \$\{STEPS:-([^}]*)\}", SCRIPT).group(1).replace("\\\n", " ").split()
    assert len(order) >= 10 and len(set(order)) == len(order)
    assert set(order) <= case_arms(), set(order) - case_arms()


def test_every_bench_step_names_a_section_bench_gpu_measures():
    sections = set(re.findall(r'"(\w+)" in sections', (BENCHMARKS / "bench_gpu.py").read_text()))
    used = set(re.findall(r"\bbench (\w+) \d+", SCRIPT))
    assert used and used <= sections, used - sections


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_script_parses():
    subprocess.run(["bash", "-n", str(BENCHMARKS / "device_check.sh")], check=True)
