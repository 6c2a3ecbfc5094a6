"""The denied client against the activation race: whatever it queued before the filter
existed (established, half-closed, reset, half-open connections; datagrams) never reaches
the application, with every kind of rule.

The sockets are made by a socket unit in miniature (activate.py): it listens, the
attacks are queued, and only then does it exec the wrapper, as systemd does.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.attacks import PARTS, attack, seen_from, wait_line
from helpers.hosts import Network, Probe, Service, check_policy
from helpers.support import ECHO_SERVER, ROOT, WRAPPER

pytestmark = pytest.mark.netns

ACTIVATE = ROOT / "tests/programs/activate.py"

# With these parts, a queued connection from the allowed host can be judged, and is kept;
# a developer's filter may read any header, which a test run cannot give it (backlog.py).
JUDGED = ("subnets",)


class Activation:
    """activate.py in the server namespace, with the wrapper and the echo service behind it."""

    def __init__(self, network: Network, services: list[Service], tmp: Path, rules: list[str]):
        self.go = tmp / "go"
        argv = [
            sys.executable,
            str(ACTIVATE),
            "--go",
            str(self.go),
            "tcp:[::]:8080:web",
            "udp:[::]:8081:dns",
            "--",
            *WRAPPER,
            *rules,
            "--",
            *ECHO_SERVER,
        ]
        self.svc = Service(network.server, argv)
        services.append(self.svc)
        self.svc.wait_for(r"^listening$")

    def start(self) -> None:
        self.go.touch()
        self.svc.wait_for(r"^ready ", timeout=60)


@pytest.mark.parametrize("scenario", ["everything", "reset-only"])
@pytest.mark.parametrize("part", PARTS)
def test_nothing_queued_by_a_denied_host_reaches_the_application(
    network: Network, services: list[Service], tmp_path: Path, part: str, scenario: str
) -> None:
    a, b = network.allowed, network.denied
    rules = [r.format(allowed_if=a.server_if) for r in PARTS[part]]
    act = Activation(network, services, tmp_path, rules)
    release = tmp_path / "release"
    # Reset connections alone: gone from what sock_diag lists, yet queued with their data.
    attacks = [
        attack(b, "tcp", "rst", b.server_v4, "8080", "EVIL-RST-4"),
        attack(b, "tcp", "rst", b.server_v6, "8080", "EVIL-RST-6"),
    ]
    if scenario == "everything":  # all the denied host can leave queued before the filter
        attacks += [
            attack(b, "tcp", "fin", b.server_v4, "8080", "EVIL-FIN-4", "6"),
            attack(b, "tcp", "open", b.server_v6, "8080", "EVIL-OPEN-6", "6"),
            attack(b, "halfopen", b.server_v4, "8080", "EVIL-HALF-4", str(release), "8"),
            attack(b, "raw", "4", b.v4, b.server_v4, "udp", "8081", "EVIL-UDP-4", "ipopt"),
            attack(b, "raw", "6", b.v6, b.server_v6, "udp", "8081", "EVIL-UDP-6", "hbh"),
            # The allowed host's IPv4 address, as an IPv4-mapped IPv6 source.
            attack(b, "raw", "6", "::ffff:192.0.2.2", b.server_v6, "udp", "8081", "EVIL-MAP"),
        ]
    for proc in attacks:
        assert wait_line(proc) in ("connected", "sent"), proc.communicate(timeout=10)
    # Then an allowed client: queued behind every denied one.
    late = subprocess.Popen(
        a.command(
            [
                sys.executable,
                str(ROOT / "tests/programs/client.py"),
                "tcp",
                a.server_v4,
                "8080",
                "allowed-late",
                "30",
            ]
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.3)
    act.start()
    release.touch()
    for proc in attacks:
        proc.communicate(timeout=60)
    late_result, _ = late.communicate(timeout=60)
    # Whatever was queued has been dealt with by now; new traffic meets the filter.
    if part in JUDGED:
        check_policy(act.svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(b, "tcp", 4, 8080)])
        assert late_result.strip() == "echo", act.svc.errors()
    assert not seen_from(act.svc, b.v4, b.v6), act.svc.output()
    assert "EVIL" not in act.svc.output()
    assert "arrived before the filter; removed" in act.svc.errors()
    assert "Traceback" not in act.svc.errors()


def test_two_listeners_on_one_port_judge_their_own_queues(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """0.0.0.0:P and a v6-only [::]:P (BindIPv6Only=ipv6-only): a denied peer's reset
    connection waits on the IPv4 listener while an allowed one waits on the IPv6
    listener.  Each listener counts only its own: the reset one is found and removed."""
    a, b = network.allowed, network.denied
    go = tmp_path / "go"
    argv = [sys.executable, str(ACTIVATE), "--go", str(go), "tcp:0.0.0.0:8080:four",
            "tcp6only:[::]:8080:six", "--", *WRAPPER, "--allow", "192.0.2.0/24",
            "--allow", "2001:db8:a::/48", "--", *ECHO_SERVER]  # fmt: skip
    svc = Service(network.server, argv)
    services.append(svc)
    svc.wait_for(r"^listening$")
    for proc in (
        attack(b, "tcp", "rst", b.server_v4, "8080", "EVIL-RST-4"),
        attack(a, "tcp", "open", a.server_v6, "8080", "GOOD-6", "8"),
    ):
        assert wait_line(proc) in ("sent", "connected")
    go.touch()
    svc.wait_for(r"^ready ", timeout=60)
    check_policy(
        svc,
        served=[Probe(a, "tcp", 4, 8080), Probe(a, "tcp", 6, 8080)],
        dropped=[Probe(b, "tcp", 4, 8080), Probe(b, "tcp", 6, 8080)],
    )
    assert "EVIL" not in svc.output() and not seen_from(svc, b.v4, b.v6), svc.output()


def test_allowed_clients_arriving_during_the_start_hide_no_reset_connection(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """Denied peers send and reset before the start; an allowed client connects 20 times
    a second all through it.  Those arrivals are counted after the listing, so they can
    only make the wrapper remove more: no denied byte reaches the application."""
    a, b = network.allowed, network.denied
    act = Activation(
        network, services, tmp_path, ["--allow", "192.0.2.0/24", "--allow", "2001:db8:a::/48"]
    )
    for i in range(3):
        for address in (b.server_v4, b.server_v6):
            assert wait_line(attack(b, "tcp", "rst", address, "8080", f"EVIL-{i}")) == "sent"
    flow = attack(a, "stream", a.server_v4, "8080", "20", "6", "allowed")
    act.start()
    assert flow.communicate(timeout=60)[0].startswith("sent")
    check_policy(act.svc, served=[Probe(a, "tcp", 6, 8080)], dropped=[Probe(b, "tcp", 4, 8080)])
    assert "EVIL" not in act.svc.output() and not seen_from(act.svc, b.v4, b.v6), act.svc.output()
    assert "allowed-" in act.svc.output()  # the stream was served once the filter was in


def test_a_developer_filter_is_not_judged_on_made_up_headers(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """A developer's filter that drops IPv4 datagrams with IP options: one queued before
    the start, from an address the filter otherwise passes, never reaches the
    application (a test run on made-up headers would pass it: the queue is removed);
    one sent after the start is dropped by the filter itself."""
    a = network.allowed
    act = Activation(
        network, services, tmp_path, ["--filter", str(ROOT / "tests/data/no_options.c")]
    )
    queued = attack(a, "raw", "4", a.v4, a.server_v4, "udp", "8081", "EVIL-OPT-Q", "ipopt")
    assert wait_line(queued) == "sent"
    act.start()
    assert "removed 1 that could not be judged" in act.svc.errors(), act.svc.errors()
    late = attack(a, "raw", "4", a.v4, a.server_v4, "udp", "8081", "EVIL-OPT-L", "ipopt")
    assert wait_line(late) == "sent"
    check_policy(act.svc, served=[Probe(a, "udp", 4, 8081)], dropped=[])
    assert "EVIL-OPT" not in act.svc.output(), act.svc.output()
