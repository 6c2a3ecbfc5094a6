"""Daemons keep the privileges their unit gives, but none that reaches their filter:
a root application with CAP_DAC_OVERRIDE cannot read, change or detach its filter and
maps, not even through the pins in bpffs, where file permissions are the only guard."""

from __future__ import annotations

import errno
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hosts import Network, Service, all_probes, check_policy
from support import EXAMPLES, WRAPPER

PROBE = Path(__file__).with_name("reach_filter.py")
REMOVED = {16: "CAP_SYS_MODULE", 19: "CAP_SYS_PTRACE", 21: "CAP_SYS_ADMIN",
           38: "CAP_PERFMON", 39: "CAP_BPF"}  # fmt: skip
KEPT = {0: "CAP_CHOWN", 1: "CAP_DAC_OVERRIDE", 3: "CAP_FOWNER", 6: "CAP_SETGID",
        7: "CAP_SETUID", 10: "CAP_NET_BIND_SERVICE", 12: "CAP_NET_ADMIN",
        18: "CAP_SYS_CHROOT"}  # fmt: skip
RULES = ["--allow", "192.0.2.0/24", "--allow", "2001:db8:a::/48"]


@pytest.fixture
def bystander() -> Iterator[int]:
    """A root process with no capabilities in the host's mount namespace: one the
    application may trace, so /proc/PID/root shows it the host's /sys/fs/bpf."""
    proc = subprocess.Popen(["setpriv", "--bounding-set=-all", "--inh-caps=-all", "sleep", "300"])
    yield proc.pid
    proc.kill()
    proc.wait()


def start(network: Network, services: list[Service], *options: str, bystander: int) -> dict:
    service = "reach-filter"
    argv = [*WRAPPER, "--service", service, *options, "--listen", "[::]:8080", *RULES, "--",
            sys.executable, str(PROBE), service, str(bystander),
            str(EXAMPLES / "echo_server.py")]  # fmt: skip
    svc = Service(network.server, argv)
    services.append(svc)
    line = svc.wait_for(r"^\{.*\}$").group(0)
    svc.wait_for(r"^ready ")
    check_policy(
        svc, served=all_probes(network.allowed, 8080), dropped=all_probes(network.denied, 8080)
    )
    return dict(json.loads(line))


def caps(report: dict, field: str) -> int:
    return int(report["caps"][field], 16)


def test_a_root_daemon_keeps_its_capabilities_but_cannot_reach_its_filter(
    network: Network, services: list[Service], bystander: int
) -> None:
    report = start(network, services, bystander=bystander)
    assert report["uid"] == 0
    for field in ("CapEff", "CapPrm", "CapBnd"):
        for cap, name in KEPT.items():
            assert caps(report, field) >> cap & 1, f"{name} not in {field}: {report}"
        for cap, name in REMOVED.items():
            assert not caps(report, field) >> cap & 1, f"{name} in {field}: {report}"
    assert report["no_new_privs"] == "1"
    assert report["seccomp"] == "2"
    # Its own view has no BPF file system; the host's, through a process it may
    # trace, has the pins, which it can reach but neither open nor get.
    assert report["own_view"] is False, report
    assert report["host_view"] is True, report
    for pin, result in report["open"].items():
        assert result in ("EIO", "ENXIO"), f"{pin}: {result}"
    for pin, result in report["obj_get"].items():
        assert result == -errno.EPERM, f"{pin}: {result}"
    assert report["next_prog_id"] == -errno.EPERM
    assert report["map_by_id"] == -errno.EPERM
    assert report["detach"] == "EPERM"
    assert report["bpf_fds"] == []


def test_no_capabilities_leaves_the_application_none(
    network: Network, services: list[Service], bystander: int
) -> None:
    report = start(network, services, "--no-capabilities", bystander=bystander)
    assert {field: caps(report, field) for field in report["caps"]} == dict.fromkeys(
        report["caps"], 0
    )
    assert report["seccomp"] == "2"
    assert all(result == -errno.EPERM for result in report["obj_get"].values()), report


def test_an_unprivileged_daemon_keeps_its_ambient_capabilities_but_cap_bpf(
    network: Network, services: list[Service], readable_copy: Path
) -> None:
    """AmbientCapabilities=CAP_BPF CAP_DAC_OVERRIDE CAP_CHOWN CAP_NET_BIND_SERVICE: the
    wrapper loads with CAP_BPF (and keeps pinned state), the application binds port 80
    itself and keeps the other two; with no CAP_SYS_ADMIN to hide the BPF file system
    from it, the wrapper says so."""
    caps = "+bpf,+dac_override,+chown,+net_bind_service"
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
            f"--inh-caps=-all,{caps}", f"--ambient-caps={caps}",
            "/usr/bin/python3", "-m", "alfwrapper", "--listen", "[::]:8080", *RULES, "--",
            "/usr/bin/python3", "-c",
            "import socket; s = socket.socket(); s.bind(('127.0.0.1', 80)); print('bound', "
            "open('/proc/self/status').read().split('CapAmb:')[1].split()[0])"]  # fmt: skip
    out = subprocess.run(
        network.server.command(argv),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(readable_copy), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(r"bound 0+403\n", out.stdout), (out.stdout, out.stderr)
    assert (
        "the application keeps CAP_CHOWN, CAP_DAC_OVERRIDE and the BPF file system could not be "
        "hidden from it (no CAP_SYS_ADMIN to make a mount namespace)"
    ) in out.stderr
