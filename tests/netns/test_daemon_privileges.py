"""Daemons keep the privileges their unit gives, but none that reaches their filter:
a root application with CAP_DAC_OVERRIDE cannot read, change or detach its filter and
maps, not even through the pins in bpffs, where file permissions are the only guard."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.hosts import Network, Service, all_probes, check_policy
from helpers.support import EXAMPLES, PROGRAMS, WRAPPER

pytestmark = pytest.mark.netns

PROBE = PROGRAMS / "reach_filter.py"
REMOVED = {12: "CAP_NET_ADMIN", 16: "CAP_SYS_MODULE", 19: "CAP_SYS_PTRACE",
           21: "CAP_SYS_ADMIN", 38: "CAP_PERFMON", 39: "CAP_BPF"}  # fmt: skip
KEPT = {0: "CAP_CHOWN", 1: "CAP_DAC_OVERRIDE", 3: "CAP_FOWNER", 6: "CAP_SETGID",
        7: "CAP_SETUID", 10: "CAP_NET_BIND_SERVICE", 18: "CAP_SYS_CHROOT"}  # fmt: skip
RULES = ["--allow", "192.0.2.0/24", "--allow", "2001:db8:a::/48"]


@pytest.fixture
def bystander() -> Iterator[int]:
    """A root process with no capabilities in the host's mount namespace: one the
    application could trace but for Landlock, whose /proc/PID/root would show it the
    host's /sys/fs/bpf."""
    proc = subprocess.Popen(["setpriv", "--bounding-set=-all", "--inh-caps=-all", "sleep", "300"])
    yield proc.pid
    proc.kill()
    proc.wait()


def start(
    network: Network,
    services: list[Service],
    *options: str,
    bystander: int | str,
    as_user: tuple[list[str], Path] | None = None,
) -> dict:
    """The probe behind the wrapper (as root, or ``as_user``: setpriv's options and a
    readable copy of alfwrapper), its report, and the policy checked with real traffic."""
    service = "reach-filter"
    wrapper, python, folder = WRAPPER, sys.executable, PROBE.parent
    env = None
    if as_user:
        prefix, copy = as_user
        shutil.copy(PROBE, copy / PROBE.name)
        wrapper = [*prefix, "/usr/bin/python3", "-m", "alfwrapper"]
        python, folder, env = "/usr/bin/python3", copy, {"PYTHONPATH": str(copy)}
    argv = [*wrapper, "--service", service, *options, "--listen", "[::]:8080", *RULES, "--",
            python, str(folder / PROBE.name), service, str(bystander),
            str(folder / "echo_server.py" if as_user else EXAMPLES / "echo_server.py")]  # fmt: skip
    svc = Service(network.server, argv, env=env)
    services.append(svc)
    line = svc.wait_for(r"^\{.*\}$").group(0)
    svc.wait_for(r"^ready ")
    check_policy(
        svc, served=all_probes(network.allowed, 8080), dropped=all_probes(network.denied, 8080)
    )
    return dict(json.loads(line))


def caps_of(report: dict, field: str) -> int:
    return int(report["caps"][field], 16)


def test_a_root_daemon_keeps_its_capabilities_but_cannot_reach_its_filter(
    network: Network, services: list[Service], bystander: int
) -> None:
    report = start(network, services, bystander=bystander)
    assert report["uid"] == 0
    for field in ("CapEff", "CapPrm", "CapBnd"):
        for cap, name in KEPT.items():
            assert caps_of(report, field) >> cap & 1, f"{name} not in {field}: {report}"
        for cap, name in REMOVED.items():
            assert not caps_of(report, field) >> cap & 1, f"{name} in {field}: {report}"
    assert report["no_new_privs"] == "1"
    assert report["seccomp"] == "2"
    # Its own view has no BPF file system, and the host's, through /proc/PID/root of a
    # process it could otherwise trace, is closed by Landlock: no pin reached by path.
    assert report["own_view"] is False, report
    assert report["host_view"] == "EACCES", report
    check_out_of_reach(report)


def check_out_of_reach(report: dict) -> None:
    """No pin opened, got, renamed, removed, linked or planted; no program by id."""
    # EIO: bpffs opens no pin without BTF; EACCES: no path to it at all.
    for pin, result in report["open"].items():
        assert result in ("EIO", "EACCES"), f"{pin}: {result}"
    for pin, result in report["obj_get"].items():
        assert result == -errno.EPERM, f"{pin}: {result}"
    refused = {"EACCES", "EPERM", "EXDEV"}  # Landlock's, or the file system's own
    assert set(report["tamper"].values()) <= refused, report["tamper"]
    assert report["next_prog_id"] == -errno.EPERM
    assert report["map_by_id"] == -errno.EPERM
    assert report["detach"] == "EPERM"
    assert report["bpf_fds"] == []


def test_no_capabilities_leaves_the_application_none(
    network: Network, services: list[Service], bystander: int
) -> None:
    report = start(network, services, "--no-capabilities", bystander=bystander)
    assert {field: caps_of(report, field) for field in report["caps"]} == dict.fromkeys(
        report["caps"], 0
    )
    assert report["no_new_privs"] == "1"
    assert report["seccomp"] == "2"
    assert all(result == -errno.EPERM for result in report["obj_get"].values()), report


def test_an_unprivileged_daemon_keeps_its_ambient_capabilities_but_cannot_reach_its_filter(
    network: Network, services: list[Service], readable_copy: Path
) -> None:
    """AmbientCapabilities=CAP_BPF CAP_DAC_OVERRIDE CAP_CHOWN CAP_NET_BIND_SERVICE for an
    unprivileged user: the wrapper loads with CAP_BPF (and keeps pinned state with the
    next two); the application keeps those two and CAP_NET_BIND_SERVICE, sees
    /sys/fs/bpf as it is (no CAP_SYS_ADMIN for a mount namespace), and still cannot
    open, get, rename or remove a pin."""
    caps = "+bpf,+dac_override,+chown,+net_bind_service"
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
              f"--inh-caps=-all,{caps}", f"--ambient-caps={caps}"]  # fmt: skip
    report = start(network, services, bystander="self", as_user=(nobody, readable_copy))
    assert report["uid"] == 65534
    assert caps_of(report, "CapAmb") == 1 << 0 | 1 << 1 | 1 << 10  # CHOWN, DAC_OVERRIDE, NET_BIND
    assert report["own_view"] is True, report
    assert report["host_view"] == "listed", report
    assert set(report["open"].values()) == {"EIO"}, report["open"]
    check_out_of_reach(report)
    assert report["detach"] == "EPERM"


def test_without_landlock_the_wrapper_says_what_is_left(
    network: Network, readable_copy: Path
) -> None:
    """Landlock refused (ENOSYS, as where a unit's SystemCallFilter= lacks it, or before
    Linux 5.13): the wrapper starts the application but says what it could still do."""
    no_landlock = (
        "import errno, os, sys, seccomp\n"
        "f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)\n"
        "f.add_rule(seccomp.ERRNO(errno.ENOSYS), 'landlock_create_ruleset')\n"
        "f.load()\n"
        "os.execv(sys.argv[1], sys.argv[1:])\n"
    )
    caps = "+bpf,+dac_override,+chown"
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
            f"--inh-caps=-all,{caps}", f"--ambient-caps={caps}",
            "/usr/bin/python3", "-c", no_landlock, "/usr/bin/python3", "-m", "alfwrapper",
            "--listen", "[::]:8080", *RULES, "--", "true"]  # fmt: skip
    out = subprocess.run(
        network.server.command(argv),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(readable_copy), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert (
        "the application keeps CAP_CHOWN, CAP_DAC_OVERRIDE and Landlock could not confine "
        "it (landlock_create_ruleset: Function not implemented); the BPF file system is "
        "in its view (no CAP_SYS_ADMIN to make a mount namespace)"
    ) in out.stderr


def test_no_seccomp_no_start(network: Network, tmp_path: Path) -> None:
    """Where seccomp(2) is refused (a unit's SystemCallFilter= without it), the wrapper
    fails closed: one line, exit 71, and the application never starts."""
    no_seccomp = (
        "import errno, os, sys, seccomp\n"
        "f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)\n"
        "f.add_rule(seccomp.ERRNO(errno.EPERM), 'seccomp')\n"
        "f.add_rule(seccomp.ERRNO(errno.EPERM), 'prctl', seccomp.Arg(0, seccomp.EQ, 22))\n"
        "f.load()\n"
        "os.execv(sys.argv[1], sys.argv[1:])\n"
    )
    marker = tmp_path / "started"
    out = subprocess.run(
        network.server.command(
            ["/usr/bin/python3", "-c", no_seccomp, *WRAPPER, "--service", "no-seccomp",
             "--listen", "[::]:8080", *RULES, "--", "/usr/bin/touch", str(marker)]
        ),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 71, out.stderr
    assert out.stderr.startswith("alfwrapper: denying bpf(2) to the application (seccomp): ")
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert not marker.exists()
