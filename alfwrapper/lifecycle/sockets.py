"""The sockets a start hands on, one record each: inherited ones gathered, and those
it creates from --listen / --listen-datagram.

Creation is split in two so the filter goes on in between: ``open_socket``
makes an unbound socket, the caller attaches the filter, then ``bind_socket``
binds (and listens).  No packet can reach the socket before it is filtered.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import sys
from typing import TYPE_CHECKING

from alfwrapper.errors import EX_NOPERM, EX_OSERR, EX_USAGE, AlfError, excerpt
from alfwrapper.host import activation, attach
from alfwrapper.policy.files import SPA_SUFFIX, Policy
from alfwrapper.policy.rules import ListenSpec, SocketRules
from alfwrapper.record import Record

if TYPE_CHECKING:
    from alfwrapper import state
    from alfwrapper.bpf.compiler import LoadedFilter


class SocketRecord(Record, frozen=False):
    """One socket on its way to the application."""

    sock: socket.socket
    name: str
    rules: SocketRules
    spec: ListenSpec | None = None  # created by us (bound after attaching), else inherited
    label: str = ""  # its programs' and maps' name (program.label; programs.filter_sockets)
    loaded: LoadedFilter | None = None
    pins: state.SocketState | None = None  # its pinned state, unless Accept=yes
    judged: bool = False  # what was queued on it is judged (state.Store.take)
    made: bool = False  # its pinned state was made by this start

    @property
    def stdin(self) -> bool:
        """Handed over on fd 0, inetd style: it stays there for the application."""
        return self.inherited and self.name == activation.INETD_NAME and self.sock.fileno() == 0

    @property
    def inherited(self) -> bool:
        return self.spec is None

    @property
    def connected(self) -> bool:
        """An inherited connection (Accept=yes); a created TCP socket listens once bound."""
        return self.inherited and activation.is_connected_stream(self.sock)

    @property
    def listener(self) -> bool:
        return self.sock.type == socket.SOCK_STREAM and not self.connected

    @property
    def protocol(self) -> str:
        return "tcp" if self.sock.type == socket.SOCK_STREAM else "udp"

    @property
    def spa(self) -> bool:
        """An SPA socket (NAME.spa): its filter checks datagrams and delivers none; it is
        held for the application, not handed to it (launch.py)."""
        return self.rules.knock is not None and self.rules.knock.verifier


def gather_sockets(policy: Policy) -> list[SocketRecord]:
    """Inherited sockets first (an inetd one on fd 0, then LISTEN_FDS' in their
    order), then the created ones (still unbound).  The names the rules are scoped
    to are checked before any socket is created."""
    inherited = activation.inherit_sockets(os.environ, os.getpid())
    stdin = activation.inetd_socket([sock for sock, _ in inherited])
    if stdin is not None:
        inherited.insert(0, (stdin, activation.INETD_NAME))
    if not inherited and not policy.listens:
        if not _socket_on_fd_0():
            return []  # COMMAND binds its own: lifecycle/intercept.py
        raise AlfError(
            "sockets",
            "none inherited (LISTEN_FDS unset, and fd 0 is no TCP or UDP socket) and "
            "none to create",
            "add --listen [::]:PORT, or start from a socket unit",
            EX_USAGE,
        )
    policy.check_names([name for _, name in inherited] + [s.name for s in policy.listens])
    records = [SocketRecord(sock, name, policy.rules_for(name)) for sock, name in inherited]
    records += [
        SocketRecord(open_socket(spec), spec.name, policy.rules_for(spec.name), spec)
        for spec in policy.listens
    ]
    for record in records:
        check_spa_name(record.name, record.spa, "a start")
    return records + spa_sockets(policy, records)


def _socket_on_fd_0() -> bool:
    """Whether fd 0 is a socket (one not ours to take: a Unix socket): a start meant to
    be inetd's, not a daemon's that binds its own."""
    try:
        return stat.S_ISSOCK(os.fstat(0).st_mode)
    except OSError:
        return False


def check_spa_name(name: str, spa: bool, when: str) -> None:
    """A socket named NAME.spa must be NAME's SPA socket: one that is not would be handed
    to the application, filtered by the rules for every socket, or for none."""
    if name.endswith(SPA_SUFFIX) and not spa:
        base = name[: -len(SPA_SUFFIX)]
        raise AlfError(
            f"socket {name}",
            f"is named as {base}'s SPA socket, and {when} gives {base} no knock-spa",
            f"give {base} knock-spa (with a knock-secret), or name the socket otherwise "
            "(--name, or the socket unit's FileDescriptorName=)",
            EX_USAGE,
        )


def spa_sockets(policy: Policy, records: list[SocketRecord]) -> list[SocketRecord]:
    """The SPA socket of each socket name whose rules ask for one (knock-spa; sockets of
    one name share their rules, so their knock state, and one SPA socket): an inherited
    one named NAME.spa (a socket unit's ListenDatagram= with FileDescriptorName=
    NAME.spa), or one created here on the first such socket's address, at
    knock-spa-port or that socket's port number over UDP, which must not be a port a
    UDP socket of that name serves."""
    inherited = {r.name for r in records if r.spa and r.inherited}
    made: list[SocketRecord] = []
    groups: dict[str, list[SocketRecord]] = {}
    for record in records:
        knock = record.rules.knock
        if knock is not None and knock.spa and not record.spa and not record.connected:
            groups.setdefault(record.name, []).append(record)
    for base, group in groups.items():
        name = base + SPA_SUFFIX
        if name in inherited:
            door = next(r for r in records if r.name == name)
            if door.sock.type != socket.SOCK_DGRAM:
                raise AlfError(
                    f"socket {name}",
                    "is not a datagram (UDP) socket",
                    "give it with ListenDatagram=",
                    EX_USAGE,
                )
            continue
        first = group[0]
        host, port = (
            (first.spec.host, first.spec.port) if first.spec else (first.sock.getsockname()[:2])
        )
        spa_port = first.rules.knock.spa_port or port  # type: ignore[union-attr]
        served = [r for r in group if r.protocol == "udp" and _port_of(r) == spa_port]
        if served:
            raise AlfError(
                f"knock-spa for {base} (udp port {spa_port})",
                "its SPA datagrams would go to the service's own UDP socket",
                "give the SPA socket a port of its own: --knock-spa-port PORT",
                EX_USAGE,
            )
        spec = ListenSpec("datagram", host, spa_port, name)
        clash = next(
            (r for r in made if r.spec and (r.spec.host, r.spec.port) == (host, spa_port)), None
        )
        if clash is not None:
            raise AlfError(
                f"knock-spa for {base}",
                f"its SPA socket would share udp port {spa_port} with {clash.name}",
                "give each socket name its own knock-spa-port ([socket.NAME] or NAME=PORT)",
                EX_USAGE,
            )
        made.append(SocketRecord(open_socket(spec), name, policy.rules_for(name), spec))
    return made


def _port_of(record: SocketRecord) -> int:
    return record.spec.port if record.spec else int(record.sock.getsockname()[1])


def open_socket(spec: ListenSpec) -> socket.socket:
    family = socket.AF_INET6 if spec.family == 6 else socket.AF_INET
    kind = socket.SOCK_STREAM if spec.kind == "stream" else socket.SOCK_DGRAM
    try:
        sock = socket.socket(family, kind)
    except OSError as err:
        raise AlfError(
            f"creating {spec}",
            err.strerror or str(err),
            "is IPv6 disabled on this host?"
            if family == socket.AF_INET6
            else "run `alfwrapper doctor`",
            EX_OSERR,
        ) from None
    if family == socket.AF_INET6 and spec.host == "::":
        # [::]:PORT means both families, whatever net.ipv6.bindv6only says.
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    if kind == socket.SOCK_STREAM:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def bind_socket(sock: socket.socket, spec: ListenSpec) -> None:
    try:
        sock.bind((spec.host, spec.port))
        if spec.kind == "stream":
            sock.listen(socket.SOMAXCONN)
    except OSError as err:
        hints = {
            errno.EADDRINUSE: "another socket holds that port; stop it or choose another port",
            errno.EADDRNOTAVAIL: "that address is not configured on this host",
            errno.EACCES: "ports below 1024 need CAP_NET_BIND_SERVICE; let systemd bind them",
        }
        code = EX_NOPERM if err.errno == errno.EACCES else EX_OSERR
        raise AlfError(
            f"binding {spec}",
            err.strerror or str(err),
            hints.get(err.errno or 0, "check the address"),
            code,
        ) from None


def note_unruled(records: list[SocketRecord]) -> None:
    """A note on stderr for each socket without rules: what passes it."""
    for record in records:
        if record.rules.empty:
            what = (
                "every packet passes until a reload gives it rules"
                if record.pins
                else "it is not filtered"
            )
            print(
                f"alfwrapper: note: {attach.describe(record.sock)} named "
                f"{excerpt(record.name)} has no rules: {what}",
                file=sys.stderr,
            )
