"""daemon/: the launchd plist parses and the systemd unit verifies, as shipped and as installed."""

from __future__ import annotations

import plistlib
import shutil
import subprocess
import sys

import pytest

from mlxspec.frontend import service


def test_shipped_plist_parses():
    data = plistlib.loads((service.DAEMON_DIR / "com.mlxspec.serve.plist").read_bytes())
    assert data["Label"] == service.LABEL and data["ProgramArguments"][-1] == "serve"
    assert data["RunAtLoad"] is True and data["KeepAlive"] == {"SuccessfulExit": False}


def test_rendered_plist_runs_this_mlxspec(tmp_path):
    command = [sys.executable, "-m", "mlxspec", "serve"]
    data = plistlib.loads(service.render_plist(command, tmp_path / "mlxspec.log"))
    assert data["ProgramArguments"] == command and data["StandardErrorPath"] == str(tmp_path / "mlxspec.log")


def test_shipped_unit_runs_serve():
    text = (service.DAEMON_DIR / service.UNIT).read_text()
    assert "\nExecStart=%h/.local/bin/mlxspec serve\n" in text and "WantedBy=default.target" in text


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_rendered_unit_verifies(tmp_path):
    unit = tmp_path / service.UNIT
    unit.write_text(service.render_unit([sys.executable, "-m", "mlxspec", "serve"]))
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    bad = tmp_path / "bad.service"
    bad.write_text(unit.read_text().replace("ExecStart=", "ExecStart=/no/such/mlxspec ", 1).replace("[Service]", "[Service]\nBogus=1"))
    assert subprocess.run(["systemd-analyze", "verify", str(bad)], capture_output=True, timeout=60).returncode != 0
