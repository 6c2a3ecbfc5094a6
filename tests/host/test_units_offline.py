"""The shipped unit files, offline: `systemd-analyze verify` and `security` on this host,
whose daemons (`make setup`: sshd, in.tftpd) the gallery's units run (the boot tier,
tests/boot, runs them under a booted systemd)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import ROOT

pytestmark = pytest.mark.host

UNITS = ROOT / "units"
ALFWRAPPER = str(Path(sys.executable).parent / "alfwrapper")


def test_units_verify(tmp_path: Path) -> None:
    """Every shipped unit verifies as it is (templates too), and every service's exposure
    in `systemd-analyze security` is at most 3.0."""
    units = [
        *(u for u in UNITS.iterdir() if u.suffix in (".socket", ".service", ".timer")),
        *(ROOT / "examples/lighttpd").glob("*.s*"),
        ROOT / "examples/alfwrapper@8084.socket",
    ]
    # The gallery's daemons run as root where they need to (sshd, in.tftpd): they
    # verify, but their exposure is the daemon's own.
    gallery = sorted((ROOT / "examples/units").iterdir())
    for unit in [*units, *gallery]:
        # Our paths only: the settings are as shipped.
        text = unit.read_text().replace("/usr/bin/alfwrapper", ALFWRAPPER)
        (tmp_path / unit.name).write_text(text)
    for service in sorted(tmp_path.glob("*.service")):
        if any(service.name == unit.name for unit in gallery):
            continue
        out = subprocess.run(
            ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(service)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        level = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out.stdout)
        assert level and float(level.group(1)) <= 3.0, (service.name, out.stdout[-300:])
    out = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *sorted(map(str, tmp_path.iterdir()))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr.strip() == "", out.stderr
