"""Are the installed MLX, mlx-lm, transformers and tokenizers within the ranges mlxspec declares?

    version_problems()   # [] or ["transformers 5.6.0 is outside ... pip install 'transformers>=5.7,<6'"]

The ranges are pyproject.toml's dependencies, the ones the tests were run with. They are read back
from the installed distribution's metadata (Requires-Dist) rather than written a second time here,
so the two cannot disagree. `mlxspec doctor` lists what this returns as problems: pip enforces the
ranges at install time, but a later `pip install` of something else can move these packages.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, requires, version

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

# The libraries whose APIs mlxspec calls into; the others (numpy, click, ...) are ordinary.
CHECKED = ("mlx", "mlx-lm", "transformers", "tokenizers")


def declared_ranges(requirements: list[str] | None = None) -> dict[str, SpecifierSet]:
    """{name: specifier} of the CHECKED packages, from `requirements` (Requires-Dist lines) or
    from the installed mlxspec distribution; lines for another platform or for an extra are skipped."""
    if requirements is None:
        try:
            requirements = requires("mlxspec") or []
        except PackageNotFoundError:  # run from a source tree that was never installed
            return {}
    ranges = {}
    for line in requirements:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in CHECKED:
            ranges[name] = req.specifier
    return ranges


def version_problems(requirements: list[str] | None = None, installed=version) -> list[str]:
    """One line per CHECKED package that is missing or outside its declared range."""
    out = []
    for name, spec in declared_ranges(requirements).items():
        try:
            found = installed(name)
        except PackageNotFoundError:
            out.append(f"{name} is not installed (mlxspec needs {name}{spec}): pip install '{name}{spec}'")
            continue
        try:
            inside = spec.contains(Version(found), prereleases=True)
        except InvalidVersion:
            inside = False
        if not inside:
            out.append(
                f"{name} {found} is outside the range mlxspec is tested with ({spec}): pip install '{name}{spec}'"
            )
    return out
