"""The denied client during the wrapper's own start: created sockets are filtered before
they are bound, so nothing sent while a slow start (a 1,000,000-rule file) compiles and
loads is queued unfiltered, nor while a start stands still just before its socket's
first filter is attached."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.attacks import ATTACKER, seen_from, wait_line
from helpers.hosts import Host, Network, Service, all_probes, check_policy
from helpers.support import ECHO_SERVER, WRAPPER
from helpers.wrapping import million_rule_file

from alfwrapper.host import faults

pytestmark = pytest.mark.netns


def flood_both_ports(host: Host, stop: Path, tag: str) -> list[subprocess.Popen[str]]:
    """attacker.py flood from ``host`` at the server's ports 8080 (TCP) and 8081 (UDP),
    over IPv4 and IPv6, each message tagged TAG4-n or TAG6-n, until ``stop`` exists."""
    return [
        subprocess.Popen(
            host.command(
                [
                    sys.executable,
                    str(ATTACKER),
                    "flood",
                    target,
                    "8080",
                    "8081",
                    str(stop),
                    f"{tag}{family}",
                ]
            ),
            stdout=subprocess.PIPE,
            text=True,
        )
        for family, target in ((4, host.server_v4), (6, host.server_v6))
    ]


def test_nothing_reaches_created_sockets_during_a_slow_start(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    a, b = network.allowed, network.denied
    rules = tmp_path / "million.rules"
    million_rule_file(rules, ["192.0.2.2/32", "2001:db8:a::2/128"])
    stop = tmp_path / "stop"
    floods = flood_both_ports(b, stop, "EARLY")
    try:
        for proc in floods:
            assert wait_line(proc) == "flooding"
        svc = Service(
            network.server,
            [
                *WRAPPER,
                "--listen",
                "[::]:8080",
                "--listen-datagram",
                "[::]:8081",
                "--allow-file",
                str(rules),
                "--",
                *ECHO_SERVER,
            ],
        )
        services.append(svc)
        svc.wait_for(r"^ready ", timeout=120)
        check_policy(svc, served=all_probes(a, 8080, 8081), dropped=all_probes(b, 8080, 8081))
    finally:
        stop.touch()
        counts = [proc.communicate(timeout=90)[0].strip() for proc in floods]
    assert all(int(c.split()[1]) > 50 for c in counts), counts  # it did flood the start
    assert not seen_from(svc, b.v4, b.v6), svc.output()
    assert "EARLY" not in svc.output()


def stopped(pid: int, seconds: float = 30.0) -> None:
    """Wait until the process stands still (SIGSTOP: state T in /proc/PID/stat)."""
    deadline = time.monotonic() + seconds
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, f"process {pid} did not stop in {seconds} s"
        time.sleep(0.02)


def flood_while_stopped(svc: Service, host: Host, stop: Path, tag: str) -> None:
    """Once the start stands still (a pause point), ``host`` floods both ports for half a
    second (flood_both_ports); then the start goes on."""
    stopped(svc.proc.pid)
    floods = flood_both_ports(host, stop, tag)
    try:
        for proc in floods:
            assert wait_line(proc) == "flooding"
        time.sleep(0.5)  # the flood runs while the start stands still
    finally:
        stop.touch()
        counts = [proc.communicate(timeout=90)[0].strip() for proc in floods]
    assert all(int(c.split()[1]) > 5 for c in counts), counts
    os.kill(svc.proc.pid, signal.SIGCONT)


def test_nothing_reaches_created_sockets_while_a_start_stands_before_its_filter(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """The start is held still where its sockets' state is pinned and no filter is on
    them yet (the crash point "pinned"), and the denied host floods both ports for half
    a second: a created socket is not bound yet, so nothing is queued (a socket bound
    before its filter would queue it all, and the application would read it)."""
    a, b = network.allowed, network.denied
    svc = Service(
        network.server,
        [*WRAPPER, "--listen", "[::]:8080", "--listen-datagram", "[::]:8081",
         "--allow", "192.0.2.2/32", "--allow", "2001:db8:a::2/128", "--", *ECHO_SERVER],
        env={faults.PAUSE_VARIABLE: f"pinned@{tmp_path / 'paused'}"},  # the first socket
    )  # fmt: skip
    services.append(svc)
    flood_while_stopped(svc, b, tmp_path / "stop", "PAUSED")
    svc.wait_for(r"^ready ", timeout=120)
    check_policy(svc, served=all_probes(a, 8080, 8081), dropped=all_probes(b, 8080, 8081))
    assert not seen_from(svc, b.v4, b.v6), svc.output()
    assert "PAUSED" not in svc.output()


def test_a_banned_host_gets_nothing_into_a_restart_before_it_is_described(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """A restart that makes new sockets gives them the earlier sockets' runtime rules
    before their programs are installed: held still once its sockets are bound (the
    crash point "bound", before its meta names them), the new start already drops the
    host banned before the restart, which floods both ports meanwhile."""
    a = network.allowed
    argv = [*WRAPPER, "--service", "banned-early", "--listen", "[::]:8080",
            "--listen-datagram", "[::]:8081", "--", *ECHO_SERVER]  # fmt: skip
    svc = Service(network.server, argv)
    services.append(svc)
    svc.wait_for(r"^ready ", timeout=120)
    ban = subprocess.run(
        [*WRAPPER, "deny", "banned-early", a.v4, a.v6], capture_output=True, text=True, timeout=60
    )
    assert ban.returncode == 0, ban.stderr
    svc.stop()
    services.remove(svc)
    svc = Service(network.server, argv, env={faults.PAUSE_VARIABLE: f"bound@{tmp_path / 'p'}"})
    services.append(svc)
    flood_while_stopped(svc, a, tmp_path / "stop", "BANNED")
    svc.wait_for(r"^ready ", timeout=120)
    check_policy(svc, served=[], dropped=all_probes(a, 8080, 8081))
    assert not seen_from(svc, a.v4, a.v6), svc.output()
    assert "BANNED" not in svc.output()
    out = subprocess.run(
        [*WRAPPER, "revoke", "banned-early", "--all"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    check_policy(svc, served=all_probes(a, 8080, 8081), dropped=[])
