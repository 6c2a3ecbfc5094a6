"""The package as installed, away from the checkout: the wheel carries the filters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import ROOT


def test_installed_wheel_finds_its_filters(bpf_root: None, tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    venv = tmp_path / "venv"
    subprocess.run(
        ["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], check=True
    )
    python = venv / "bin/python"
    wheel = next(wheels.glob("alfwrapper-*.whl"))
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    # From elsewhere, with nothing of the checkout on the path.
    out = subprocess.run(
        [str(python), "-m", "alfwrapper", "check", "--allow", "192.0.2.0/24", "--print-filter"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    filters = venv / "lib/python3.11/site-packages/alfwrapper/filters"
    assert f'#line 1 "{filters}/subnets.c"' in out.stdout
    assert str(ROOT) not in out.stdout
