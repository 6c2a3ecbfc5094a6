"""The Debian package's maintainer scripts, run with stand-ins for the commands that would
change this host (the installed package itself is tested in test_package.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support import ROOT


def run_postinst(tmp_path: Path, user_known: bool) -> list[str]:
    stubs, calls = tmp_path / "stubs", tmp_path / "calls"
    stubs.mkdir()
    (stubs / "getent").write_text(f"#!/bin/sh\nexit {0 if user_known else 2}\n")
    (stubs / "adduser").write_text(f'#!/bin/sh\necho "adduser $*" >> {calls}\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    out = subprocess.run(
        ["sh", str(ROOT / "debian/alfwrapper.postinst"), "configure"],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize("user_known", [False, True])
def test_postinst_makes_the_system_user_only_if_missing(tmp_path: Path, user_known: bool) -> None:
    calls = run_postinst(tmp_path, user_known)
    made = ["adduser --system --group --no-create-home --home /nonexistent alfwrapper"]
    assert calls == ([] if user_known else made)
