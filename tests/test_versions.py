"""mlxspec.versions: installed libraries checked against the ranges pyproject.toml declares."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from mlxspec import doctor as doctor_mod
from mlxspec.versions import CHECKED, declared_ranges, version_problems

REQUIRES = [  # Requires-Dist lines as pip writes them from pyproject.toml
    "mlx>=0.32.4,<0.33; sys_platform == 'darwin'",
    "mlx[cpu]>=0.32.4,<0.33; sys_platform != 'darwin'",
    "mlx-lm>=0.32.2,<0.33",
    "transformers<6,>=5.7",
    "numpy",
    "gguf>=0.10; extra == 'dev'",
]


def fake_installed(versions: dict[str, str]):
    def installed(name):
        if name not in versions:
            raise PackageNotFoundError(name)
        return versions[name]

    return installed


def test_ranges_for_this_platform_only():
    ranges = declared_ranges(REQUIRES)
    assert set(ranges) == {"mlx", "mlx-lm", "transformers"}  # numpy is not checked, gguf is an extra
    assert str(ranges["transformers"]) == "<6,>=5.7"
    assert "0.32.4" in ranges["mlx"] and "0.33.0" not in ranges["mlx"]


def test_versions_inside_the_ranges_are_no_problem():
    inside = fake_installed({"mlx": "0.32.4", "mlx-lm": "0.32.2", "transformers": "5.23.0"})
    assert version_problems(REQUIRES, inside) == []


def test_versions_outside_or_missing_are_named_with_the_fix():
    outside = fake_installed({"mlx": "0.33.1", "mlx-lm": "0.32.2", "transformers": "4.57.6"})
    problems = version_problems(REQUIRES + ["tokenizers>=0.22.2,<0.24"], outside)
    assert len(problems) == 3
    mlx, transformers, tokenizers = problems
    assert mlx.startswith("mlx 0.33.1 is outside") and "pip install 'mlx" in mlx
    assert transformers.startswith("transformers 4.57.6 is outside") and "<6,>=5.7" in transformers
    assert tokenizers.startswith("tokenizers is not installed")


def test_pyproject_declares_every_checked_range():
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    names = {Requirement(line).name for line in pyproject["project"]["dependencies"]}
    assert set(CHECKED) <= names
    ranges = declared_ranges(pyproject["project"]["dependencies"])
    assert set(ranges) == set(CHECKED)
    assert all(  # a tested floor and a ceiling each
        any(s.operator == "<" for s in spec) and any(s.operator == ">=" for s in spec) for spec in ranges.values()
    )


def test_doctor_lists_version_problems(monkeypatch):
    monkeypatch.setattr(doctor_mod, "version_problems", lambda: ["transformers 4.0 is outside the range"])
    report = doctor_mod.doctor(measure=False, kernels=False)
    assert "transformers 4.0 is outside the range" in report["problems"]
    assert "problem:   transformers 4.0 is outside the range" in doctor_mod.render(report)
