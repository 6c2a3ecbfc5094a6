"""The unit tier under each release's own Python and libraries: the checkout copied
into the guest (a new git repository, for its .gitignore) and tests/unit run there
with Debian's python3, NumPy, pytest and hypothesis (Debian 12: Python 3.11, NumPy
1.24; Debian 13: Python 3.13, NumPy 2.2), so that a change that breaks either is seen."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers.guest import Guest

pytestmark = pytest.mark.boot

ROOT = Path(__file__).resolve().parent.parent.parent
# What each release's python3 and python3-numpy are (their major.minor).
VERSIONS = {"bookworm": ("3.11", "1.24"), "trixie": ("3.13", "2.2")}


def test_the_unit_tier_under_the_releases_python(guest: Guest) -> None:
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "src.tar"
        subprocess.run(
            ["tar", "-C", str(ROOT), "-cf", str(tar), "--null", "-T", "-"], input=files, check=True
        )
        guest.put(tar, "/root/src.tar")
    versions = guest.run(
        'python3 -c \'import sys, numpy; print(*sys.version_info[:2], sep="."), '
        'print(*numpy.__version__.split(".")[:2], sep=".")\''
    ).split()
    assert tuple(versions) == VERSIONS[guest.suite], versions
    code, out = guest.status(
        "rm -rf /root/src && mkdir /root/src && tar -C /root/src -xf /root/src.tar && "
        "cd /root/src && git init -q && "
        "python3 -m pytest -q -p no:cacheprovider -m unit tests/unit 2>&1",
        timeout=900,
    )
    print(out[-600:])
    assert code == 0 and " passed" in out and " failed" not in out, out[-6000:]
