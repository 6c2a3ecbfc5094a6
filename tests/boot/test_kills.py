"""The boot tier: the shipped echo unit, under a booted systemd, killed while it starts,
at each crash point (faults.py) and at seeded random moments; systemd starts it again
(Restart=on-failure), and with real traffic from outside the guest the allowed host is
served, the denied one dropped, and nothing the denied host queued before the first
start reached the service.

The only drop-in is the crash point itself (ALFWRAPPER_CRASH_AT=POINT@DIR: the first
start dies there, the one after gets past), never a unit's sandboxing."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest
from helpers.guest import (
    ALLOW4,
    DENY4,
    DENY6,
    FIRST,
    GUEST4,
    GUEST6,
    Guest,
    served_and_dropped,
    stop,
)

pytestmark = pytest.mark.boot

ECHO = "alfwrapper-echo.service"
POINTS = ("pinned", "attached", "loaded", "installed", "judged", "described")
SEED = 20261123
RANDOM_KILLS = 5  # 50 more under a supervisor: tests/netns/test_crash.py
GUEST4B = "198.51.100.2"


@pytest.fixture
def echo(guest: Guest) -> Iterator[Guest]:
    yield guest
    guest.run(
        f"rm -rf /run/systemd/system/{ECHO}.d /sys/fs/bpf/alfcrash-* && systemctl daemon-reload"
    )
    stop(guest, "alfwrapper-echo.socket", ECHO)


def queue_attacks(g: Guest) -> None:
    """Before the service starts: the denied host leaves connections queued (one that
    sends and resets, one that sends and stays), and a datagram."""
    for source, address in ((DENY4, GUEST4B), (DENY6, GUEST6)):
        g.client("tcp", source, address, "8080", "0.5", "EVIL-TCP")
        g.client("udp", source, address, "8080", "0.5", "EVIL-UDP")


def nothing_denied_received(g: Guest) -> None:
    log = g.run(f"journalctl -b -u {ECHO} -o cat --no-pager")
    assert "EVIL" not in log and DENY4 not in log and DENY6 not in log, log


@pytest.mark.parametrize("point", POINTS)
def test_a_kill_at_every_point_leaves_the_socket_filtered(echo: Guest, point: str) -> None:
    g = echo
    g.run(
        f"mkdir -p /run/systemd/system/{ECHO}.d && printf '[Service]\\n"
        f"Environment=ALFWRAPPER_CRASH_AT={point}@/sys/fs/bpf/alfcrash-{point}\\n' > "
        f"/run/systemd/system/{ECHO}.d/crash.conf && systemctl daemon-reload && "
        "systemctl start alfwrapper-echo.socket"
    )
    queue_attacks(g)  # the first of them starts the service
    # Its first start died at the point; systemd started it again.
    served_and_dropped(g, ECHO, 8080)
    assert g.run(f"test -d /sys/fs/bpf/alfcrash-{point} && echo died").strip() == "died"
    killed = g.run(f"journalctl -b -u {ECHO} -o cat --no-pager | grep -c 'status=9/KILL' || true")
    assert int(killed) >= 1, g.journal(ECHO)
    nothing_denied_received(g)


def test_seeded_random_kills_leave_the_socket_filtered(echo: Guest) -> None:
    """The service killed (systemctl kill -s KILL) at a random moment of its first
    seconds, RANDOM_KILLS times; systemd starts it again each time."""
    g = echo
    rng = random.Random(SEED)
    g.run("systemctl start alfwrapper-echo.socket")
    for _ in range(RANDOM_KILLS):
        queue_attacks(g)
        g.client("tcp", ALLOW4, GUEST4, "8080", "0.2")  # starts the service
        time.sleep(rng.uniform(0.0, 3.0))  # the random moment itself
        g.run(f"systemctl kill --signal=SIGKILL {ECHO}", check=False)
        served_and_dropped(g, ECHO, 8080, udp=False, first=FIRST)
        nothing_denied_received(g)
        g.run(f"systemctl reset-failed {ECHO}", check=False)  # the start limit is not tested here
