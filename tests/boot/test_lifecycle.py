"""The boot tier, continued: a service's life under the real systemd (PID 1) with its
units as shipped: the activation race, restarts, idle exits and reloads with the rules
changing, a long-lived connection across a reload, Accept=yes refusing what it cannot
check, a socket filtered under another name, and the gallery's daemons against
clients that talk first, reset, or come first from a denied host.

A drop-in here changes a command line (ExecStart=), an application's own setting
(ECHO_IDLE_EXIT=) or a policy, never a unit's sandboxing."""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers.guest import (
    ALLOW4,
    ALLOW6,
    DENY4,
    DENY6,
    FIRST,
    GUEST4,
    GUEST6,
    Guest,
    expect,
    never_accepted,
    past_systemd,
    served_and_dropped,
    stop,
    tftp_served,
)

pytestmark = pytest.mark.boot

ECHO = "alfwrapper-echo.service"
POLICY_D = "/etc/alfwrapper/policy/alfwrapper-echo.toml.d"
ONLY_B = 'allow = ["198.51.100.0/24", "2001:db8:b::/48"]\n'
GUEST4B = "198.51.100.2"  # the guest's address on the denied host's network


def write(g: Guest, path: str, text: str) -> None:
    g.run(
        f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && printf %s {shlex.quote(text)} "
        f"> {shlex.quote(path)}"
    )


def dropin(g: Guest, unit: str, text: str) -> None:
    write(g, f"/run/systemd/system/{unit}.d/test.conf", f"[Service]\n{text}\n")
    g.run("systemctl daemon-reload")


@pytest.fixture
def clean(guest: Guest) -> Iterator[Guest]:
    """Whatever a test changed goes: drop-ins, policies, started units."""
    yield guest
    guest.run(
        "rm -rf /run/systemd/system/alfwrapper-* /etc/alfwrapper/policy/*.toml.d && "
        "systemctl daemon-reload"
    )
    stop(guest, "'alfwrapper-*'")


def subnet_drops(g: Guest) -> int:
    report = json.loads(g.run("alfwrapper status alfwrapper-echo --json"))
    return sum(s["counters"]["dropped"]["subnets"] for s in report["services"][0]["sockets"])


def received(g: Guest, unit: str) -> str:
    """What the echo service logged it received (lines "tcp NAME SOURCE TEXT")."""
    return g.run(
        f"journalctl -b -u {shlex.quote(unit)} -o cat --no-pager | grep -E '^(tcp|udp) ' || true"
    )


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_activation_race(clean: Guest, proto: str) -> None:
    """A denied host hammers the socket first (it triggers the start), an allowed one
    joins while the filter is being made: nothing of the denied host's reaches the
    service, the allowed host is served.  An allowed client waits up to 20 s for its
    echo, for the start's compile (seconds on a loaded machine): one queued ahead of a
    denied connection is reset at the start, the next batch of 8 meets the filter."""
    g = clean
    g.run("systemctl start alfwrapper-echo.socket")
    with ThreadPoolExecutor(2) as pool:
        denied = pool.submit(g.client, "hammer", DENY4, GUEST4, "8080", proto, "denied", "24")
        g.wait(
            f"systemctl is-active --quiet {ECHO} || systemctl is-failed --quiet {ECHO}"
            ' || [ "$(systemctl show -P ActiveState ' + ECHO + ')" = activating ]',
            seconds=30,
            every=0.05,
        )
        allowed = pool.submit(
            g.client, "hammer", ALLOW4, GUEST4, "8080", proto, "allowed", "24", "20"
        )
        denied_result, allowed_result = denied.result(), allowed.result()
    assert denied_result == "answered 0 of 24", denied_result
    assert not allowed_result.startswith("answered 0 "), allowed_result
    assert "denied-" not in received(g, ECHO), received(g, ECHO)
    served_and_dropped(g, ECHO, 8080, udp=proto == "udp")


def test_named_sockets_and_the_applications_capabilities(clean: Guest) -> None:
    g = clean
    g.run("systemctl start alfwrapper-multi-web.socket alfwrapper-multi-admin.socket")
    expect(g, "alfwrapper-multi.service", "answered", "tcp", DENY4, GUEST4, "8081", FIRST)
    log = g.journal("alfwrapper-multi.service", 50)
    assert "names=web:admin" in log or "names=admin:web" in log, log
    # The service runs with no capability (--no-capabilities), no_new_privs set.
    pid = g.run("systemctl show -P MainPID alfwrapper-multi.service").strip()
    status = g.run(f"cat /proc/{pid}/status")
    for field in ("CapInh", "CapPrm", "CapEff", "CapAmb"):  # the bounding set needs SETPCAP
        assert re.search(rf"^{field}:\s+0+$", status, re.M), status
    assert re.search(r"^NoNewPrivs:\s+1$", status, re.M), status


def test_restarts_and_idle_exits_keep_the_current_rules(clean: Guest) -> None:
    """The administrator's policy in force at each start: after a restart, after an
    idle exit and the next activation; the counters run on across all of them."""
    g = clean
    g.run("systemctl start alfwrapper-echo.socket")
    expect(g, ECHO, "answered", "tcp", ALLOW4, GUEST4, "8080", FIRST)
    expect(g, ECHO, "timeout", "tcp", DENY4, GUEST4B, "8080", "4")
    write(g, f"{POLICY_D}/40-clear.toml", "allow = []\n")
    write(g, f"{POLICY_D}/50-b.toml", ONLY_B)
    g.run(f"systemctl restart {ECHO}")
    expect(g, ECHO, "answered", "tcp", DENY4, GUEST4B, "8080", FIRST)
    expect(g, ECHO, "timeout", "tcp", ALLOW4, GUEST4, "8080", "4")
    before = subnet_drops(g)
    # An idle exit (the echo service's own setting), then a new activation.
    dropin(g, ECHO, "Environment=ECHO_IDLE_EXIT=2")
    g.run(f"systemctl restart {ECHO}")
    g.wait(f"! systemctl is-active --quiet {ECHO}", seconds=30)
    expect(g, ECHO, "answered", "tcp", DENY4, GUEST4B, "8080", FIRST)
    expect(g, ECHO, "timeout", "tcp", ALLOW6, GUEST6, "8080", "4")
    assert subnet_drops(g) > before


SPA_SEND = """
import socket
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.bind(({source!r}, 0))
    s.sendto(bytes.fromhex({raw!r}), ({guest!r}, 62201))
"""


def test_single_packet_authorization_under_systemd(clean: Guest) -> None:
    """The shipped echo units, as shipped, with an SPA policy drop-in: the wrapper,
    under systemd and the unit's sandbox, makes the SPA socket (the echo service's TCP
    and UDP 8080 share one, at 62201); an allowed host is shut out until its datagram
    opens the service for it alone, and the same datagram again is a replay."""
    from alfwrapper.policy import spa  # noqa: PLC0415

    g = clean
    secret = b"the boot tier's SPA secret, 32 bytes long"
    write(g, "/etc/alfwrapper/spa.secret", secret.decode())
    g.run("chmod 644 /etc/alfwrapper/spa.secret")  # the unit's DynamicUser reads it
    write(
        g,
        f"{POLICY_D}/50-spa.toml",
        'knock-secret = "/etc/alfwrapper/spa.secret"\n'
        "knock-spa = true\nknock-spa-port = 62201\nknock-open-for = 120\n"
        "knock-window = 5\n",
    )
    g.run("systemctl start alfwrapper-echo.socket")
    # It starts the service, and is not served: dropped once the filter is on, or, if
    # its handshake was queued before, held, then removed with nothing written
    # (backlog.py), by the time the client gives up or before.
    first = g.client("tcp", ALLOW4, GUEST4, "8080", "4")
    assert first in ("timeout", "timeout (connected, b'')", "closed b''"), f"{first}\n" + g.journal(
        ECHO
    )
    g.wait(
        f"systemctl is-active --quiet {ECHO} && alfwrapper status alfwrapper-echo | "
        "grep -q 'echo.spa udp'"
    )

    def door() -> dict[str, int]:
        report = json.loads(g.run("alfwrapper status alfwrapper-echo --json"))
        found = [s for s in report["services"][0]["sockets"] if s["name"] == "echo.spa"]
        assert len(found) == 1, report
        return dict(found[0]["spa"])

    def send(raw: str) -> None:
        code = SPA_SEND.format(source=ALLOW4, raw=raw, guest=GUEST4)
        g.script("client", f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}")

    # A new table takes no datagram sent in its first window (5 s here): knock until
    # one is taken, as a user would, for at most 30 s.
    deadline = time.monotonic() + 30
    while not door()["accepted"]:
        assert time.monotonic() < deadline, door()
        raw = spa.datagram(secret, 62201, ALLOW4).hex()
        send(raw)
        time.sleep(0.5)
    send(raw)  # the one taken, again
    expect(g, ECHO, "answered", "tcp", ALLOW4, GUEST4, "8080", "10")
    expect(g, ECHO, "answered", "udp", ALLOW4, GUEST4, "8080", "10")
    expect(g, ECHO, "timeout", "tcp", ALLOW6, GUEST6, "8080", "4")  # opened for one address
    assert (door()["accepted"], door()["replayed"]) == (1, 1), door()


def test_reload_keeps_a_long_lived_connection(clean: Guest) -> None:
    """systemctl reload puts new rules in force without restarting the application: a
    connection made before goes on, and a newly denied host is dropped."""
    g = clean
    g.run("systemctl start alfwrapper-echo.socket")
    expect(g, ECHO, "answered", "tcp", ALLOW4, GUEST4, "8080", FIRST)
    pid = g.run(f"systemctl show -P MainPID {ECHO}").strip()
    flag = f"/run/alfguest-long-{pid}"  # on the host side: the client polls for it
    g.client("tcp", ALLOW4, GUEST4, "8080", "5")  # warm
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(g.client, "long", ALLOW4, GUEST4, "8080", flag)
        g.wait(f"journalctl -b -u {ECHO} -o cat | grep -q '^tcp .* before$'", seconds=30)
        write(g, f"{POLICY_D}/50-deny.toml", f'deny = ["{ALLOW6}"]\n')
        g.run(f"systemctl reload {ECHO}")
        expect(g, ECHO, "timeout", "tcp", ALLOW6, GUEST6, "8080", "4")
        expect(g, ECHO, "answered", "tcp", ALLOW4, GUEST4, "8080", "20")
        g.script("client", f"touch {flag}")
        assert long.result() == "answered before after"
    g.script("client", f"rm -f {flag}")
    assert g.run(f"systemctl show -P MainPID {ECHO}").strip() == pid


def test_accept_yes_resets_denied_peers_and_refuses_knocking(clean: Guest) -> None:
    """As shipped, systemd never accepts a denied peer (the generator's drop-in); one
    past systemd's filter but denied by the policy is reset by the wrapper."""
    g = clean
    g.run("systemctl start alfwrapper-echo-accept.socket")
    expect(g, "alfwrapper-echo-accept@*", "answered", "tcp", ALLOW4, GUEST4, "8083", FIRST)
    never_accepted(g, "alfwrapper-echo-accept.socket", "8083")
    past_systemd(g, "alfwrapper-echo")  # systemd 252: the reload puts the new list in force
    if g.suite == "trixie":
        # systemd 257 keeps the old list on the listening socket until the socket unit
        # restarts (docs/daemons.md says so).
        assert g.client("tcp", DENY4, GUEST4B, "8083", "3") == "timeout"
        g.run("systemctl restart alfwrapper-echo-accept.socket")
    assert g.client("tcp", DENY4, GUEST4B, "8083", FIRST) == "closed b''"
    g.wait("journalctl -b -o cat | grep -q 'denied and reset; /usr/bin/python3 not started'")
    assert DENY4 not in received(g, "alfwrapper-echo-accept@*")
    # Each reset is a journal entry with the drop log's fields, counted by status and
    # its metrics under the socket's name (a kept verdict's too: the second peer's).
    first = resets_counted(g)
    assert first >= 1
    assert g.client("tcp", DENY4, GUEST4B, "8083", "20") == "closed b''"
    g.wait(f"alfwrapper status alfwrapper-echo-accept | grep -q 'this boot): {first + 1}$'")
    entries = journal_entries(g, "ALF_VERDICT=reset", "ALF_SERVICE=alfwrapper-echo-accept")
    assert len(entries) == first + 1, entries
    for entry in entries:
        assert entry["ALF_SRC"] == DENY4 and entry["ALF_PORT"] == "8083", entry
        assert entry["ALF_REASON"] == "subnets" and entry["ALF_PROTOCOL"] == "tcp", entry
        assert entry["_SYSTEMD_UNIT"].startswith("alfwrapper-echo-accept@"), entry
    metrics = g.run("alfwrapper status --prometheus")
    assert (
        f'alfwrapper_connections_reset_total{{service="alfwrapper-echo-accept"}} {first + 1}\n'
    ) in metrics, metrics
    stop(g, "alfwrapper-echo-accept.socket")
    dropin(
        g,
        "alfwrapper-echo-accept@.service",
        "ExecStart=\nExecStart=/usr/bin/alfwrapper --knock 7001,7002 -- /usr/bin/python3 "
        "/usr/share/alfwrapper/echo_server.py",
    )
    g.run("systemctl start alfwrapper-echo-accept.socket")
    assert not g.client("tcp", ALLOW4, GUEST4, "8083", "20").startswith("answered")
    g.wait("journalctl -b -o cat | grep -q 'knocking cannot check a connection'")


def test_a_socket_filtered_under_another_name_names_its_socket_unit(clean: Guest) -> None:
    g = clean
    g.run("systemctl start alfwrapper-echo.socket")
    expect(g, ECHO, "answered", "tcp", ALLOW4, GUEST4, "8080", FIRST)
    dropin(
        g,
        ECHO,
        "ExecStart=\nExecStart=/usr/bin/alfwrapper --no-capabilities --service renamed "
        "--policy alfwrapper-echo -- /usr/bin/python3 /usr/share/alfwrapper/echo_server.py",
    )
    g.run(f"systemctl restart {ECHO}", check=False)
    line = g.wait(f"journalctl -b -u {ECHO} -o cat | grep 'did not attach'")
    assert "for service renamed" in line, line
    assert "run systemctl restart alfwrapper-echo.socket" in line, line
    expect(g, ECHO, "timeout", "tcp", DENY4, GUEST4B, "8080", "4")  # still filtered


def host_key(g: Guest) -> str:
    return g.run("cat /etc/ssh/ssh_host_ed25519_key.pub").split()[1]


def keyscan(g: Guest, address: str, wait: int = 30) -> str:
    """ssh-keyscan from the host side (its source address: the one on the guest's
    network of ``address``): the banner and, after a key exchange, the host key."""
    out = g.script("client", f"ssh-keyscan -T {wait} -t ed25519 {address} 2>&1", timeout=wait + 60)
    return out.stdout


def test_sshd_serves_and_needs_the_capabilities_its_unit_gives(clean: Guest) -> None:
    g = clean
    g.run("cp /usr/share/alfwrapper/units/* /etc/systemd/system/ && systemctl daemon-reload")
    g.run("systemctl start alfwrapper-sshd.socket")
    key = host_key(g)
    out = keyscan(g, GUEST4)  # from 192.0.2.1, allowed
    assert "SSH-2.0-OpenSSH" in out and key in out, out
    out = keyscan(g, GUEST4B, wait=10)  # from 198.51.100.1, denied
    assert "SSH-2.0" not in out and key not in out, out
    expect(
        g, "alfwrapper-sshd@*", "answered SSH-2.0-OpenSSH", "banner", ALLOW6, GUEST6, "22", FIRST
    )
    never_accepted(g, "alfwrapper-sshd.socket", "22", "banner")
    stop(g, "alfwrapper-sshd.socket")
    past_systemd(g, "alfwrapper-sshd")  # the wrapper judges the denied host
    g.run("systemctl start alfwrapper-sshd.socket")
    assert g.client("banner", DENY6, GUEST6, "22", FIRST) == "closed b''"
    g.wait("journalctl -b -o cat | grep -q 'denied and reset; /usr/sbin/sshd not started'")
    stop(g, "alfwrapper-sshd.socket")
    # With --no-capabilities (alfwrapper's old way) privilege separation fails: the
    # banner comes, the key exchange does not.
    dropin(
        g,
        "alfwrapper-sshd@.service",
        "ExecStart=\nExecStart=-/usr/bin/alfwrapper --no-capabilities --policy "
        "alfwrapper-sshd -- /usr/sbin/sshd -i",
    )
    g.run("systemctl start alfwrapper-sshd.socket")
    out = keyscan(g, GUEST4)
    assert "SSH-2.0-OpenSSH" in out and key not in out, out


def test_denied_ssh_clients_racing_allowed_ones_get_nothing(clean: Guest) -> None:
    """Denied peers that talk first (a banner, then junk) and wait, mixed with allowed
    ones: every allowed one completes the key exchange, no denied one hears a byte.
    The denied ones are let past systemd's filter, for the wrapper to judge."""
    g = clean
    g.run("cp /usr/share/alfwrapper/units/* /etc/systemd/system/ && systemctl daemon-reload")
    past_systemd(g, "alfwrapper-sshd")
    g.run("systemctl start alfwrapper-sshd.socket")
    key = host_key(g)
    with ThreadPoolExecutor(7) as pool:
        bad = [
            pool.submit(
                g.client, "talker", DENY4 if i % 2 else DENY6, GUEST4B if i % 2 else GUEST6, "22"
            )
            for i in range(4)
        ]
        good = [pool.submit(keyscan, g, GUEST4) for _ in range(3)]
        for future in bad:
            assert future.result() == "closed b''", future.result()
        for future in good:
            assert key in future.result(), future.result()


def test_a_flood_from_a_denied_host_starts_nothing_and_allowed_clients_are_served(
    clean: Guest,
) -> None:
    """200 connection attempts a second from a denied host for 20 s at the inetd sshd
    unit as shipped: systemd accepts none (the policy is the socket's IPAddressAllow=,
    so no wrapper and no sshd starts for them), and an allowed client's key exchange
    meanwhile is served every time."""
    g = clean
    g.run("cp /usr/share/alfwrapper/units/* /etc/systemd/system/ && systemctl daemon-reload")
    g.run("systemctl start alfwrapper-sshd.socket")
    key = host_key(g)
    accepted = int(g.run("systemctl show -P NAccepted alfwrapper-sshd.socket"))
    scans = []
    with ThreadPoolExecutor(1) as pool:
        flood = pool.submit(g.client, "flood", DENY4, GUEST4B, "22", "200", "20")
        while not flood.done() or len(scans) < 3:
            scans.append(keyscan(g, GUEST4))
    assert flood.result() == "connected 0 of 4000", flood.result()
    assert all(key in scan for scan in scans), scans
    now = int(g.run("systemctl show -P NAccepted alfwrapper-sshd.socket"))
    assert now - accepted == len(scans), (now, accepted, len(scans))


def test_git_ls_remote_and_a_denied_peer(clean: Guest) -> None:
    g = clean
    g.run("cp /usr/share/alfwrapper/units/* /etc/systemd/system/ && systemctl daemon-reload")
    head = g.run(
        "rm -rf /srv/git/alf.git /root/alf.work && mkdir -p /srv/git && "
        "git init -q /root/alf.work && git -C /root/alf.work -c user.name=t "
        "-c user.email=t@example.org commit -q --allow-empty -m gallery && "
        "git clone -q --bare /root/alf.work /srv/git/alf.git && "
        "touch /srv/git/alf.git/git-daemon-export-ok && git -C /root/alf.work rev-parse HEAD"
    ).strip()
    g.run("systemctl start alfwrapper-git.socket")
    out = g.script("client", f"timeout 60 git ls-remote git://{GUEST4}/alf.git", timeout=120)
    assert f"{head}\tHEAD" in out.stdout, out.stdout + out.stderr
    never_accepted(g, "alfwrapper-git.socket", "/alf.git", "git")


def test_tftp_first_request_from_a_denied_host(clean: Guest) -> None:
    """The denied host's request starts the service; it is dropped before in.tftpd
    reads it, and the allowed host is served after."""
    g = clean
    g.run("cp /usr/share/alfwrapper/units/* /etc/systemd/system/ && systemctl daemon-reload")
    g.run(
        "mkdir -p /srv/tftp && echo 'served by tftp' > /srv/tftp/alf.txt && "
        "systemctl start alfwrapper-tftp.socket"
    )
    assert g.client("tftp", DENY4, GUEST4B, "10", "alf.txt") == "timeout"
    g.wait("journalctl -b -u alfwrapper-tftp.service -o cat | grep -q 'from denied sources'")
    tftp_served(g, "alfwrapper-tftp.service", "served by tftp", ALLOW4, GUEST4, "alf.txt")
    expect(g, "alfwrapper-tftp.service", "answered DATA served by tftp", "tftp", ALLOW6, GUEST6,
           "20", "alf.txt")  # fmt: skip
    assert g.client("tftp", DENY6, GUEST6, "3", "alf.txt") == "timeout"


def resets_counted(g: Guest) -> int:
    """What `alfwrapper status` counts of alfwrapper-echo-accept's resets this boot."""
    out = g.run("alfwrapper status alfwrapper-echo-accept")
    found = re.search(r"before the command started \(Accept=yes, this boot\): (\d+)$", out, re.M)
    assert found, out
    return int(found.group(1))


def journal_entries(g: Guest, *match: str) -> list[dict[str, str]]:
    out = g.run(f"journalctl -b -o json --no-pager {' '.join(map(shlex.quote, match))}")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def forwarder_pid(g: Guest) -> int:
    """The drop log's forwarder, by its process name (alfwrapper-log SERVICE)."""
    return int(g.wait("pgrep -xf 'alfwrapper-log alfwrapper-echo'").split()[0])


def test_drops_go_to_the_journal_under_the_unit(clean: Guest) -> None:
    """With log-drops, each dropped packet is a journal entry of the unit's, with its
    fields, written by a forwarder in the unit's cgroup holding CAP_BPF alone; one
    started by an administrator's reload joins that cgroup too; it ends with the unit."""
    g = clean
    write(g, f"{POLICY_D}/50-log.toml", "log-drops = 1000\n")
    g.run("systemctl start alfwrapper-echo.socket")
    expect(g, ECHO, "answered", "udp", ALLOW4, GUEST4, "8080", FIRST)
    expect(g, ECHO, "timeout", "udp", DENY4, GUEST4B, "8080", "3")
    expect(g, ECHO, "timeout", "tcp", DENY6, GUEST6, "8080", "3")

    def drops() -> list[dict[str, str]]:
        return journal_entries(g, "-u", ECHO, "ALF_SERVICE=alfwrapper-echo")

    g.wait(
        f"journalctl -b -u {ECHO} ALF_SRC={DENY4} -o cat | grep -q . && "
        f"journalctl -b -u {ECHO} ALF_SRC={DENY6} -o cat | grep -q .",
        seconds=30,
    )
    link = g.run("ip -o route get 192.0.2.1 | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p'").strip()
    for entry in drops():
        assert entry["ALF_REASON"] == "subnets" and entry["ALF_VERDICT"] == "drop", entry
        assert entry["ALF_SOCKET"] == "echo" and entry["ALF_PORT"] == "8080", entry
        assert entry["_SYSTEMD_UNIT"] == ECHO, entry
        assert entry["ALF_INTERFACE"] == link, entry
        assert entry["ALF_SRC"] in (DENY4, DENY6), entry
    assert {e["ALF_PROTOCOL"] for e in drops()} == {"udp", "tcp"}
    assert not journal_entries(g, f"ALF_SRC={ALLOW4}")
    forwarder = forwarder_pid(g)
    status = g.run(f"cat /proc/{forwarder}/status")
    assert re.search(rf"^CapEff:\s+0*{1 << 39:x}$", status, re.M), status
    assert re.search(r"^NoNewPrivs:\s+1$", status, re.M), status
    assert ECHO in g.run(f"cat /proc/{forwarder}/cgroup")
    # One started by a reload from an administrator's shell joins the unit's cgroup.
    g.run(f"kill -9 {forwarder}")
    g.wait(f"! test -e /proc/{forwarder}")
    g.run("alfwrapper reload alfwrapper-echo")
    again = forwarder_pid(g)
    assert again != forwarder
    assert ECHO in g.run(f"cat /proc/{again}/cgroup")
    expect(g, ECHO, "timeout", "udp", DENY6, GUEST6, "8080", "3")
    g.wait(f"journalctl -b -u {ECHO} _PID={again} ALF_SRC={DENY6} -o cat | grep -q .")
    g.run(f"systemctl stop {ECHO}")  # it ends with the application
    g.wait(f"! test -e /proc/{again}")
