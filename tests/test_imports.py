"""Every module of the package imports first, on its own: an import cycle shows only where a module is the first
one imported (the daemon's `mlxspec.engine` failed so while the tests, importing the kernels first, passed)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import importlib, pkgutil, sys
import mlxspec
names = sorted(m.name for m in pkgutil.walk_packages(mlxspec.__path__, "mlxspec.") if not m.name.endswith("__main__"))
failed = []
for name in names:
    for loaded in [m for m in sys.modules if m == "mlxspec" or m.startswith("mlxspec.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as e:
        failed.append(f"{name}: {type(e).__name__}: {e}")
print(len(names))
print("\\n".join(failed))
"""


def test_every_module_imports_first_on_its_own():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    count, *failed = out.stdout.strip().split("\n")
    assert int(count) > 50 and not [f for f in failed if f], failed
