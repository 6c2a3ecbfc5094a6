"""Hosts in network namespaces joined by veth pairs, and services run on them.

    allowed (192.0.2.2, 2001:db8:a::2) ──veth── server (192.0.2.1, 2001:db8:a::1)
    denied  (198.51.100.2, 2001:db8:b::2) ──veth── server (198.51.100.1, 2001:db8:b::1)

Every test gets fresh, uniquely named namespaces, deleted afterwards even if
the test fails.  Addresses are from the documentation ranges only.
"""

from __future__ import annotations

import itertools
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from helpers.support import PROGRAMS

CLIENT = PROGRAMS / "client.py"
_counter = itertools.count()


def ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, text=True)


@dataclass
class Host:
    """A network namespace that plays one host."""

    netns: str
    v4: str = ""
    v6: str = ""
    server_v4: str = ""  # the server's address on this host's link
    server_v6: str = ""
    server_if: str = ""  # the server's end of this host's link
    link: str = ""  # this host's end

    def command(self, argv: Sequence[str]) -> list[str]:
        if not self.netns:  # the host itself
            return list(argv)
        # nsenter, not `ip netns exec`: that one remounts /sys, and with it goes the
        # BPF file system the wrapper pins its state in.
        return ["nsenter", f"--net=/run/netns/{self.netns}", *argv]

    def probe(self, proto: str, family: int, port: int, message: str, timeout: float = 1.0) -> str:
        target = self.server_v4 if family == 4 else self.server_v6
        out = subprocess.run(
            self.command(
                [sys.executable, str(CLIENT), proto, target, str(port), message, str(timeout)]
            ),
            capture_output=True,
            text=True,
            timeout=timeout + 30,
        )
        return out.stdout.strip() or f"error: {out.stderr.strip()}"


@dataclass
class Network:
    server: Host
    allowed: Host
    denied: Host
    names: list[str] = field(default_factory=list)


def link_hosts(
    server: Host,
    client: Host,
    srv_if: str,
    cli_if: str,
    net4: str,
    net6: str,
    index: int | None = None,
) -> None:
    """A veth pair between two hosts, .1/::1 on the server's end, .2/::2 on the client's.

    ``index`` forces the server end's interface index (to test index reuse).
    """
    extra = ["index", str(index)] if index else []
    ip(
        "link",
        "add",
        srv_if,
        *extra,
        "netns",
        server.netns,
        "type",
        "veth",
        "peer",
        "name",
        cli_if,
        "netns",
        client.netns,
    )
    for ns, ifname, host_part in ((server.netns, srv_if, 1), (client.netns, cli_if, 2)):
        ip("-n", ns, "addr", "add", f"{net4}.{host_part}/24", "dev", ifname)
        ip("-n", ns, "addr", "add", f"{net6}::{host_part}/64", "dev", ifname, "nodad")
        ip("-n", ns, "link", "set", ifname, "up")
    client.v4, client.v6 = f"{net4}.2", f"{net6}::2"
    client.server_v4, client.server_v6 = f"{net4}.1", f"{net6}::1"
    client.server_if, client.link = srv_if, cli_if


def make_network() -> Network:
    tag = f"alf{os.getpid() % 10000}x{next(_counter)}"
    server, allowed, denied = (Host(f"{tag}{role}") for role in "sab")
    for host in (server, allowed, denied):
        ip("netns", "add", host.netns)
        ip("-n", host.netns, "link", "set", "lo", "up")
    link_hosts(server, allowed, f"{tag}a0", f"{tag}a1", "192.0.2", "2001:db8:a")
    link_hosts(server, denied, f"{tag}b0", f"{tag}b1", "198.51.100", "2001:db8:b")
    return Network(server, allowed, denied, [server.netns, allowed.netns, denied.netns])


def wait_listening(host: Host, port: int, timeout: float = 20.0, proto: str = "tcp") -> None:
    """Until a TCP socket listens (or a UDP socket is bound) on port in host."""
    deadline = time.monotonic() + timeout
    flags = "-Hltn" if proto == "tcp" else "-Hlun"
    while True:
        out = subprocess.run(
            host.command(["ss", flags, f"sport = :{port}"]), capture_output=True, text=True
        ).stdout
        if out.strip():
            return
        assert time.monotonic() < deadline, f"nothing listens on port {port}"
        time.sleep(0.05)


def link_line(host: Host, name: str) -> str:
    """`ip -o link show` of one interface: "INDEX: NAME: ... link/ether MAC ..."."""
    return subprocess.run(
        ["ip", "-n", host.netns, "-o", "link", "show", "dev", name],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def ifindex(host: Host, name: str) -> int:
    return int(link_line(host, name).split(":", 1)[0])


def mac(host: Host, name: str) -> str:
    return link_line(host, name).split("link/ether ")[1].split()[0]


class Service:
    """A command run in the server namespace, with its output recorded."""

    def __init__(self, host: Host, argv: Sequence[str], env: dict[str, str] | None = None):
        """Start argv on host; env, if given, is added to this process's environment."""
        self.log = tempfile.NamedTemporaryFile(prefix="alf-service-", suffix=".log", delete=False)
        self.errlog = tempfile.NamedTemporaryFile(
            prefix="alf-service-", suffix=".err", delete=False
        )
        self.proc = subprocess.Popen(
            host.command(argv),
            stdout=self.log,
            stderr=self.errlog,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **env} if env else None,
        )

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def errors(self) -> str:
        return Path(self.errlog.name).read_text()

    def wait_for(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.output(), re.M)
            if match:
                return match
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(
            f"no {pattern!r} from the service (exit {self.proc.poll()}); "
            f"stdout: {self.output()!r} stderr: {self.errors()!r}"
        )

    def received(self, proto: str, peer: str, message: str) -> bool:
        return f"{proto} " in self.output() and any(
            line.split()[:1] == [proto] and line.split()[2:4] == [peer, message]
            for line in self.output().splitlines()
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for f in (self.log, self.errlog):
            f.close()
            if os.path.exists(f.name):
                os.unlink(f.name)


@dataclass(frozen=True)
class Probe:
    host: Host
    proto: str
    family: int
    port: int

    @property
    def source(self) -> str:
        return self.host.v4 if self.family == 4 else self.host.v6


def check_policy(svc: Service, served: Sequence[Probe], dropped: Sequence[Probe]) -> None:
    """Dropped probes must time out and never reach the application; served ones echo.

    The dropped probes go first, so by the time the served ones have been
    echoed, anything the dropped ones could have delivered would be logged.
    """

    def run(probe: Probe, timeout: float) -> tuple[Probe, str, str]:
        token = f"{probe.proto}{probe.family}-{uuid.uuid4().hex[:10]}"
        return probe, token, probe.host.probe(probe.proto, probe.family, probe.port, token, timeout)

    with ThreadPoolExecutor(8) as pool:
        blocked = list(pool.map(lambda p: run(p, 1.0), dropped))
        passed = list(pool.map(lambda p: run(p, 10.0), served))
    for probe, token, result in passed:
        assert result == "echo", f"{probe} should be served, got {result}; {svc.errors()}"
        assert svc.received(probe.proto, probe.source, token), (
            f"{probe} was echoed but the application did not log it:\n{svc.output()}"
        )
    for probe, token, result in blocked:
        assert result == "timeout", f"{probe} should be silently dropped, got {result}"
        assert not svc.received(probe.proto, probe.source, token), (
            f"{probe} reached the application:\n{svc.output()}"
        )


def start_echo(
    network: Network, services: list[Service], service: str, *options: str, port: int = 8080
) -> Service:
    """The echo server under the wrapper as SERVICE on the server: TCP PORT named web and
    UDP PORT + 1 named dns, both dual-stack, with these rule options; ready."""
    from helpers.support import ECHO_SERVER, WRAPPER  # noqa: PLC0415

    svc = Service(
        network.server,
        [*WRAPPER, "--service", service, "--listen", f"[::]:{port}", "--name", "web",
         "--listen-datagram", f"[::]:{port + 1}", "--name", "dns", *options, "--",
         *ECHO_SERVER],
    )  # fmt: skip
    services.append(svc)
    svc.wait_for(r"^ready ", timeout=120)
    return svc


def all_probes(host: Host, port_tcp: int, port_udp: int | None = None) -> list[Probe]:
    probes = [Probe(host, "tcp", fam, port_tcp) for fam in (4, 6)]
    if port_udp is not None:
        probes += [Probe(host, "udp", fam, port_udp) for fam in (4, 6)]
    return probes


class Held:
    """A connection held open by tests/programs/held_client.py on a host, to the
    server's port (bans that cut live connections: lifecycle/cut.py)."""

    def __init__(self, host: Host, family: int, port: int) -> None:
        target = host.server_v4 if family == 4 else host.server_v6
        self.proc = subprocess.Popen(
            host.command([sys.executable, str(PROGRAMS / "held_client.py"), target, str(port)]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.split() == ["echo", "ready"], line

    def again(self) -> str:
        """Exchange another line on the held connection."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def ended(self, timeout: float) -> list[str]:
        """How the connection ended (["reset", T] or ["closed", T, ...]), or []."""
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), True)
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                return []
        return self.proc.stdout.readline().split()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
