"""The boot tier's guests (guest.py): one per test module, the package installed."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from guest import Guest
from support import require


def booted(deb: Path, name: str, route: str) -> Iterator[Guest]:
    require(shutil.which("mmdebstrap") is not None, "mmdebstrap is missing: run `make setup`")
    g = Guest(name, route)
    g.stop()  # one left over by an interrupted run
    g.start()
    try:
        g.put(deb, "/root/alfwrapper.deb")
        g.run("apt-get install -y --no-install-recommends /root/alfwrapper.deb", timeout=900)
        yield g
    finally:
        g.stop()


@pytest.fixture(scope="module")
def guest(deb: Path) -> Iterator[Guest]:
    """systemd-nspawn --boot: the real systemd as PID 1 on this host's kernel."""
    yield from booted(deb, "alfguest", "nspawn")


@pytest.fixture(scope="module")
def guest61(deb: Path) -> Iterator[Guest]:
    """qemu: Debian's own kernel (6.1), emulated."""
    yield from booted(deb, "alfguest61", "qemu")
