"""A running service's firewall changed in place, and its pinned state guarded: live
allow/deny/revoke at a million rules, gc, who may reach the pins, and fail-closed slots."""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.hosts import Network, Probe, Service, all_probes, check_policy, start_echo
from helpers.support import NO_CAPS, ROOT, WRAPPER
from helpers.wrapping import million_rule_file

pytestmark = pytest.mark.netns

STATE = Path("/sys/fs/bpf/alfwrapper")


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WRAPPER, *argv], capture_output=True, text=True, timeout=120)


def start(network: Network, services: list[Service], service: str, *options: str) -> Service:
    return start_echo(network, services, service, *options)


def test_live_deny_allow_revoke_at_a_million_rules(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    a, b = network.allowed, network.denied
    rules = tmp_path / "million.rules"
    million_rule_file(rules, ["192.0.2.2/32", "2001:db8:a::2/128"])
    svc = start(network, services, "live", "--allow-file", str(rules))
    pid = svc.proc.pid
    check_policy(svc, served=all_probes(a, 8080, 8081), dropped=all_probes(b, 8080, 8081))
    out = cli("deny", "live", "192.0.2.2", "2001:db8:a::/48")
    assert out.returncode == 0, out.stderr
    check_policy(svc, served=[], dropped=all_probes(a, 8080, 8081))
    # A runtime allow lets the denied host in; on one socket only.
    out = cli("allow", "live", "--socket", "web", "198.51.100.0/24")
    assert out.returncode == 0, out.stderr
    check_policy(svc, served=[Probe(b, "tcp", 4, 8080)], dropped=[Probe(b, "udp", 4, 8081)])
    shown = cli("show", "live").stdout
    assert "deny 192.0.2.2/32" in shown and "deny 2001:db8:a::/48" in shown
    assert shown.count("allow 198.51.100.0/24") == 1
    out = cli("revoke", "live", "192.0.2.2", "2001:db8:a::/48", "198.51.100.0/24")
    assert out.returncode == 0, out.stderr
    check_policy(svc, served=all_probes(a, 8080, 8081), dropped=all_probes(b, 8080, 8081))
    # A reload keeps the runtime rules (a ban of fail2ban's stays a ban); revoke --all
    # forgets them.
    assert cli("deny", "live", "192.0.2.2", "2001:db8:a::/48").returncode == 0
    check_policy(svc, served=[], dropped=[Probe(a, "tcp", 4, 8080)])
    out = cli("reload", "live")
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("kept 4 runtime rule(s)"), out.stdout  # 2 on each of 2
    # The reload's line (the journal's, under ExecReload=) says what guards each socket.
    assert out.stdout.startswith("reloaded live after "), out.stdout
    assert len(re.findall(r": subnets [0-9]{6,} allow, 0 deny", out.stdout)) == 2, out.stdout
    assert cli("show", "live").stdout.count("deny 192.0.2.2/32") == 2
    check_policy(svc, served=[], dropped=all_probes(a, 8080, 8081))
    out = cli("revoke", "live", "--all")
    assert out.returncode == 0 and out.stdout.count("revoked 2 runtime rule(s)") == 2, out
    check_policy(svc, served=all_probes(a, 8080, 8081), dropped=all_probes(b, 8080, 8081))
    assert svc.proc.poll() is None and svc.proc.pid == pid


def test_runtime_rules_outlive_a_restart_with_new_sockets(
    network: Network, services: list[Service]
) -> None:
    """A service that makes its own sockets (--listen) gets new ones at each start: their
    runtime rules are the earlier sockets', kept by every gc in between (a status, a
    deny made while it is down, alfwrapper gc), and in force before its first packet."""
    a, b = network.allowed, network.denied
    svc = start(network, services, "relive", "--deny", "203.0.113.0/24")
    assert cli("deny", "relive", a.v4).returncode == 0
    assert cli("deny", "relive", "--socket", "dns", a.v6).returncode == 0
    check_policy(
        svc,
        served=[Probe(a, "tcp", 6, 8080)],
        dropped=[Probe(a, "tcp", 4, 8080), Probe(a, "udp", 6, 8081)],
    )
    svc.stop()
    services.remove(svc)
    for argv in (["status", "relive"], ["gc"]):
        assert cli(*argv).returncode == 0
    # Down, the gone sockets' rules still change, and show says where they wait.
    out = cli("deny", "relive", "--socket", "web", "198.51.100.0/24")
    assert out.returncode == 0 and "gone: its runtime rules wait for its next start" in out.stdout
    assert cli("gc").returncode == 0
    svc = start(network, services, "relive", "--deny", "203.0.113.0/24")
    check_policy(
        svc,
        served=[Probe(a, "tcp", 6, 8080), Probe(b, "tcp", 6, 8080), Probe(b, "udp", 4, 8081)],
        dropped=[
            Probe(a, "tcp", 4, 8080),
            Probe(a, "udp", 4, 8081),
            Probe(a, "udp", 6, 8081),
            Probe(b, "tcp", 4, 8080),
        ],
    )
    # Once the new sockets hold the rules, the gone ones' state goes.
    assert cli("gc").returncode == 0
    shown = cli("show", "relive").stdout
    assert "gone" not in shown and len(pins_of("relive")) == 2, shown
    assert cli("revoke", "relive", "--all").returncode == 0
    check_policy(svc, served=all_probes(a, 8080, 8081), dropped=[])
    svc.stop()
    services.remove(svc)
    assert cli("gc").returncode == 0
    assert not (STATE / "relive").exists()  # nothing held: the service's folder goes


def test_runtime_rule_errors() -> None:
    for argv, needle in (
        (["deny", "nosuch", "192.0.2.1"], "service nosuch: has no pinned state"),
        (["deny", "bad/name", "192.0.2.1"], "is not a service name"),
        (["deny", "x", "192.0.2.1/33"], "longer than 32"),
    ):
        out = cli(*argv)
        assert out.returncode == 64, out.stderr
        assert needle in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr


def pins_of(service: str) -> list[Path]:
    return sorted((STATE / service).glob("sock-*"))


@pytest.mark.alone  # it asserts what its own gc removes
def test_state_of_closed_sockets_is_collected(network: Network, services: list[Service]) -> None:
    for _ in range(5):
        svc = start(network, services, "churn", "--allow", "192.0.2.0/24")
        assert len(pins_of("churn")) == 2  # this start's two sockets, none before
        svc.stop()
    # A map pinned where a knock folder would be (as a hostile filter once could): gc
    # takes it too, or the service would be listed for ever.
    from alfwrapper.host import bpf_calls  # noqa: PLC0415

    stray = bpf_calls.map_create(2, "alf_stray", 4, 4, 1)
    bpf_calls.obj_pin(stray, str(STATE / "churn" / "knock-0"))
    os.close(stray)
    out = cli("gc")
    assert out.returncode == 0 and "removed churn" in out.stdout, out.stdout
    assert not (STATE / "churn").exists()


def test_pins_are_out_of_reach_of_the_application(
    network: Network, services: list[Service]
) -> None:
    start(network, services, "guarded", "--allow", "192.0.2.0/24")
    folder = pins_of("guarded")[0]
    info = STATE.stat()
    assert info.st_mode & 0o777 == 0o700 and info.st_uid != 0
    # uid 0 without capabilities, as the application runs: nothing opens, nothing lists.
    probe = (
        "import os, sys\n"
        "from alfwrapper.host import bpf_calls\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        bpf_calls.obj_get(path); print(path, 'OPENED')\n"
        "    except OSError as e:\n"
        "        print(path, e.errno)\n"
        "try:\n"
        "    os.listdir(sys.argv[1].rsplit('/', 1)[0]); print('LISTED')\n"
        "except OSError as e:\n"
        "    print('list', e.errno)\n"
    )
    paths = [str(folder / n) for n in ("slot", "counters", "runtime", "dispatch")]
    out = subprocess.run(
        [*NO_CAPS, sys.executable, "-c", probe, *paths],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert "OPENED" not in out.stdout and "LISTED" not in out.stdout, out.stdout + out.stderr
    assert out.stdout.count(" 13") == 5, out.stdout  # EACCES, every time


def test_an_emptied_slot_drops_everything(network: Network, services: list[Service]) -> None:
    a = network.allowed
    svc = start(network, services, "emptied", "--allow", "192.0.2.0/24")
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[])
    from alfwrapper.host import bpf_calls  # noqa: PLC0415

    for folder in pins_of("emptied"):
        slot = bpf_calls.obj_get(str(folder / "slot"))
        bpf_calls.map_delete(slot, struct.pack("I", 0))
        os.close(slot)
    check_policy(svc, served=[], dropped=all_probes(a, 8080, 8081))


def test_a_socket_filtered_by_someone_else_is_refused(bpf_root: None, tmp_path: Path) -> None:
    # A classic filter, attached and locked by another program: not alfwrapper's to replace.
    script = (
        "import os, socket, struct, sys\n"
        "s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)\n"
        "s.bind(('::1', 0)); s.listen()\n"
        "code = struct.pack('HBBI', 6, 0, 0, 0xFFFFFFFF)\n"  # ret #-1: pass all
        "import ctypes\n"
        "buf = ctypes.create_string_buffer(code)\n"
        "prog = struct.pack('HL', 1, ctypes.addressof(buf))\n"
        "s.setsockopt(socket.SOL_SOCKET, 26 - 0, prog)\n"  # SO_ATTACH_FILTER
        "s.setsockopt(socket.SOL_SOCKET, 44, 1)\n"
        "os.dup2(s.fileno(), 3); os.set_inheritable(3, True)\n"
        "os.environ.update(LISTEN_FDS='1', LISTEN_PID=str(os.getpid()))\n"
        "os.execvp(sys.executable, [sys.executable, '-m', 'alfwrapper', '--service', 'foreign',"
        " '--allow', '192.0.2.0/24', '--', '/bin/true'])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 78, out.stderr
    assert "carries a filter that alfwrapper did not attach" in out.stderr
    assert "restart the socket unit that passes them (systemctl list-sockets)" in out.stderr
    assert len(out.stderr.splitlines()) == 1


def test_watcher_is_replaced_on_reload(network: Network, services: list[Service]) -> None:
    a, b = network.allowed, network.denied
    svc = start(network, services, "watched", "--interface", a.server_if)
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(b, "tcp", 4, 8080)])
    out = subprocess.run(
        network.server.command([*WRAPPER, "reload", "watched", "--interface", b.server_if]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    check_policy(svc, served=[Probe(b, "tcp", 4, 8080)], dropped=[Probe(a, "tcp", 4, 8080)])
    watchers = subprocess.run(
        ["pgrep", "-f", "^alfwrapper-watch watched"], capture_output=True, text=True
    ).stdout.split()
    assert len(watchers) == 1, watchers  # the old one is gone
    os.kill(int(watchers[0]), signal.SIGKILL)
    time.sleep(0.3)
    check_policy(svc, served=[], dropped=[Probe(b, "tcp", 4, 8080)])
