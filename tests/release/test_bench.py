"""`make bench` must not rot: its script runs end to end at tiny sizes (no timing asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import ROOT

pytestmark = pytest.mark.release


def test_bench_smoke(bpf_root: None, tmp_path: Path, deb: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/bench.py"), "--smoke", "--out", str(tmp_path),
         "--deb", str(deb)],
        capture_output=True,
        text=True,
        timeout=1200,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    report = (tmp_path / "benchmarks.md").read_text()
    for section in (
        "## Per-packet filter cost",
        "No-op floor",
        "linear scan",
        "Interface",
        "Port knocking",
        "composed",
        "## Varied sources, in the kernel",
        "Varied sources (in-kernel walk), IPv4",
        "Varied sources (in-kernel walk), IPv6",
        "## Start-up",
        "## A SYN flood from many sources",
        "SYN flood: CPU per dropped SYN",
        "Kernel map memory, IPv6",
        "Hot cost",
        "(IPv6 /64), an IPv6 source",
        "(half IPv4, half IPv6 /64), an IPv4 source",
        "The wrapper's start-up stages with 100 rules",
        "half IPv4 /32, half IPv6 /64",
        "## Accept=yes",
        "## A daemon that binds its own sockets",
        "| nginx | requests/s | against alone |",
        "A denied peer on an Accept=yes socket",
        "## The gallery's sshd, under systemd",
        "An allowed ssh-keyscan through the gallery's sshd unit",
        "denied connections a second for 2 s at the gallery's sshd unit",
        "Machine:",
    ):
        assert section in report
    assert (tmp_path / "bench-subnets.png").stat().st_size > 1000
