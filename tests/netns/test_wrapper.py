"""The wrapper end to end: real sockets, real filters, real traffic, a real application."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.hosts import (
    CLIENT,
    Host,
    Network,
    Probe,
    Service,
    all_probes,
    check_policy,
    ip,
    wait_listening,
)
from helpers.support import ECHO_SERVER, ROOT, WRAPPER
from helpers.wrapping import allowed_in_denied_out, million_rule_file, start, wrapped

pytestmark = pytest.mark.netns

ALLOW_A = ["--allow", "192.0.2.0/24", "--allow", "2001:db8:a::/48"]


POLICIES = {
    "allow-only": "--allow 192.0.2.0/24 --allow 2001:db8:a::/48",
    "deny-only": "--deny 198.51.100.0/24 --deny 2001:db8:b::/48",
    # Both hosts are inside the allowed ranges; the denied one is also denied.
    "deny-wins": "--allow 192.0.0.0/8 --allow 198.51.0.0/16 --allow 2001:db8::/32 "
    "--deny 198.51.100.2/32 --deny 2001:db8:b::2",
}


@pytest.mark.parametrize("policy", POLICIES)
def test_created_sockets(network: Network, services: list[Service], policy: str) -> None:
    options = "--listen [::]:8080 --name web --listen-datagram :8081 --name dns"
    svc = start(network, services, wrapped(*options.split(), *POLICIES[policy].split()))
    # Exactly stdin/out/err and the two sockets: no fd of the wrapper leaks.
    assert svc.wait_for(r"^ready (.*)$").group(1) == "fds=0,1,2,3,4 names=web:dns"
    allowed_in_denied_out(svc, network)
    # Each socket reached the application under its own name: TCP as web, UDP as dns.
    names = {(w[0], w[1]) for w in map(str.split, svc.output().splitlines()) if len(w) > 1}
    assert {("tcp", "web"), ("udp", "dns")} <= names, svc.output()
    assert not names & {("tcp", "dns"), ("udp", "web"), ("accept", "dns")}, svc.output()


def test_ipv4_only_sockets(network: Network, services: list[Service]) -> None:
    svc = start(
        network,
        services,
        wrapped("--listen", "0.0.0.0:8080", "--listen-datagram", "0.0.0.0:8081", *ALLOW_A),
    )
    check_policy(
        svc,
        served=[Probe(network.allowed, p, 4, port) for p, port in (("tcp", 8080), ("udp", 8081))],
        dropped=[Probe(network.denied, p, 4, port) for p, port in (("tcp", 8080), ("udp", 8081))],
    )


def test_ipv6_only_socket(network: Network, services: list[Service]) -> None:
    # Bound to the server's address on the allowed host's link: only IPv6 reaches it.
    # The denied host gets a route to that address, so both can try.
    a, b = network.allowed, network.denied
    ip(
        "-n",
        b.netns,
        "-6",
        "route",
        "add",
        "2001:db8:a::/64",
        "via",
        a.server_v6.replace("a::", "b::"),
    )
    svc = start(
        network,
        services,
        wrapped("--listen", f"[{a.server_v6}]:8080", "--allow", "2001:db8:a::/48"),
    )
    b_to_a = dataclasses.replace(b, server_v6=a.server_v6)
    check_policy(svc, served=[Probe(a, "tcp", 6, 8080)], dropped=[Probe(b_to_a, "tcp", 6, 8080)])
    assert a.probe("tcp", 4, 8080, "x", 1.0) == "refused"  # nothing listens on IPv4


def test_no_rules_passes_ip_traffic(network: Network, services: list[Service]) -> None:
    svc = start(network, services, wrapped("--listen", "[::]:8080"))
    check_policy(
        svc, served=all_probes(network.allowed, 8080) + all_probes(network.denied, 8080), dropped=[]
    )


def test_application_cannot_remove_filter(network: Network, services: list[Service]) -> None:
    # SO_DETACH_BPF on the handed-over socket must fail with EPERM (locked).
    code = (
        "import socket, errno; s = socket.socket(fileno=3)\n"
        "try:\n s.setsockopt(socket.SOL_SOCKET, 27, 0); print('detached', flush=True)\n"
        "except OSError as e:\n print('ready', errno.errorcode[e.errno], flush=True)\n"
    )
    svc = start(
        network,
        services,
        [*WRAPPER, "--listen", "[::]:8080", *ALLOW_A, "--", sys.executable, "-c", code],
    )
    svc.proc.wait(20)
    assert svc.output().strip() == "ready EPERM"


def test_inherited_stream_socket(network: Network, services: list[Service]) -> None:
    # systemd-socket-activate listens, waits for a connection, then execs the wrapper.
    svc = start(
        network,
        services,
        ["systemd-socket-activate", "-l", "8080", "--fdname=web", *wrapped(*ALLOW_A)],
        ready=False,
    )
    wait_listening(network.server, 8080)
    first = network.allowed.probe("tcp", 4, 8080, "trigger", timeout=20)
    assert first == "echo", svc.errors()
    assert svc.wait_for(r"^ready (.*)$").group(1) == "fds=0,1,2,3 names=web"
    check_policy(
        svc, served=all_probes(network.allowed, 8080), dropped=all_probes(network.denied, 8080)
    )


def test_inherited_datagram_socket(network: Network, services: list[Service]) -> None:
    svc = start(
        network,
        services,
        ["systemd-socket-activate", "--datagram", "-l", "8081", "--fdname=dns", *wrapped(*ALLOW_A)],
        ready=False,
    )
    wait_listening(network.server, 8081, proto="udp")
    # One trigger, sent once: it waits in the queue while the wrapper starts, is
    # judged allowed, and must reach the application (not be discarded and retried).
    assert network.allowed.probe("udp", 4, 8081, "trigger", timeout=20) == "echo", svc.errors()
    assert svc.received("udp", network.allowed.v4, "trigger")
    svc.wait_for(r"^ready fds=0,1,2,3 names=dns$")
    check_policy(
        svc,
        served=[Probe(network.allowed, "udp", f, 8081) for f in (4, 6)],
        dropped=[Probe(network.denied, "udp", f, 8081) for f in (4, 6)],
    )


def test_inherited_and_created_sockets(network: Network, services: list[Service]) -> None:
    svc = start(
        network,
        services,
        [
            "systemd-socket-activate",
            "-l",
            "8080",
            "--fdname=web",
            *wrapped("--listen-datagram", "[::]:8081", "--name", "dns", *ALLOW_A),
        ],
        ready=False,
    )
    wait_listening(network.server, 8080)
    assert network.allowed.probe("tcp", 6, 8080, "trigger", timeout=20) == "echo", svc.errors()
    assert svc.wait_for(r"^ready (.*)$").group(1) == "fds=0,1,2,3,4 names=web:dns"
    allowed_in_denied_out(svc, network)


def test_million_rule_allow_file(network: Network, services: list[Service], tmp_path: Path) -> None:
    rules = tmp_path / "million.rules"
    million_rule_file(rules, ["192.0.2.2/32", "2001:db8:a::2/128"])
    begin = time.monotonic()
    svc = start(
        network,
        services,
        wrapped(
            "--listen", "[::]:8080", "--listen-datagram", "[::]:8081", "--allow-file", str(rules)
        ),
    )
    print(f"1,000,000-rule allow-file in force after {time.monotonic() - begin:.1f} s")
    allowed_in_denied_out(svc, network)


def free_port() -> int:
    with (
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as tcp,
        socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as udp,
    ):
        tcp.bind(("::", 0))
        port = tcp.getsockname()[1]
        udp.bind(("::", port))
        return int(port)


def test_make_run_demo(bpf_root: None, services: list[Service]) -> None:
    # `make run` as docs/install.md gives it, on this host's loopback, on a free port.
    port = free_port()
    here = Host("", v4="127.0.0.1", v6="::1", server_v4="127.0.0.1", server_v6="::1")
    svc = Service(here, ["make", "-s", "-C", str(ROOT), "run"], env={"PORT": str(port)})
    services.append(svc)
    svc.wait_for(r"^ready ", timeout=120)
    assert "Try it" in svc.output()
    # Another loopback address is outside the demo policy: silently dropped.
    denied = subprocess.run(
        [
            sys.executable,
            str(CLIENT),
            "tcp",
            "127.0.0.1",
            str(port),
            "from-127.0.0.2",
            "1",
            "127.0.0.2",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert denied.stdout.strip() == "timeout"
    check_policy(svc, served=all_probes(here, port, port), dropped=[])
    assert "from-127.0.0.2" not in svc.output()


def test_the_guides_inherited_example_as_typed(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """docs/rules.md's "Inherited" example, its lines as written, in a fresh directory:
    the blocklist it writes denies the denied host; ./my-service is the echo server."""
    readme = (ROOT / "docs/rules.md").read_text()
    block = readme.split("# Inherited: systemd-socket-activate", 1)[1].split("\n\n", 1)[0]
    script = "\n".join(block.splitlines()[1:])  # the commands, after the comment
    assert "> blocklist" in script and "--deny-file blocklist" in script, script
    service = tmp_path / "my-service"
    service.write_text(f"#!/bin/sh\nexec {' '.join(ECHO_SERVER)}\n")
    service.chmod(0o755)
    tmp_path.chmod(0o755)
    bin_dir = tmp_path / "bin"  # `alfwrapper` as the guide types it: this checkout's
    bin_dir.mkdir()
    (bin_dir / "alfwrapper").write_text(f'#!/bin/sh\nexec {" ".join(WRAPPER)} "$@"\n')
    (bin_dir / "alfwrapper").chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    svc = Service(
        network.server,
        ["env", f"PATH={path}", f"PYTHONPATH={ROOT}", "sh", "-c", f"cd {tmp_path} && {script}"],
    )
    services.append(svc)
    wait_listening(network.server, 8080)
    assert network.allowed.probe("tcp", 4, 8080, "trigger", timeout=20) == "echo", svc.errors()
    assert "192.0.2.0/24" not in (tmp_path / "blocklist").read_text()
    check_policy(
        svc, served=all_probes(network.allowed, 8080), dropped=all_probes(network.denied, 8080)
    )


def test_a_start_says_what_is_in_force(bpf_root: None, tmp_path: Path) -> None:
    """A start tells its service manager (NOTIFY_SOCKET) STATUS= while it loads and once
    the filters are in force, never READY=1, and leaves NOTIFY_SOCKET to the command;
    one line on stderr (the journal, under systemd) names the service, each socket,
    what guards it and how long the start took."""
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(str(tmp_path / "notify"))
    manager.settimeout(60)
    command = ["sh", "-c", 'echo "command sees $NOTIFY_SOCKET"']
    out = subprocess.run(
        [*WRAPPER, "--service", "told", "--listen", "127.0.0.1:18470", "--name", "web",
         "--allow", "192.0.2.0/24", "--interface", "lo", "--", *command],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify")},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"command sees {tmp_path / 'notify'}", out.stdout
    said = []
    manager.settimeout(1)
    try:
        while True:
            said.append(manager.recv(4096).decode())
    except TimeoutError:
        pass
    assert said[0] == "STATUS=alfwrapper: loading the filters of 1 socket(s)", said
    assert said[-1].startswith("STATUS=alfwrapper: filters in force for told after "), said
    assert not [s for s in said if "READY=" in s], said
    line = [x for x in out.stderr.splitlines() if "filters in force" in x]
    assert len(line) == 1, out.stderr
    assert line[0].endswith(
        "s: web (tcp 127.0.0.1:18470): subnets 1 allow, 0 deny + interfaces lo"
    ), line
