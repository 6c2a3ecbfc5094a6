"""Early drop (filters/early.c, alfwrapper/sets/early.py) with real traffic: namespace
hosts joined by veth pairs, the server's end running the XDP program natively (veth
has a driver mode), the echo service behind the wrapper denying a set.  The banned
host's SYNs and datagrams are dropped at XDP (the counters say so) and never reach the
application; the allowed host is served; a service on another port that does not deny
the set still serves the banned host; the program outlives a restart of the service,
and `set destroy` takes it off the interface."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from helpers.hosts import Network, Probe, Service, all_probes, check_policy, start_echo
from helpers.support import WRAPPER

pytestmark = pytest.mark.netns


def cli(network: Network, *argv: str) -> subprocess.CompletedProcess[str]:
    """The wrapper's command in the server's namespace, where the interfaces are."""
    return subprocess.run(
        network.server.command([*WRAPPER, *argv]), capture_output=True, text=True, timeout=120
    )


def xdp_mode(network: Network, ifname: str) -> str:
    """What `ip link` says is attached at XDP on the server's interface: "xdp" (native),
    "xdpgeneric", or ""."""
    out = subprocess.run(
        ["ip", "-n", network.server.netns, "-j", "-d", "link", "show", ifname],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    xdp = json.loads(out)[0].get("xdp") or {}
    return {1: "xdp", 2: "xdpgeneric", 3: "xdpoffload"}.get(xdp.get("mode", 0), "")


def early_counts(network: Network) -> dict[str, object]:
    out = cli(network, "status", "--json")
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout).get("early", [])
    return {one["interface"]: one for one in found}


def test_a_banned_hosts_frames_are_dropped_at_xdp_and_others_served(
    network: Network, services: list[Service]
) -> None:
    name = f"early-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    service = f"early-{os.getpid()}"
    banned_if = network.denied.server_if
    # Early drop first, the services after: their starts tell it their sockets.
    out = cli(network, "set", "create", name, "--early", banned_if)
    assert out.returncode == 0, out.stderr
    assert f"{banned_if}: early drop for {name}" in out.stdout, out.stdout
    try:
        assert xdp_mode(network, banned_if) == "xdp"  # native, not generic
        svc = start_echo(network, services, service, "--deny-set", name)
        other = start_echo(network, services, f"early-other-{os.getpid()}", port=9090)
        out = cli(network, "set", "add", name, network.denied.v4, network.denied.v6)
        assert out.returncode == 0, out.stderr
        check_policy(
            svc,
            served=all_probes(network.allowed, 8080, 8081),
            dropped=all_probes(network.denied, 8080, 8081),
        )
        # Another port, whose socket does not deny the set: the banned host is served.
        check_policy(other, served=all_probes(network.denied, 9090, 9091), dropped=[])
        counted = early_counts(network)[banned_if]
        assert counted["attached"] is True
        assert counted["dropped"][name] >= 4, counted  # a SYN or datagram of each probe
        print(f"early drop on {banned_if}: {counted}")

        # A reload that no longer denies the set: the banned host is served at once.
        out = cli(network, "reload", service, "--deny", "203.0.113.0/24")
        assert out.returncode == 0, out.stderr
        check_policy(svc, served=all_probes(network.denied, 8080, 8081), dropped=[])

        # Off, and on again: `set early` with no interface, then with it.
        out = cli(network, "set", "early", name)
        assert out.returncode == 0 and f"{banned_if}: early drop for no set" in out.stdout
        assert xdp_mode(network, banned_if) == ""
        out = cli(network, "set", "early", name, banned_if)
        assert out.returncode == 0 and f"{banned_if}: early drop for {name}" in out.stdout
        # A restart that denies it again: the program stayed, and drops once it is back.
        svc.stop()
        services.remove(svc)
        before = early_counts(network)[banned_if]["dropped"][name]
        svc = start_echo(network, services, service, "--deny-set", name)
        check_policy(svc, served=[Probe(network.allowed, "tcp", 4, 8080)],
                     dropped=[Probe(network.denied, "tcp", 4, 8080)])  # fmt: skip
        assert early_counts(network)[banned_if]["dropped"][name] > before
    finally:
        out = cli(network, "set", "destroy", name)
    assert out.returncode == 0, out.stderr
    assert xdp_mode(network, banned_if) == "", "set destroy left the program attached"
    assert banned_if not in early_counts(network)
