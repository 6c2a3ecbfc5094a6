"""Least privilege: CAP_BPF only for the wrapper, nothing for the application."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.hosts import Network, Service, all_probes, check_policy

pytestmark = pytest.mark.netns

SYSTEM_PYTHON = "/usr/bin/python3"  # the interpreter python3-bpfcc is built for
SYSCTL = Path("/proc/sys/kernel/unprivileged_bpf_disabled")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# What AmbientCapabilities=CAP_BPF gives a unit's unprivileged user.
NOBODY_WITH_BPF = [*NOBODY, "--inh-caps=-all,+bpf", "--ambient-caps=+bpf"]
NOBODY_WITHOUT_CAPS = [*NOBODY, "--inh-caps=-all", "--bounding-set=-all"]


def as_nobody(
    copy: Path, caps: list[str], *options: str, command: list[str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """argv and environment to run the wrapper from the readable copy as uid 65534."""
    command = command or [SYSTEM_PYTHON, str(copy / "echo_server.py")]
    return (
        [*caps, SYSTEM_PYTHON, "-m", "alfwrapper", *options, "--", *command],
        {"PYTHONPATH": str(copy)},
    )


def start_as(
    network: Network, services: list[Service], argv: list[str], env: dict[str, str]
) -> Service:
    svc = Service(network.server, argv, env=env)
    services.append(svc)
    svc.wait_for(r"^ready ")
    return svc


def run_as(
    network: Network, argv: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """as_nobody's argv and environment, run to the end in the server's namespace."""
    return subprocess.run(
        network.server.command(argv),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def assert_no_privileges(pid: int) -> None:
    assert_no_privileges_in(Path(f"/proc/{pid}/status").read_text())


def assert_no_privileges_in(status: str) -> None:
    """proc(5)'s status of a process with no capability and no_new_privs set."""
    for field in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert re.search(rf"^{field}:\s+0+$", status, re.M), status
    assert re.search(r"^NoNewPrivs:\s+1$", status, re.M), status


def test_unprivileged_user_with_cap_bpf(
    network: Network, services: list[Service], readable_copy: Path
) -> None:
    svc = start_as(
        network,
        services,
        *as_nobody(
            readable_copy,
            NOBODY_WITH_BPF,
            "--listen",
            "[::]:8080",
            "--allow",
            "192.0.2.0/24",
            "--allow",
            "2001:db8:a::/48",
        ),
    )
    # The wrapper exec'd the application in its own process: same pid.
    assert_no_privileges(svc.proc.pid)
    check_policy(
        svc, served=all_probes(network.allowed, 8080), dropped=all_probes(network.denied, 8080)
    )


def test_no_capabilities_empties_every_set_even_the_inheritable_one(
    network: Network, readable_copy: Path
) -> None:
    """--no-capabilities for an unprivileged user whose unit gave CAP_BPF and
    CAP_NET_BIND_SERVICE (inheritable and ambient): the application has none left."""
    caps = "+bpf,+net_bind_service"
    argv, env = as_nobody(
        readable_copy,
        [*NOBODY, f"--inh-caps=-all,{caps}", f"--ambient-caps={caps}"],
        "--no-capabilities",
        "--listen",
        "[::]:8080",
        "--allow",
        "192.0.2.0/24",
        command=[SYSTEM_PYTHON, "-c", "print(open('/proc/self/status').read())"],
    )
    out = run_as(network, argv, env)
    assert out.returncode == 0, out.stderr
    assert_no_privileges_in(out.stdout)


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


@pytest.mark.alone  # the sysctl is the whole kernel's
def test_builtin_filters_need_no_capability_where_unprivileged_bpf_is_allowed(
    network: Network, services: list[Service], unprivileged_bpf: None, readable_copy: Path
) -> None:
    a = network.allowed
    svc = start_as(
        network,
        services,
        *as_nobody(
            readable_copy,
            NOBODY_WITHOUT_CAPS,
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


@pytest.mark.alone  # the sysctl is the whole kernel's
def test_knocking_needs_cap_bpf_even_then(
    network: Network, unprivileged_bpf: None, readable_copy: Path
) -> None:
    argv, env = as_nobody(
        readable_copy,
        NOBODY_WITHOUT_CAPS,
        "--listen",
        "[::]:8080",
        "--knock",
        "7001,7002",
        command=["true"],
    )
    out = run_as(network, argv, env)
    assert out.returncode == 77, out.stderr
    assert "knocking needs CAP_BPF even where unprivileged BPF is allowed" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
