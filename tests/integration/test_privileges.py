"""Least privilege: CAP_BPF only for the wrapper, nothing for the application."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hosts import Network, Service, all_probes, check_policy
from support import WRAPPER
from test_wrapper import start, wrapped

SYSCTL = Path("/proc/sys/kernel/unprivileged_bpf_disabled")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# What AmbientCapabilities=CAP_BPF gives a unit's unprivileged user.
NOBODY_WITH_BPF = [*NOBODY, "--inh-caps=-all,+bpf", "--ambient-caps=+bpf"]
NOBODY_WITHOUT_CAPS = [*NOBODY, "--inh-caps=-all", "--bounding-set=-all"]


def assert_no_privileges(pid: int) -> None:
    status = Path(f"/proc/{pid}/status").read_text()
    for field in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert re.search(rf"^{field}:\s+0+$", status, re.M), status
    assert re.search(r"^NoNewPrivs:\s+1$", status, re.M), status


def test_unprivileged_user_with_cap_bpf(network: Network, services: list[Service]) -> None:
    svc = start(
        network,
        services,
        NOBODY_WITH_BPF
        + wrapped("--listen", "[::]:8080", "--allow", "192.0.2.0/24", "--allow", "2001:db8:a::/48"),
    )
    # The wrapper exec'd the application in its own process: same pid.
    assert_no_privileges(svc.proc.pid)
    check_policy(
        svc, served=all_probes(network.allowed, 8080), dropped=all_probes(network.denied, 8080)
    )


@pytest.fixture
def unprivileged_bpf() -> Iterator[None]:
    """kernel.unprivileged_bpf_disabled=0 for the test, restored afterwards."""
    before = SYSCTL.read_text().strip()
    if before == "1":
        pytest.fail("kernel.unprivileged_bpf_disabled=1 cannot be lowered without a reboot")
    SYSCTL.write_text("0")
    try:
        yield
    finally:
        SYSCTL.write_text(before)


def test_builtin_filters_need_no_capability_where_unprivileged_bpf_is_allowed(
    network: Network, services: list[Service], unprivileged_bpf: None
) -> None:
    a = network.allowed
    svc = start(
        network,
        services,
        NOBODY_WITHOUT_CAPS
        + wrapped(
            "--listen",
            "[::]:8080",
            "--listen-datagram",
            "[::]:8081",
            "--allow",
            "192.0.2.0/24",
            "--allow",
            "2001:db8:a::/48",
            "--interface",
            a.server_if,
        ),
    )
    assert_no_privileges(svc.proc.pid)
    check_policy(
        svc, served=all_probes(a, 8080, 8081), dropped=all_probes(network.denied, 8080, 8081)
    )


def test_knocking_needs_cap_bpf_even_then(network: Network, unprivileged_bpf: None) -> None:
    out = subprocess.run(
        network.server.command(
            [
                *NOBODY_WITHOUT_CAPS,
                *WRAPPER,
                "--listen",
                "[::]:8080",
                "--knock",
                "7001,7002",
                "--",
                "true",
            ]
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 77
    assert "knocking needs CAP_BPF even where unprivileged BPF is allowed" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
