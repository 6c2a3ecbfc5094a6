"""The boot tier's guests (guest.py): one per test module and Debian release, the
package installed.  Every module runs once on Debian 12 (bookworm) and once on
Debian 13 (trixie); the two releases are lanes of their own (tests/conftest.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.guest import SUITES, Guest
from helpers.support import require


def booted(deb: Path, name: str, route: str, suite: str) -> Iterator[Guest]:
    require(shutil.which("mmdebstrap") is not None, "mmdebstrap is missing: run `make setup`")
    g = Guest(name, route, suite)
    g.stop()  # one left over by an interrupted run
    g.start()
    try:
        g.put(deb, "/root/alfwrapper.deb")
        g.run("apt-get install -y --no-install-recommends /root/alfwrapper.deb", timeout=900)
        yield g
    finally:
        g.stop()


@pytest.fixture(scope="module", params=SUITES)
def guest(deb: Path, request: pytest.FixtureRequest) -> Iterator[Guest]:
    """systemd-nspawn --boot: the real systemd as PID 1 on this host's kernel."""
    suite = request.param
    yield from booted(deb, f"alfguest{SUITES[suite]}", "nspawn", suite)


@pytest.fixture(scope="module", params=SUITES)
def qemu_guest(deb: Path, request: pytest.FixtureRequest) -> Iterator[Guest]:
    """qemu: Debian's own kernel (6.1 on Debian 12, 6.12 on Debian 13), emulated."""
    suite = request.param
    yield from booted(deb, f"alfqemu{SUITES[suite]}", "qemu", suite)
