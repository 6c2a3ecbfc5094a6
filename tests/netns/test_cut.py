"""Bans that cut live connections (lifecycle/cut.py), with real traffic from namespace
hosts: a host that `alfwrapper deny` or `set add` bans has its open TCP connection to
the wrapped echo service reset within a second (its client sees ECONNRESET), while an
allowed host's connection on the same socket keeps echoing; IPv4 and IPv6."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest
from helpers.hosts import Held, Network, Probe, Service, check_policy, start_echo
from helpers.support import WRAPPER

pytestmark = pytest.mark.netns


@pytest.fixture
def held() -> Iterator[list[Held]]:
    made: list[Held] = []
    yield made
    for h in made:
        h.stop()


WITHOUT_ADMIN = ("setpriv", "--bounding-set=-net_admin,-sys_admin", "--inh-caps=-all")


def cli(*argv: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, *WRAPPER, *argv], capture_output=True, text=True, timeout=60)


def check_cut(
    network: Network, held: list[Held], family: int, port: int, ban: list[str]
) -> tuple[float, str]:
    """Hold a connection from each host, run ``ban`` (banning the denied host), and check
    what each connection became.  Returns the time from the ban's start to the RST, and
    the ban's stdout."""
    kept = Held(network.allowed, family, port)
    cut = Held(network.denied, family, port)
    held += [kept, cut]
    started = time.monotonic()
    out = cli(*ban)
    assert out.returncode == 0, out.stderr
    assert "not reset" not in out.stderr, out.stderr
    ended = cut.ended(timeout=5)
    assert ended[:1] == ["reset"], (ended, out.stdout, out.stderr)
    took = float(ended[1]) - started
    assert took < 1.0, took
    assert kept.again() == "echo"
    assert kept.ended(timeout=0.2) == []
    return took, out.stdout


@pytest.mark.parametrize("family", [4, 6])
def test_a_runtime_deny_resets_the_denied_hosts_connection(
    network: Network, services: list[Service], held: list[Held], family: int
) -> None:
    service = f"cut-deny-{family}-{os.getpid()}"
    start_echo(network, services, service)
    denied = network.denied.v4 if family == 4 else network.denied.v6
    took, out = check_cut(network, held, family, 8080, ["deny", service, denied])
    assert "reset 1 connection(s)" in out, out
    print(f"deny to RST: {took * 1000:.0f} ms")


@pytest.mark.parametrize("family", [4, 6])
def test_set_add_resets_the_banned_hosts_connection(
    network: Network, services: list[Service], held: list[Held], family: int
) -> None:
    name = f"cut{family}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    assert cli("set", "create", name).returncode == 0
    try:
        service = f"cut-set-{family}-{os.getpid()}"
        start_echo(network, services, service, "--deny-set", name)
        denied = network.denied.v4 if family == 4 else network.denied.v6
        took, out = check_cut(network, held, family, 8080, ["set", "add", name, denied])
        assert "reset 1 connection(s)" in out, out
        print(f"set add to RST: {took * 1000:.0f} ms")
    finally:
        cli("set", "destroy", name)


def test_a_runtime_allow_inside_the_deny_keeps_its_connection(
    network: Network, services: list[Service], held: list[Held]
) -> None:
    """A deny of a whole network cuts nobody the program still passes: a runtime allow
    of the host, more specific, decides (runtime.c)."""
    service = f"cut-allow-{os.getpid()}"
    start_echo(network, services, service)
    assert cli("allow", service, network.denied.v4).returncode == 0
    kept = Held(network.denied, 4, 8080)
    held.append(kept)
    out = cli("deny", service, network.denied.v4.rsplit(".", 1)[0] + ".0/24")
    assert out.returncode == 0, out.stderr
    assert "reset" not in out.stdout, out.stdout
    assert kept.again() == "echo"


def test_a_ban_that_cannot_cut_is_in_force_and_says_so(
    network: Network, services: list[Service], held: list[Held]
) -> None:
    """Without CAP_NET_ADMIN and CAP_SYS_ADMIN (root without them) the deny is made,
    exits 0, and one line on stderr says what was not reset and why; the connection
    hangs."""
    service = f"cut-nocap-{os.getpid()}"
    svc = start_echo(network, services, service)
    hung = Held(network.denied, 4, 8080)
    held.append(hung)
    out = cli("deny", service, network.denied.v4, prefix=WITHOUT_ADMIN)
    assert out.returncode == 0, out.stderr
    assert f"deny rule for {network.denied.v4}" in out.stdout, out.stdout
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "were not reset" in lines[0], out.stderr
    assert "CAP_NET_ADMIN" in lines[0], out.stderr
    print(lines[0])
    assert hung.ended(timeout=1.0) == []
    check_policy(svc, served=[Probe(network.allowed, "tcp", 4, 8080)],
                 dropped=[Probe(network.denied, "tcp", 4, 8080)])  # fmt: skip
