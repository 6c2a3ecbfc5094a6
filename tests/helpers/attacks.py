"""What the adversarial tests share: the attacker in a host's namespace, the parts each
start is tried with, and reading what the application saw."""

from __future__ import annotations

import select
import subprocess
import sys

from helpers.hosts import Host, Service
from helpers.support import PROGRAMS, ROOT

ATTACKER = PROGRAMS / "attacker.py"


ALLOWLIST = str(ROOT / "tests/data/allowlist.c")


PARTS = {
    "subnets": ["--allow", "192.0.2.0/24", "--allow", "2001:db8:a::/48"],
    "interfaces": ["--interface", "{allowed_if}"],
    "knocking": ["--knock", "7001,7002,7003"],
    "filter": [
        "--filter",
        ALLOWLIST,
        "--set",
        "allowed4",
        "192.0.2.2",
        "1",
        "--set",
        "allowed6",
        "2001:db8:a::2",
        "1",
        "--set",
        "port_limits",
        "0",
        "8080,1",
        "--set",
        "port_limits",
        "1",
        "8081,1",
    ],
}


def attack(host: Host, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        host.command([sys.executable, str(ATTACKER), *argv]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    """The first line proc prints, within timeout."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"{proc.args}: nothing printed in {timeout} s"
    return proc.stdout.readline().strip()


def seen_from(svc: Service, *sources: str) -> list[str]:
    """Lines of the application's log that show anything from these sources."""
    return [
        line
        for line in svc.output().splitlines()
        if line.split()[:1] in (["accept"], ["tcp"], ["udp"]) and set(line.split()) & set(sources)
    ]
