"""The Debian package's maintainer scripts, run with stand-ins for the commands that would
change this host (the installed package itself is tested in test_package.py)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers.support import ROOT

pytestmark = pytest.mark.unit


def test_postinst_makes_the_system_users_from_the_sysusers_file(tmp_path: Path) -> None:
    """postinst runs systemd-sysusers on the package's own file (which makes the
    users alfwrapper and alfwrapper-loader only if missing), and nothing else."""
    stubs, calls = tmp_path / "stubs", tmp_path / "calls"
    stubs.mkdir()
    for name in ("systemd-sysusers", "adduser", "useradd"):
        (stubs / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n')
        (stubs / name).chmod(0o755)
    out = subprocess.run(
        ["sh", str(ROOT / "debian/alfwrapper.postinst"), "configure"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"},
    )
    assert out.returncode == 0, out.stderr
    assert calls.read_text().splitlines() == [
        "systemd-sysusers /usr/lib/sysusers.d/alfwrapper.conf"
    ]
    text = (ROOT / "sysusers/alfwrapper.conf").read_text()
    assert re.search(r"^u alfwrapper ", text, re.M), text
    assert re.search(r"^u alfwrapper-loader ", text, re.M), text


def test_every_package_of_the_code_is_built() -> None:
    """pyproject.toml names each package by hand (filters/ ships inside as
    alfwrapper.filters): one not named is left out of the wheel and the .deb, and an
    installed alfwrapper fails to import it."""
    import tomllib  # noqa: PLC0415  (this test alone)

    named = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "alfwrapper").rglob("__init__.py")
    }
    assert found <= named, sorted(found - named)
