"""Interfaces, knocking, developer filters and their composition, with real traffic."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.hosts import (
    Host,
    Network,
    Probe,
    Service,
    all_probes,
    check_policy,
    ifindex,
    ip,
    link_hosts,
    mac,
)
from helpers.support import PROGRAMS, ROOT, WRAPPER
from helpers.wrapping import allowed_in_denied_out, knock, start, wrapped

from alfwrapper.policy.knocking import secret_ports, utc_window

pytestmark = pytest.mark.netns

SOCKETS = ["--listen", "[::]:8080", "--listen-datagram", "[::]:8081"]
SEQ = "7001,7002,7003"


def wait_served(
    host: Host, svc: Service, proto: str, family: int, port: int, timeout: float = 15.0
) -> None:
    deadline = time.monotonic() + timeout
    while host.probe(proto, family, port, "wait", 1.0) != "echo":
        assert time.monotonic() < deadline, f"never served again: {svc.errors()}"


# -- interfaces ------------------------------------------------------------


def test_interface_allow_list(network: Network, services: list[Service]) -> None:
    svc = start(network, services, wrapped(*SOCKETS, "--interface", network.allowed.server_if))
    allowed_in_denied_out(svc, network)


def test_unknown_interface_is_an_error(network: Network, services: list[Service]) -> None:
    out = subprocess.run(
        network.server.command([*WRAPPER, *SOCKETS, "--interface", "wg9", "--", "true"]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 78
    assert "--interface wg9: no such interface here" in out.stderr


def test_interface_rule_follows_the_name(network: Network, services: list[Service]) -> None:
    server, a = network.server, network.allowed
    svc = start(network, services, wrapped(*SOCKETS, "--interface", a.server_if))
    allowed_in_denied_out(svc, network, udp=None)
    # Live traffic from A all along: one datagram every 50 ms, at most 600 of them.
    sender = subprocess.Popen(
        a.command(
            [
                sys.executable,
                "-c",
                (
                    "import socket, time\n"
                    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                    "for i in range(600):\n"
                    "    try: s.sendto(b'live-%d\\n' % i, ('192.0.2.1', 8081))\n"
                    "    except OSError: pass\n"
                    "    time.sleep(0.05)\n"
                ),
            ]
        )
    )
    try:
        svc.wait_for(r"^udp unknown 192\.0\.2\.2 live-")
        old = ifindex(server, a.server_if)
        ip("-n", server.netns, "link", "del", a.server_if)
        # Another interface takes the old index under another name: not allowed.
        impostor = Host(f"{server.netns}c")
        ip("netns", "add", impostor.netns)
        network.names.append(impostor.netns)
        link_hosts(
            server,
            impostor,
            f"{server.netns}c0",
            f"{server.netns}c1",
            "203.0.113",
            "2001:db8:c",
            index=old,
        )
        assert ifindex(server, f"{server.netns}c0") == old
        check_policy(svc, served=[], dropped=all_probes(impostor, 8080, 8081))
        # The allowed name comes back with a new index: allowed again, no restart.
        link_hosts(server, a, a.server_if, a.link, "192.0.2", "2001:db8:a")
        assert ifindex(server, a.server_if) != old
        marker = len(svc.output())
        wait_served(a, svc, "tcp", 4, 8080)
        deadline = time.monotonic() + 10
        while "live-" not in svc.output()[marker:]:
            assert time.monotonic() < deadline, "live traffic did not come back"
            time.sleep(0.05)
        check_policy(
            svc,
            served=all_probes(a, 8080, 8081),
            dropped=all_probes(impostor, 8080, 8081) + all_probes(network.denied, 8080),
        )
    finally:
        sender.kill()
        sender.wait()


def test_watcher_is_small_named_and_exits_with_the_application(
    network: Network, services: list[Service]
) -> None:
    """ps shows the watcher as `alfwrapper-watch SERVICE`; it has no BCC or LLVM mapped
    and stays small; it exits when the application does."""
    name = network.allowed.server_if
    options = ["--service", "watched1", "--listen", "[::]:8080", "--interface", name]
    svc = start(network, services, wrapped(*options))
    pattern = "^alfwrapper-watch watched1$"
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    assert found.returncode == 0, found
    pid = int(found.stdout.split()[0])
    shown = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True)
    assert shown.stdout.strip() == "alfwrapper-watch watched1", shown.stdout
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "libbcc" not in maps and "libLLVM" not in maps and "libclang" not in maps
    rss = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    print(f"interface watcher RSS: {rss / 1024:.1f} MiB")
    assert rss < 48 * 1024, f"{rss} KiB"
    svc.stop()
    deadline = time.monotonic() + 10
    while subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the interface watcher outlived the application"
        time.sleep(0.05)


# -- knocking --------------------------------------------------------------


def test_knock_opens_for_the_knocker_only(network: Network, services: list[Service]) -> None:
    a, b = network.allowed, network.denied
    svc = start(network, services, wrapped(*SOCKETS, "--knock", SEQ))
    check_policy(svc, served=[], dropped=all_probes(a, 8080, 8081) + all_probes(b, 8080, 8081))
    knock(a, 4, "--sequence", SEQ)
    # Knock state is per source address, and shared by sockets with the same rules.
    check_policy(
        svc,
        served=[Probe(a, "tcp", 4, 8080), Probe(a, "udp", 4, 8081)],
        dropped=[Probe(a, "tcp", 6, 8080), *all_probes(b, 8080, 8081)],
    )
    knock(a, 6, "--sequence", SEQ, "--udp", port=8081)  # a UDP knock, on the UDP socket
    check_policy(svc, served=[Probe(a, "udp", 6, 8081)], dropped=all_probes(b, 8080, 8081))


def test_knock_in_wrong_order_fails(network: Network, services: list[Service]) -> None:
    a = network.allowed
    svc = start(network, services, wrapped(*SOCKETS, "--knock", SEQ))
    knock(a, 4, "--sequence", "7002,7001,7003")
    knock(a, 6, "--sequence", "7001,7002,7004")
    check_policy(svc, served=[], dropped=[Probe(a, "tcp", 4, 8080), Probe(a, "tcp", 6, 8080)])
    knock(a, 4, "--sequence", SEQ)  # a complete sequence still works afterwards
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[])


def test_knock_step_timeout(network: Network, services: list[Service]) -> None:
    a = network.allowed
    svc = start(network, services, wrapped(*SOCKETS, "--knock", SEQ, "--knock-timeout", "1"))
    knock(a, 4, "--sequence", "7001")
    time.sleep(1.5)  # longer than --knock-timeout, on purpose
    knock(a, 4, "--sequence", "7002,7003")
    check_policy(svc, served=[], dropped=[Probe(a, "tcp", 4, 8080)])


def test_knock_window_expires_but_connections_stay(
    network: Network, services: list[Service]
) -> None:
    a = network.allowed
    svc = start(network, services, wrapped(*SOCKETS, "--knock", SEQ, "--knock-open-for", "2"))
    knock(a, 4, "--sequence", SEQ)
    out = subprocess.run(
        a.command([sys.executable, str(PROGRAMS / "long_client.py"), a.server_v4, "8080", "2.5"]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    # first exchange, the same connection after the window closed, a new connection
    assert out.stdout.split() == ["echo", "echo", "timeout"], out.stdout + out.stderr
    assert svc.received("tcp", a.v4, "long-second")
    assert not svc.received("tcp", a.v4, "long-new")


def test_knock_with_ncat_source_port(network: Network, services: list[Service]) -> None:
    a = network.allowed
    svc = start(network, services, wrapped(*SOCKETS, "--knock", SEQ))
    for port in SEQ.split(","):
        # ncat retransmits its SYN until -w runs out; a repeated knock is ignored.
        subprocess.run(
            a.command(["ncat", "-w", "1", "-p", port, a.server_v4, "8080"]),
            capture_output=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(a, "tcp", 6, 8080)])


def test_knock_through_a_port_randomising_nat(network: Network, services: list[Service]) -> None:
    """docs/knocking.md's note on NAT: behind `masquerade fully-random` each knock leaves from a
    random source port, so the knock fails and the connection after it is dropped, and
    the client says that a NAT may be why.  The same knock over IPv6, which that NAT
    leaves alone, works (IPv4 would reuse the NAT's conntrack entries of the knocks)."""
    a = network.allowed
    svc = start(network, services, wrapped(*SOCKETS, "--knock", SEQ))
    nat = ["nft", "-f", "-"]
    rules = (
        "table ip alfnat {\n chain post {\n  type nat hook postrouting priority 100;\n"
        f"  oifname {a.link} masquerade fully-random\n }}\n}}\n"
    )
    subprocess.run(a.command(nat), input=rules, text=True, check=True, capture_output=True)
    try:
        out = subprocess.run(
            a.command([*WRAPPER, "knock", a.server_v4, "8080", "--sequence", SEQ]),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0 and "knocked" in out.stdout, out.stderr
        assert "a NAT that rewrites source ports" in out.stderr, out.stderr
        check_policy(svc, served=[], dropped=[Probe(a, "tcp", 4, 8080)])
    finally:
        subprocess.run(a.command(["nft", "delete", "table", "ip", "alfnat"]), check=True)
    knock(a, 6, "--sequence", SEQ)
    check_policy(svc, served=[Probe(a, "tcp", 6, 8080)], dropped=[Probe(a, "tcp", 4, 8080)])


def test_a_knocked_source_stays_admitted_across_a_restart(
    network: Network, services: list[Service]
) -> None:
    """The knock state is pinned in the service's folder (and a start's own gc keeps it:
    it once ran before the start's meta named it, and took it), so a source that
    knocked is still admitted by the next start of the service."""
    from alfwrapper import state  # noqa: PLC0415

    a = network.allowed
    argv = wrapped(
        "--service", "knockpin", "--listen", "[::]:8080", "--knock", SEQ, "--knock-open-for", "60"
    )
    svc = start(network, services, argv)
    folder = state.store_in_use().sockets_of("knockpin")[0].service_dir
    assert sorted(p.name for p in folder.glob("knock-*/*")) == ["state", "used"]
    knock(a, 4, "--sequence", SEQ)
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(a, "tcp", 6, 8080)])
    svc.stop()
    svc = start(network, services, argv)
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(a, "tcp", 6, 8080)])


def test_spoofed_knock_flood_does_not_lock_out(network: Network, services: list[Service]) -> None:
    a, b = network.allowed, network.denied
    svc = start(network, services, wrapped(*SOCKETS, "--knock", SEQ))
    flood = subprocess.Popen(
        b.command(
            [
                sys.executable,
                str(PROGRAMS / "flood.py"),
                b.link,
                mac(b, b.link),
                mac(network.server, b.server_if),
                b.server_v6,
                "8080",
                "7001",
                "100000",
            ]
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.5)  # A knocks in the middle of the flood
        knock(a, 4, "--sequence", SEQ)
        out, _ = flood.communicate(timeout=90)
    finally:
        flood.kill()
    assert out.strip() == "sent 100000"
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(b, "tcp", 6, 8080)])


def test_secret_knock_rotates_and_cannot_be_replayed(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    a, b = network.allowed, network.denied
    secret = tmp_path / "knock.secret"
    secret.write_text("correct horse battery staple, but longer\n")
    svc = start(
        network, services, wrapped(*SOCKETS, "--knock-secret", str(secret), "--knock-window", "5")
    )
    # The sequence of a window well past: dead.
    stale = secret_ports(secret.read_bytes().strip(), utc_window(5) - 4, 3)
    knock(a, 4, "--sequence", ",".join(map(str, stale)))
    check_policy(svc, served=[], dropped=[Probe(a, "tcp", 4, 8080)])
    # The current one, derived by the client from the same secret: open.
    sent = knock(a, 6, "--secret", str(secret), "--window", "5")
    check_policy(svc, served=[Probe(a, "tcp", 6, 8080)], dropped=[Probe(a, "tcp", 4, 8080)])
    # Replayed by someone who saw it: each window's sequence opens the door once.
    knock(b, 4, "--sequence", sent)
    check_policy(svc, served=[], dropped=[Probe(b, "tcp", 4, 8080)])


# -- developer-defined filters ----------------------------------------------

ALLOWLIST = str(ROOT / "tests/data/allowlist.c")


def sets(*entries: str) -> list[str]:
    """--set options from "MAP KEY VALUE" strings."""
    return [word for entry in entries for word in ("--set", *entry.split())]


@pytest.mark.parametrize("source", [ALLOWLIST, str(ROOT / "examples/filters/allowlist.c")])
def test_custom_filter_with_set(network: Network, services: list[Service], source: str) -> None:
    # The test data reads ports at offset 0; the shipped template uses alf_parse_packet.
    a, b = network.allowed, network.denied
    svc = start(
        network,
        services,
        wrapped(
            *SOCKETS,
            "--filter",
            source,
            *sets(
                "allowed4 192.0.2.2 1",
                "allowed6 2001:db8:a::2 1",
                "port_limits 0 8080,1",
                "port_limits 1 8081,1",
            ),
        ),
    )
    check_policy(svc, served=all_probes(a, 8080, 8081), dropped=all_probes(b, 8080, 8081))


def test_custom_filter_port_limit_matters(network: Network, services: list[Service]) -> None:
    a = network.allowed
    svc = start(
        network,
        services,
        wrapped(
            *SOCKETS,
            "--filter",
            ALLOWLIST,
            *sets("allowed4 192.0.2.2 1", "port_limits 0 8080,1", "port_limits 1 8081,0"),
        ),
    )
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(a, "udp", 4, 8081)])


def run_wrapper(*options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WRAPPER, "--listen", "127.0.0.1:8095", *options, "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_set_errors(bpf_root: None) -> None:
    cases = [
        (
            ("--set", "nosuch", "1", "1"),
            "--set nosuch",
            "has no map 'nosuch'",
            "allowed4, allowed6, port_limits",
        ),
        (
            ("--set", "allowed4", "2001:db8::1", "1"),
            "--set allowed4",
            "key '2001:db8::1' does not fit u32",
        ),
        (
            ("--set", "allowed6", "2001:db8::1", "300"),
            "--set allowed6",
            "value '300' does not fit u8: 300 does not fit in u8",
        ),
        (
            ("--set", "port_limits", "0", "8080"),
            "--set port_limits",
            "struct {u16 port, u8 open} has 2",
        ),
        (
            ("--set", "port_limits", "9", "8080,1"),
            "--set port_limits",
            "the kernel refused the entry",
        ),
        (("--set", "subnet_roots", "0", "1"), "--set subnet_roots", "has no map"),
    ]
    for options, *needles in cases:
        out = run_wrapper("--filter", ALLOWLIST, *options)
        assert out.returncode == 64, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        for needle in needles:
            assert needle in out.stderr, out.stderr


def test_set_without_filter(bpf_root: None) -> None:
    out = run_wrapper("--set", "m", "1", "1")
    assert out.returncode == 64
    assert "--set: no --filter" in out.stderr


def test_filter_without_entry(bpf_root: None, tmp_path: Path) -> None:
    path = tmp_path / "noentry.c"
    path.write_text('#include "common.h"\nint other(struct __sk_buff *skb) { return 0; }\n')
    out = run_wrapper("--filter", str(path))
    assert out.returncode == 65
    assert f"{path}:1: needs exactly one entry function" in out.stderr


# -- composition -----------------------------------------------------------


def test_subnet_interface_knock_each_matter(network: Network, services: list[Service]) -> None:
    a, b = network.allowed, network.denied
    # Both IPv4 networks allowed, IPv6 not; only A's interface; knocking on top.
    svc = start(
        network,
        services,
        wrapped(
            *SOCKETS,
            "--allow",
            "192.0.2.0/24",
            "--allow",
            "198.51.100.0/24",
            "--interface",
            a.server_if,
            "--knock",
            SEQ,
        ),
    )
    check_policy(svc, served=[], dropped=[Probe(a, "tcp", 4, 8080)])  # no knock yet
    knock(b, 4, "--sequence", SEQ)  # B: subnet fine, knock fine, wrong interface
    knock(a, 6, "--sequence", SEQ)  # A over IPv6: interface fine, subnet not
    check_policy(svc, served=[], dropped=[Probe(b, "tcp", 4, 8080), Probe(a, "tcp", 6, 8080)])
    knock(a, 4, "--sequence", SEQ)  # all three pass
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[])


def test_rules_per_named_socket(network: Network, services: list[Service]) -> None:
    a, b = network.allowed, network.denied
    svc = start(
        network,
        services,
        wrapped(
            "--listen",
            "[::]:8080",
            "--name",
            "web",
            "--listen",
            "[::]:8082",
            "--name",
            "admin",
            "--deny",
            "203.0.113.0/24",
            "--allow",
            "admin=192.0.2.0/24",
        ),
    )
    check_policy(
        svc,
        served=[Probe(b, "tcp", 4, 8080), Probe(a, "tcp", 4, 8082)],
        dropped=[Probe(b, "tcp", 4, 8082)],
    )


def test_socket_without_rules_passes_everything(network: Network, services: list[Service]) -> None:
    # It still gets the dispatcher, so that a reload can give it rules later.
    b = network.denied
    svc = start(
        network,
        services,
        wrapped(
            "--service",
            "norules",
            "--listen",
            "[::]:8080",
            "--name",
            "web",
            "--listen",
            "[::]:8082",
            "--name",
            "admin",
            "--allow",
            "admin=192.0.2.0/24",
        ),
    )
    assert "'web' has no rules: every packet passes until a reload gives it rules" in (svc.errors())
    check_policy(svc, served=[Probe(b, "tcp", 4, 8080)], dropped=[Probe(b, "tcp", 4, 8082)])
    out = subprocess.run(
        network.server.command(
            [*WRAPPER, "reload", "norules", "--allow", "admin=192.0.2.0/24", "--deny",
             "web=198.51.100.0/24"]
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    check_policy(svc, served=[], dropped=[Probe(b, "tcp", 4, 8080), Probe(b, "tcp", 4, 8082)])


def test_rules_for_an_unknown_socket_name(bpf_root: None) -> None:
    out = run_wrapper("--allow", "admin=192.0.2.0/24")
    assert out.returncode == 64
    assert "rules for admin: no socket has that name" in out.stderr


def test_readme_knocking_example(network: Network) -> None:
    # examples/knock.sh is docs/knocking.md's example, with its own checks.
    out = subprocess.run(
        network.server.command([str(ROOT / "examples/knock.sh")]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "knocking works with alfwrapper knock and with ncat" in out.stdout
