"""The wrapper's life, one socket record each: sockets, programs, attach, backlog, exec.

    Policy -> sockets (inherited, created) -> programs (planned, loaded, filled)
      -> attach and lock -> judge what was queued -> bind created sockets
      -> interface watcher -> drop privileges -> exec COMMAND

Created sockets are bound only after their filter is attached, so no packet
reaches them unfiltered.  Inherited sockets may hold connections and
datagrams that arrived before; backlog.py judges them.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from dataclasses import dataclass
from typing import NoReturn

from alfwrapper import activation, attach, backlog, compiler, interfaces, privileges, program
from alfwrapper.errors import (
    EX_CONFIG,
    EX_NOINPUT,
    EX_NOPERM,
    EX_OSERR,
    EX_USAGE,
    AlfError,
    excerpt,
)
from alfwrapper.parts import FillEnv
from alfwrapper.policy import Policy
from alfwrapper.rules import ListenSpec, SocketRules
from alfwrapper.sockets import bind_socket, open_socket


@dataclass
class SocketRecord:
    """One socket on its way to the application."""

    sock: socket.socket
    name: str
    rules: SocketRules
    spec: ListenSpec | None = None  # created by us (bound after attaching), else inherited
    loaded: compiler.LoadedFilter | None = None

    @property
    def inherited(self) -> bool:
        return self.spec is None

    @property
    def listener(self) -> bool:
        return self.sock.type == socket.SOCK_STREAM and not activation.is_connected_stream(
            self.sock
        )


def check_command(command: tuple[str, ...]) -> None:
    if not command:
        raise AlfError("usage", "no COMMAND given", "put the program to run after --", EX_USAGE)
    if shutil.which(command[0]) is None:
        raise AlfError(
            f"COMMAND {command[0]}",
            "not found or not executable",
            "give a path or a program on PATH",
            EX_NOINPUT,
        )


def check_names(policy: Policy, names: list[str]) -> None:
    """Every name the rules are scoped to must be some socket's."""
    unknown = sorted(policy.names - set(names))
    if unknown:
        origin = policy.origin_of_name(unknown[0])
        raise AlfError(
            f"{origin}: rules for {unknown[0]}",
            "no socket has that name",
            f"socket names: {', '.join(sorted(set(names)))}; name created sockets with "
            "--name, inherited ones with FileDescriptorName=",
            EX_USAGE if origin.startswith("--") else EX_CONFIG,
        )


def gather_sockets(policy: Policy) -> list[SocketRecord]:
    """Inherited sockets first, in their order, then the created ones (still unbound)."""
    records = [
        SocketRecord(sock, name, policy.rules_for(name))
        for sock, name in activation.inherit_sockets(os.environ, os.getpid())
    ]
    for spec in policy.listens:
        records.append(
            SocketRecord(open_socket(spec), spec.name, policy.rules_for(spec.name), spec)
        )
    if not records:
        raise AlfError(
            "sockets",
            "none inherited (LISTEN_FDS unset) and none to create",
            "add --listen [::]:PORT, or start from a socket unit",
            EX_USAGE,
        )
    check_names(policy, [r.name for r in records])
    return records


def load_programs(records: list[SocketRecord]) -> list[compiler.LoadedFilter]:
    """One program per distinct rule set: sockets with the same rules share it."""
    wanted = sorted({i for r in records for i in r.rules.interfaces})
    indexes = interfaces.resolve(wanted) if wanted else {}
    env = FillEnv({index: name for name, index in indexes.items()}, interfaces.link_index)
    loaded: dict[SocketRules, compiler.LoadedFilter] = {}
    for record in records:
        if record.rules.empty:
            continue
        if record.rules not in loaded:
            loaded[record.rules] = compiler.load_program(program.plan_program(record.rules), env)
        record.loaded = loaded[record.rules]
    # The knock part tells a listener's handshake from an accepted connection's
    # traffic by the socket's cookie: it must know its listeners before any
    # packet reaches them.
    for lf in loaded.values():
        if lf.plan.rules.knock:
            cookies = [
                attach.socket_cookie(r.sock) for r in records if r.loaded is lf and r.listener
            ]
            compiler.set_knock_listeners(lf.bpf, cookies)
    return list(loaded.values())


def attach_program(record: SocketRecord) -> None:
    """Attach and lock; a socket an earlier start locked cannot take a new filter."""
    assert record.loaded is not None
    try:
        attach.attach_filter(record.sock, record.loaded.fd)
    except AlfError as err:
        if not record.inherited or err.exit_code != EX_NOPERM:
            raise
        raise AlfError(
            f"filtering {attach.describe(record.sock)}",
            "it still carries the locked filter of an earlier start",
            "restart the socket unit to get a fresh socket; the old rules stay in force until then",
            EX_CONFIG,
        ) from None


def judge_backlog(record: SocketRecord, command: str) -> bool:
    """Deal with what reached an inherited socket before its filter (backlog.py).

    Returns False when the socket is a denied Accept=yes connection: it has
    been reset and COMMAND must not start.
    """
    assert record.loaded is not None
    sock, rules = record.sock, record.rules
    where = attach.describe(sock)
    judge = backlog.program_judge(record.loaded.fd, bool(rules.interfaces))
    if activation.is_connected_stream(sock):
        if rules.knock or rules.interfaces:
            kind = "knocking" if rules.knock else "--interface"
            raise AlfError(
                where,
                f"{kind} cannot check a connection handed over already accepted (Accept=yes)",
                "use Accept=no for this socket, or leave that rule out",
                EX_CONFIG,
            )
        try:
            peer = sock.getpeername()[0]
        except OSError:
            peer = "a peer that has already reset it"
        if backlog.connected_peer_allowed(sock, judge):
            return True
        backlog.reset(sock)
        print(
            f"alfwrapper: note: connection from {peer} denied and reset; {command} not started",
            file=sys.stderr,
        )
        return False
    try:
        if sock.type == socket.SOCK_STREAM:
            report = backlog.purge_listener(sock, judge)
        else:
            report = backlog.purge_datagrams(sock, judge)
    except OSError as err:
        raise AlfError(
            f"checking what reached {where} before its filter",
            err.strerror or str(err),
            "run `alfwrapper doctor`",
            EX_OSERR,
        ) from None
    if report.removed:
        print(f"alfwrapper: note: {where}: {report}", file=sys.stderr)
    return True


def start_watcher(loaded: list[compiler.LoadedFilter], label: str) -> None:
    following = [lf for lf in loaded if lf.plan.rules.interfaces]
    if following:
        interfaces.start_watcher(
            [
                interfaces.WatchedMap(
                    lf.bpf[b"iface_allowed"].map_fd,
                    lf.plan.rules.interfaces,
                    lf.bpf[b"iface_alive"].map_fd,
                )
                for lf in following
            ],
            label,
        )


def run(policy: Policy) -> int | NoReturn:
    """Sockets in, filters on, exec.  Returns (0) only when an Accept=yes peer was denied."""
    check_command(policy.command)
    records = gather_sockets(policy)
    loaded = load_programs(records)
    for record in records:
        if record.loaded is not None:
            attach_program(record)
    for record in records:
        if record.inherited and record.loaded is not None:
            if not judge_backlog(record, policy.command[0]):
                return 0
    for record in records:
        if record.spec is not None:
            bind_socket(record.sock, record.spec)
    for record in records:
        if record.loaded is None:
            print(
                f"alfwrapper: note: {attach.describe(record.sock)} named "
                f"{excerpt(record.name)} has no rules and is not filtered",
                file=sys.stderr,
            )
    start_watcher(loaded, os.path.basename(policy.command[0]))
    privileges.drop_privileges()
    activation.exec_with_sockets(
        [r.sock for r in records], [r.name for r in records], policy.command, os.environ
    )
