"""Single-packet authorization with real traffic between namespace hosts: through a NAT
that rewrites source ports (where port-sequence knocking fails), replays from the same
host and from another, a restart, and a flood of forged datagrams and replays."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.hosts import Host, Network, Probe, Service, check_policy, ip, link_hosts
from helpers.support import PROGRAMS, WRAPPER
from helpers.wrapping import start, wrapped

from alfwrapper.policy import spa

pytestmark = pytest.mark.netns

SEQ = "7001,7002,7003"
SPA = ["--knock-spa", "--knock-window", "5"]  # a short first window (wait_for_the_door)
SECRET = b"a knock secret for SPA, long enough\n"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "spa.secret"
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


@pytest.fixture
def laptop(network: Network) -> Iterator[Host]:
    """A host behind a NAT: 203.0.113.2 on a network of its own, routed through the
    allowed host, which masquerades it to the server as its own 192.0.2.2 with fully
    random source ports (a home router, carrier-grade NAT, a cloud NAT gateway)."""
    router = network.allowed
    inner = Host(f"{router.netns}n")
    ip("netns", "add", inner.netns)
    network.names.append(inner.netns)  # the network fixture removes it
    ip("-n", inner.netns, "link", "set", "lo", "up")
    link_hosts(router, inner, f"{inner.netns}0", f"{inner.netns}1", "203.0.113", "2001:db8:c")
    ip("-n", inner.netns, "route", "add", "default", "via", "203.0.113.1")
    subprocess.run(router.command(["sysctl", "-qw", "net.ipv4.ip_forward=1"]), check=True)
    rules = (
        "table ip alfspanat {\n chain post {\n  type nat hook postrouting priority 100;\n"
        f"  ip saddr 203.0.113.0/24 oifname {router.link} masquerade fully-random\n }}\n}}\n"
    )
    subprocess.run(router.command(["nft", "-f", "-"]), input=rules, text=True, check=True)
    inner.server_v4 = router.server_v4  # the server, reached through the router
    inner.v4 = router.v4  # as the server sees it (what the application logs)
    yield inner


def knock_spa(host: Host, *how: str, port: int = 8080) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        host.command([*WRAPPER, "knock", host.server_v4, str(port), "--spa", *how]),
        capture_output=True,
        text=True,
        timeout=60,
    )


def send_raw(host: Host, datagrams: list[bytes], port: int = 8080, count: int = 1) -> None:
    """Each datagram ``count`` times from ``host`` to the server's SPA port (IPv4)."""
    code = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"for raw in {[d.hex() for d in datagrams]!r}:\n"
        f"    for _ in range({count}):\n"
        f"        s.sendto(bytes.fromhex(raw), ({host.server_v4!r}, {port}))\n"
    )
    subprocess.run(host.command([sys.executable, "-c", code]), check=True, timeout=300)


def status(service: str, *how: str) -> str:
    out = subprocess.run(
        [*WRAPPER, "status", service, *how], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def spa_counts(service: str) -> dict[str, int]:
    sockets = json.loads(status(service, "--json"))["services"][0]["sockets"]
    counts = [s["spa"] for s in sockets if s["name"].endswith(".spa")]
    assert len(counts) == 1, sockets
    return counts[0]


def spa_table(service: str) -> tuple[int, int, int]:
    """The service's SPA table's knock_spa_since: since when it takes datagrams (UTC ns),
    the widest window of the programs sharing it (s), and when it was made (UTC ns)."""
    from alfwrapper.host import bpf_calls  # noqa: PLC0415

    fd = bpf_calls.obj_get(_pins(service, "spa_since")[0], True)
    try:
        since, widest, made = (
            int.from_bytes(
                bpf_calls.map_lookup(fd, i.to_bytes(4, "little"), 8) or bytes(8), "little"
            )
            for i in (0, 1, 2)
        )
    finally:
        os.close(fd)
    return since, widest, made


def wait_for_the_door(service: str, most: float = 6) -> None:
    """Until the service's SPA table takes datagrams: a table takes none sent in the
    window after it was made (knock_spa_since), which a start shortens here with
    --knock-window 5 (one a lost table could have taken)."""
    wait = (spa_table(service)[0] - time.time_ns()) / 1e9 + 0.1
    assert wait < most, wait
    time.sleep(max(0.0, wait))


def test_spa_opens_from_behind_a_port_randomising_nat(
    network: Network, services: list[Service], secret: Path, laptop: Host
) -> None:
    svc = start(
        network,
        services,
        wrapped(
            "--service",
            "spanat",
            "--listen",
            "[::]:8080",
            "--knock-secret",
            str(secret),
            *SPA,
        ),
    )
    behind = Probe(laptop, "tcp", 4, 8080)
    check_policy(svc, served=[], dropped=[behind])
    # In its first window the service refuses every datagram as stale: status says
    # until when, and the client's failure names that too.
    since = spa_table("spanat")[0] / 1e9
    at = time.strftime("%H:%M:%S", time.gmtime(since))
    assert f"it takes those sent from {at} UTC" in status("spanat"), status("spanat")
    report = json.loads(status("spanat", "--json"))["services"][0]["sockets"]
    assert [s["spa_from"] for s in report if s["spa"] is not None] == [since], report
    wait_for_the_door("spanat")
    assert "as stale" not in status("spanat")
    # Its own address is not what the server sees: it opens nothing useful, and the
    # client says why it may be so.
    out = knock_spa(laptop, "--secret", str(secret), "--wait", "2")
    assert out.returncode == 69 and "behind a NAT" in out.stderr, out.stderr
    assert "one window after its first start" in out.stderr, out.stderr
    assert "opening 203.0.113.2" in out.stdout
    check_policy(svc, served=[], dropped=[behind])
    # Its public address opens the service, through the NAT.
    out = knock_spa(laptop, "--secret", str(secret), "--address", network.allowed.v4)
    assert out.returncode == 0 and "answers" in out.stdout, out.stderr
    check_policy(svc, served=[behind], dropped=[Probe(network.denied, "tcp", 4, 8080)])
    assert spa_counts("spanat")["accepted"] == 2
    # "sender" is the policy's to allow: this one does not.
    out = knock_spa(laptop, "--secret", str(secret), "--address", "sender", "--wait", "0")
    assert out.returncode == 0, out.stderr
    assert spa_counts("spanat")["malformed"] == 1


def test_port_sequences_fail_behind_that_nat(
    network: Network, services: list[Service], laptop: Host
) -> None:
    """As docs/knocking.md says: each knock leaves the NAT from a port of its choosing."""
    svc = start(network, services, wrapped("--listen", "[::]:8080", "--knock", SEQ))
    out = subprocess.run(
        laptop.command([*WRAPPER, "knock", laptop.server_v4, "8080", "--sequence", SEQ]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    check_policy(svc, served=[], dropped=[Probe(laptop, "tcp", 4, 8080)])


def test_a_datagram_opens_once_and_replays_open_nothing(
    network: Network, services: list[Service], secret: Path
) -> None:
    a, b = network.allowed, network.denied
    argv = ["--service", "spareplay", "--listen", "[::]:8080", "--knock-secret", str(secret),
            *SPA, "--knock-open-for", "2"]  # fmt: skip
    svc = start(network, services, wrapped(*argv))
    wait_for_the_door("spareplay")
    good = spa.datagram(SECRET.strip(), 8080, a.v4)
    send_raw(a, [good])
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(b, "tcp", 4, 8080)])
    time.sleep(2.5)  # the door closes
    # The same datagram again, from its host and from another: nothing opens.
    send_raw(a, [good])
    send_raw(b, [good])
    check_policy(svc, served=[], dropped=[Probe(a, "tcp", 4, 8080), Probe(b, "tcp", 4, 8080)])
    now = time.time_ns()
    unsound = [
        spa.datagram(SECRET.strip(), 8080, a.v4, now - 40 * 10**9),  # stale
        spa.datagram(b"not the secret, though as long", 8080, a.v4),  # forged
        good[:55],  # cut
        good + b"\0",  # padded
        bytes([good[0] ^ 1]) + good[1:],  # a bit of the magic
        good[:20] + bytes([good[20] ^ 0x80]) + good[21:],  # a bit of the nonce
    ]
    send_raw(a, unsound)
    check_policy(svc, served=[], dropped=[Probe(a, "tcp", 4, 8080)])
    counts = spa_counts("spareplay")
    assert counts == {"accepted": 1, "malformed": 3, "bad_mac": 2, "stale": 1,
                      "replayed": 2, "busy": 0}, counts  # fmt: skip
    # Restarted, the service refuses it still: as a replay where the knock state was kept,
    # as sent before the state it has now began where it was not (all of its sockets
    # gone with the old process, a gc may take it).
    svc.stop()
    svc = start(network, services, wrapped(*argv))
    send_raw(a, [good])
    check_policy(svc, served=[], dropped=[Probe(a, "tcp", 4, 8080)])
    counts = spa_counts("spareplay")
    assert counts["replayed"] + counts["stale"] == 1 and not counts["accepted"], counts
    send_raw(a, [spa.datagram(SECRET.strip(), 8080, a.v4)])
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[])


def test_a_flood_of_forgeries_and_replays_keeps_no_one_out(
    network: Network, services: list[Service], secret: Path
) -> None:
    """1,000,000 datagrams of the right form with random tags from the denied host, and
    100,000 replays of one sound datagram, while the real client knocks: it gets in,
    and what the filter remembers stays the size it was made."""
    a, b = network.allowed, network.denied
    svc = start(
        network,
        services,
        wrapped(
            "--service",
            "spaflood",
            "--listen",
            "[::]:8080",
            "--knock-secret",
            str(secret),
            *SPA,
        ),
    )
    wait_for_the_door("spaflood")
    replayed = spa.datagram(SECRET.strip(), 8080, b.v4)
    send_raw(b, [replayed])
    flood = subprocess.Popen(
        b.command([sys.executable, str(PROGRAMS / "spa_flood.py"), b.server_v4, "8080",
                   "1000000", replayed.hex(), "100000"]),
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(1)  # the client knocks in the middle of it
        for _ in range(5):  # a datagram lost to the flood is sent again, as a user would
            out = knock_spa(a, "--secret", str(secret), "--wait", "2")
            if out.returncode == 0:
                break
        assert out.returncode == 0, out.stderr
        sent, _ = flood.communicate(timeout=300)
    finally:
        flood.kill()
    assert sent.split() == ["sent", "1000000", "100000"], sent
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[])
    counts = spa_counts("spaflood")
    assert counts["bad_mac"] > 900_000 and counts["replayed"] > 90_000, counts
    assert 2 <= counts["accepted"] <= 6, counts  # the replayed one's first, and the client's
    # What it remembers: the size it was made, and a slot for each datagram it took,
    # none for the forgeries.
    from alfwrapper.host import bpf_calls  # noqa: PLC0415

    fd = bpf_calls.obj_get(_pins("spaflood", "spa_seen")[0], True)
    try:
        assert bpf_calls.map_shape(fd)[3] == 65536
        taken = sum(
            bpf_calls.map_lookup(fd, i.to_bytes(4, "little"), 8) != bytes(8) for i in range(65536)
        )
    finally:
        os.close(fd)
    assert taken == counts["accepted"], (taken, counts)


ALICE = b"alice's own SPA key, long enough\n"
BOB = b"bob's own SPA key, just as long\n"
CAROL = b"carol's own SPA key, as long again"


def client_keys(folder: Path) -> dict[str, Path]:
    """Alice's and Bob's own keys (knock-spa-key), as files only they could read."""
    keys = {}
    for name, secret in (("alice", ALICE), ("bob", BOB)):
        keys[name] = folder / f"{name}.key"
        keys[name].write_bytes(secret)
        keys[name].chmod(0o600)
    return keys


def test_one_clients_flood_under_its_own_key_keeps_no_other_client_out(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """Alice holds a key of her own and uses it against the others: 65,536 sound
    datagrams, one for every slot of the replay table, dated ahead so that they stay
    live as long as they can, sent from the denied host.  She takes her share (64 a
    window); Bob, with his own key, knocks right after with `alfwrapper knock --spa`
    and gets in.  Without the share, every slot would hold one of hers, and every knock
    of Bob's would be refused as busy until they aged out."""
    a, b = network.allowed, network.denied
    keys = client_keys(tmp_path)
    # A 20 s window, her datagrams dated 15 s ahead: sealing the ~730,000 it takes to
    # fill every slot outlasts a 5 s window on a loaded machine (all arrived stale).
    svc = start(network, services, wrapped(
        "--service", "spakeys", "--listen", "[::]:8080", "--knock-spa-key", str(keys["alice"]),
        "--knock-spa-key", str(keys["bob"]), "--knock-spa", "--knock-window", "20"))  # fmt: skip
    wait_for_the_door("spakeys", most=21)
    key, ident = spa.key_of(ALICE.strip()), spa.key_id(ALICE.strip())
    sent = time.time_ns() + 15 * 10**9  # within the 20 s window when it arrives
    ground: dict[int, bytes] = {}
    for _ in range(3_000_000):  # about 730,000 on average
        raw = spa.Datagram(8080, sent, os.urandom(spa.NONCE), b.v4, ident).sealed(key)
        ground.setdefault(int.from_bytes(raw[48:], "little") & 0xFFFF, raw)
        if len(ground) == 65536:
            break
    assert len(ground) == 65536
    (tmp_path / "sound").write_text("\n".join(raw.hex() for raw in ground.values()))
    flood = subprocess.run(
        b.command([sys.executable, str(PROGRAMS / "spa_flood.py"), b.server_v4, "8080", "0", "",
                   "0", str(tmp_path / "sound")]),
        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert flood.stdout.split()[:2] == ["sound", "65536"], flood
    for _ in range(2):  # a datagram lost to bad luck (1 in 256) is sent again
        out = knock_spa(a, "--secret", str(keys["bob"]), "--wait", "1")
        if out.returncode == 0:
            break
    assert out.returncode == 0, out.stderr
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[])
    counts = spa_counts("spakeys")
    assert sum(counts.values()) >= 65536, counts  # every one of hers arrived and was judged
    assert counts["accepted"] <= 2 * 64 + 2 and counts["busy"] >= 65536 - 2 * 64, counts


def test_a_reload_revokes_one_clients_key_and_leaves_the_others_door_open(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """Alice and Bob each hold a key of their own.  Both open the door; a reload that
    gives Carol a key in place of Bob's revokes his alone: Alice's door stays open (the
    knock state is where it was), Bob's next datagram opens nothing (bad_mac), and
    Alice's and Carol's open."""
    a, b = network.allowed, network.denied
    keys = client_keys(tmp_path)
    carol = tmp_path / "carol.key"
    carol.write_bytes(CAROL)
    argv = ["--service", "sparevoke", "--listen", "[::]:8080", *SPA, "--knock-open-for", "600",
            "--knock-spa-key", str(keys["alice"])]  # fmt: skip
    svc = start(network, services, wrapped(*argv, "--knock-spa-key", str(keys["bob"])))
    wait_for_the_door("sparevoke")
    send_raw(a, [spa.datagram(ALICE.strip(), 8080, a.v4)])
    send_raw(b, [spa.datagram(BOB.strip(), 8080, b.v4)])
    both = [Probe(a, "tcp", 4, 8080), Probe(b, "tcp", 4, 8080)]
    check_policy(svc, served=both, dropped=[])
    out = subprocess.run(
        network.server.command(
            [*WRAPPER, "reload", "sparevoke", *argv[2:], "--knock-spa-key", str(carol)]
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    check_policy(svc, served=both, dropped=[])  # what was opened stays open
    before = spa_counts("sparevoke")
    send_raw(b, [spa.datagram(BOB.strip(), 8080, "198.51.100.99")])
    send_raw(
        a,
        [spa.datagram(ALICE.strip(), 8080, "192.0.2.99"), spa.datagram(CAROL, 8080, "192.0.2.98")],
    )
    after = spa_counts("sparevoke")
    assert after["bad_mac"] - before["bad_mac"] == 1, (before, after)
    assert after["accepted"] - before["accepted"] == 2, (before, after)


def _pins(service: str, name: str) -> list[str]:
    from alfwrapper import state  # noqa: PLC0415

    sockets = state.store_in_use().sockets_of(service)
    found = sorted(sockets[0].service_dir.glob(f"knock-spa/{name}"))
    assert len(found) == 1, found
    return [str(found[0])]


ACTIVATE = PROGRAMS / "activate.py"
START_POINTS = ("pinned", "attached", "loaded", "installed", "judged", "described")


@pytest.mark.parametrize("point", START_POINTS)
def test_a_start_killed_anywhere_leaves_the_spa_door_shut(
    network: Network, services: list[Service], secret: Path, tmp_path: Path, point: str
) -> None:
    """A socket unit in miniature passes the service's socket and its SPA socket
    (FileDescriptorName=web.spa), and starts the wrapper again after a kill at each
    point of its start.  What the denied host queued before any filter (a connection,
    a forged datagram, one of the allowed host's copied off the wire) opens nothing: a
    datagram sent before the door's memory began is stale.  The SPA socket is never
    handed to the application; the allowed host's datagram, sent after, opens it
    alone, and a copy of that from the denied host opens nothing."""
    a, b = network.allowed, network.denied
    go = tmp_path / "go"
    service = f"spacrash-{point}"
    wrapper = wrapped("--service", service, "--knock-secret", str(secret), *SPA)
    sockets = ["tcp:[::]:8080:web", "udp:[::]:8080:web.spa"]
    argv = [sys.executable, str(ACTIVATE), "--go", str(go), "--supervise", "--generations", "3",
            "--crash", point, *sockets, "--", *wrapper]  # fmt: skip
    svc = Service(network.server, argv)
    services.append(svc)
    svc.wait_for(r"^listening$")
    captured = spa.datagram(SECRET.strip(), 8080, a.v4)
    send_raw(b, [captured, spa.datagram(b"forged, without the real secret", 8080, b.v4)])
    early = subprocess.Popen(b.command([sys.executable, str(PROGRAMS / "client.py"), "tcp",
                                        b.server_v4, "8080", "EVIL-EARLY", "20"]),
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(0.5)
    go.touch()
    svc.wait_for(r"^ready ")
    assert "names=web\n" in svc.output() + "\n", svc.output()  # the SPA socket not handed on
    check_policy(svc, served=[], dropped=[Probe(a, "tcp", 4, 8080), Probe(b, "tcp", 4, 8080)])
    wait_for_the_door(service)
    fresh = spa.datagram(SECRET.strip(), 8080, a.v4)
    send_raw(a, [fresh])
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(b, "tcp", 4, 8080)])
    send_raw(b, [fresh, captured])
    check_policy(svc, served=[], dropped=[Probe(b, "tcp", 4, 8080)])
    early.kill()
    assert "EVIL" not in svc.output()
    counts = spa_counts(service)
    assert (counts["accepted"], counts["replayed"], counts["bad_mac"]) == (1, 1, 1), counts
    assert counts["stale"] == 2, counts  # the copy, queued before, and again after


def test_spa_without_pinned_state_is_refused(bpf_root: None, secret: Path, tmp_path: Path) -> None:
    """The SPA socket opens what the service's sockets read, in their shared pinned knock
    state: a start that cannot pin (no BPF file system here) is refused, and the
    application never starts."""
    mark = tmp_path / "ran"
    script = "mount -t tmpfs none /sys/fs/bpf && exec " + " ".join(
        [
            *WRAPPER,
            "--listen",
            "127.0.0.1:8094",
            "--knock-secret",
            str(secret),
            "--knock-spa",
            "--",
            "touch",
            str(mark),
        ]
    )
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 64 and not mark.exists(), out.stderr
    assert out.stderr.count("\n") == 1 and "cannot keep" in out.stderr, out.stderr


def test_sockets_of_one_name_share_one_spa_socket(
    network: Network, services: list[Service], secret: Path
) -> None:
    """A TCP and a UDP socket of one name (the echo service's) have one knock state and
    one SPA socket, at the --knock-spa-port their UDP port needs: one datagram opens
    both.  The SPA socket would go to the service's own UDP port without one, and two
    names' SPA sockets on one port are refused, before anything starts (exit 64)."""
    a, b = network.allowed, network.denied
    both = ["--listen", "[::]:8080", "--listen-datagram", "[::]:8080", "--knock-secret",
            str(secret), *SPA]  # fmt: skip
    for extra, needle in (
        ([], "would go to the service's own UDP socket"),
        (
            ["--listen", "[::]:8081", "--name", "b", "--knock-spa-port", "62201"],
            "would share udp port 62201",
        ),
    ):
        out = subprocess.run(
            network.server.command([*WRAPPER, *both, *extra, "--", "true"]),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 64 and needle in out.stderr, out.stderr
    svc = start(
        network, services, wrapped("--service", "spaboth", *both, "--knock-spa-port", "62201")
    )
    assert "ready fds=0,1,2,3,4,5 names=unknown:unknown" in svc.output(), svc.output()
    probes = [Probe(a, "tcp", 4, 8080), Probe(a, "udp", 4, 8080)]
    check_policy(svc, served=[], dropped=probes)
    wait_for_the_door("spaboth")
    send_raw(a, [spa.datagram(SECRET.strip(), 62201, a.v4)], port=62201)
    check_policy(svc, served=probes, dropped=[Probe(b, "tcp", 4, 8080), Probe(b, "udp", 4, 8080)])


def test_a_reload_cannot_turn_spa_on_without_its_socket(
    network: Network, services: list[Service], secret: Path
) -> None:
    """A reload puts programs into the sockets' slots and makes no socket: one that
    would have them wait for SPA datagrams no SPA socket takes is refused, and the
    rules in force stay."""
    a = network.allowed
    argv = ["--service", "spareload", "--listen", "[::]:8080", "--allow", "192.0.2.0/24"]
    svc = start(network, services, wrapped(*argv))
    out = subprocess.run(
        network.server.command([*WRAPPER, "reload", "spareload", *argv[2:], "--knock-secret",
                                str(secret), "--knock-spa"]),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 64, out.stderr
    assert "has no SPA socket" in out.stderr and "restart the service" in out.stderr
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[])


def test_the_service_takes_a_datagram_once_whichever_spa_socket_it_reaches(
    network: Network, services: list[Service], secret: Path
) -> None:
    """Two socket names on one port number at two addresses, with knock rules of their
    own (a window each): their SPA sockets share one table, the service's, which keeps
    what it saw for the wider window.  A datagram taken at one SPA socket, copied and
    sent to the other from elsewhere, is a replay, and still one after a reload gives
    the second new rules; with --knock-spa-sender, where the copier's own address
    would open, the copier is not served."""
    a, b = network.allowed, network.denied
    argv = ["--service", "spaone", "--listen", f"{a.server_v4}:8080", "--name", "web",
            "--listen", f"[{b.server_v6}]:8080", "--name", "admin", "--knock-secret",
            str(secret), "--knock-spa", "--knock-window", "5", "--knock-window", "admin=9",
            "--knock-spa-sender", "yes"]  # fmt: skip
    svc = start(network, services, wrapped(*argv))
    since, widest, made = spa_table("spaone")
    assert widest == 9  # the wider window, whichever started first
    assert since == made + 9 * 10**9  # a lost table's datagrams: the wider window's
    wait_for_the_door("spaone", most=10)
    taken = spa.datagram(SECRET.strip(), 8080, None)  # opens its sender
    send_raw(a, [taken])
    copy = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
        f"s.sendto(bytes.fromhex({taken.hex()!r}), ({b.server_v6!r}, 8080))\n"
    )
    subprocess.run(b.command([sys.executable, "-c", copy]), check=True, timeout=60)
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(b, "tcp", 6, 8080)])
    out = subprocess.run(
        network.server.command(
            [*WRAPPER, "reload", "spaone", *argv[2:], "--knock-open-for", "admin=3"]
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    subprocess.run(b.command([sys.executable, "-c", copy]), check=True, timeout=60)
    check_policy(svc, served=[], dropped=[Probe(b, "tcp", 6, 8080)])
    out = subprocess.run(
        [*WRAPPER, "status", "spaone", "--json"], capture_output=True, text=True, timeout=60
    )
    sockets = json.loads(out.stdout)["services"][0]["sockets"]
    spa_of = {s["name"]: s["spa"] for s in sockets if s["name"].endswith(".spa")}
    assert (spa_of["web.spa"]["accepted"], spa_of["admin.spa"]["accepted"]) == (1, 0), spa_of
    assert spa_of["admin.spa"]["replayed"] == 2, spa_of


def test_a_reload_keeps_an_spa_socket_one_and_where_it_is(
    network: Network, services: list[Service], secret: Path
) -> None:
    """A reload makes and closes no socket: one that would leave the SPA socket without
    knock-spa (which would deliver what it is sent to the application) or move it to
    another port is refused, and the SPA socket goes on judging datagrams.  A socket
    named as an SPA socket whose name has no knock-spa is refused at start (exit 64),
    before the application starts."""
    a = network.allowed
    argv = ["--service", "spakeep", "--listen", "[::]:8080", "--knock-secret", str(secret), *SPA]
    svc = start(network, services, wrapped(*argv))
    for extra, needle in (
        (
            ["--listen", "[::]:8080", "--allow", "0.0.0.0/0", "--allow", "::/0"],
            "would take no SPA datagrams",
        ),
        ([*argv[2:], "--knock-spa-port", "62203"], "would move to udp port 62203"),
    ):
        out = subprocess.run(
            network.server.command([*WRAPPER, "reload", "spakeep", *extra]),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 64 and needle in out.stderr, out.stderr
        assert "restart the service" in out.stderr and out.stderr.count("\n") == 1
    send_raw(a, [b"for the application? " * 2], count=5)
    check_policy(svc, served=[], dropped=[Probe(a, "tcp", 4, 8080)])
    assert spa_counts("spakeep")["malformed"] == 5
    assert "for the application" not in svc.output()
    # A reload that keeps it raises the table's windows under the table's lock (two at
    # once must not lose one's raise): it waits while another holds it.
    table = os.open(Path(_pins("spakeep", "spa_since")[0]).parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(table, fcntl.LOCK_EX)
        again = network.server.command([*WRAPPER, "reload", "spakeep", *argv[2:]])
        reload = subprocess.Popen(again, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)
        assert reload.poll() is None, reload.communicate()
    finally:
        os.close(table)  # the lock goes with it
    _, stderr = reload.communicate(timeout=120)
    assert reload.returncode == 0, stderr
    out = subprocess.run(
        network.server.command([*WRAPPER, "--listen", "[::]:8081", "--name", "web",
                                "--listen-datagram", "[::]:8082", "--name", "web.spa",
                                "--", "sh", "-c", "echo STARTED"]),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 64 and "is named as web's SPA socket" in out.stderr, out.stderr
    assert "STARTED" not in out.stdout


def test_a_datagram_opens_every_socket_that_shares_the_knock_state(
    network: Network, services: list[Service], secret: Path
) -> None:
    """Two socket names with the same knock rules share one knock state: a datagram to
    one's SPA socket opens the address for both (docs/knocking.md says so)."""
    a = network.allowed
    argv = ["--service", "spashared", "--listen", "[::]:8080", "--name", "web", "--listen",
            "[::]:8081", "--name", "admin", "--knock-secret", str(secret), *SPA]  # fmt: skip
    svc = start(network, services, wrapped(*argv))
    probes = [Probe(a, "tcp", 4, 8080), Probe(a, "tcp", 4, 8081)]
    check_policy(svc, served=[], dropped=probes)
    wait_for_the_door("spashared")
    send_raw(a, [spa.datagram(SECRET.strip(), 8080, a.v4)])
    check_policy(svc, served=probes, dropped=[])
