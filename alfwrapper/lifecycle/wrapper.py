"""The wrapper's life, one socket record each: sockets, state, programs, backlog, exec.

    Policy -> sockets (inherited, created) -> each taken: its pinned state found by
      cookie or made, and the fixed dispatcher attached and locked (state.take_socket;
      its empty slot drops) -> programs (planned, loaded, filled) -> into each
      socket's slot -> judge what was queued on inherited sockets not judged yet ->
      bind created sockets -> interface watcher -> drop privileges -> exec COMMAND

Created sockets are bound only after their filter is attached, so no packet
reaches them unfiltered.  Inherited sockets may hold connections and
datagrams that arrived before; backlog.py judges them.  A socket an earlier
start filtered (a restart, an idle exit and a new activation) keeps its
dispatcher: the new program takes over the slot in one update.  Each step that
changes the kernel's or the pinned state is a crash point (faults.py): a start
killed anywhere leaves a state the next start settles (state.take_socket).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from typing import NoReturn

from alfwrapper import state
from alfwrapper.bpf import compiler, program
from alfwrapper.bpf.parts import FillEnv, knock_key
from alfwrapper.errors import EX_CONFIG, EX_NOINPUT, EX_OSERR, EX_USAGE, AlfError, excerpt
from alfwrapper.host import activation, attach, interfaces, privileges
from alfwrapper.host.faults import crash_point
from alfwrapper.lifecycle import backlog
from alfwrapper.lifecycle.sockets import bind_socket, open_socket
from alfwrapper.policy.files import Policy
from alfwrapper.policy.rules import ListenSpec, SocketRules


@dataclass
class SocketRecord:
    """One socket on its way to the application."""

    sock: socket.socket
    name: str
    rules: SocketRules
    spec: ListenSpec | None = None  # created by us (bound after attaching), else inherited
    loaded: compiler.LoadedFilter | None = None
    pins: state.SocketState | None = None  # its pinned state, unless Accept=yes
    judged: bool = False  # what was queued on it is judged (state.take_socket)
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

    def label(self, service: str) -> str:
        """Its programs' and maps' name (program.label); a created socket is not bound yet."""
        port = self.spec.port if self.spec else self.sock.getsockname()[1]
        return program.label(service, self.protocol, port)


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
    """Inherited sockets first (an inetd one on fd 0, then LISTEN_FDS' in their
    order), then the created ones (still unbound)."""
    inherited = activation.inherit_sockets(os.environ, os.getpid())
    stdin = activation.inetd_socket([sock for sock, _ in inherited])
    if stdin is not None:
        inherited.insert(0, (stdin, activation.INETD_NAME))
    records = [SocketRecord(sock, name, policy.rules_for(name)) for sock, name in inherited]
    for spec in policy.listens:
        records.append(
            SocketRecord(open_socket(spec), spec.name, policy.rules_for(spec.name), spec)
        )
    if not records:
        raise AlfError(
            "sockets",
            "none inherited (LISTEN_FDS unset, and fd 0 is no TCP or UDP socket) and "
            "none to create",
            "add --listen [::]:PORT, or start from a socket unit",
            EX_USAGE,
        )
    check_names(policy, [r.name for r in records])
    return records


def load_programs(records: list[SocketRecord], service: str) -> list[compiler.LoadedFilter]:
    """A program for each socket with pinned state (its maps are its own), and one
    per distinct rule set for the others (every socket when no state can be kept).
    None for a connected Accept=yes socket: its rules judge its one peer
    (judge_connection)."""
    env = fill_env(records)
    shared: dict[SocketRules, compiler.LoadedFilter] = {}
    loaded: list[compiler.LoadedFilter] = []
    for record in records:
        if record.connected:
            continue
        if record.pins is not None:
            record.loaded = state.store().load_filter(
                record.rules, record.pins, record.label(service), listeners([record]), env=env
            )
            loaded.append(record.loaded)
        elif not record.rules.empty:
            if record.rules not in shared:
                sharing = [r for r in records if r.pins is None and r.rules == record.rules]
                shared[record.rules] = state.store().load_filter(
                    record.rules, None, record.label(service), listeners(sharing), record.sock, env
                )
                loaded.append(shared[record.rules])
            record.loaded = shared[record.rules]
    return loaded


def fill_env(records: list[SocketRecord]) -> FillEnv:
    wanted = sorted({i for r in records for i in r.rules.interfaces})
    indexes = interfaces.resolve(wanted) if wanted else {}
    return FillEnv({index: name for name, index in indexes.items()}, interfaces.link_index)


def listeners(records: list[SocketRecord]) -> list[int]:
    """The cookies of the listening sockets among these (sharing one program).  The
    knock part tells a listener's handshake from an accepted connection's traffic by
    the socket's cookie: it must know its listeners before any packet reaches them."""
    return [attach.socket_cookie(r.sock) for r in records if r.listener and r.rules.knock]


def take_sockets(records: list[SocketRecord], service: str) -> None:
    """Each kept socket filtered by its pinned dispatcher (state.take_socket), found again
    by its cookie or made.  A connected (Accept=yes) socket lives as long as its one
    connection: no state."""
    for record in records:
        if record.connected:
            continue
        taken = state.take_socket(state.store(), service, record.sock, record.label(service))
        record.pins, record.judged, record.made = taken.state, taken.judged, taken.made


def install_programs(records: list[SocketRecord]) -> None:
    """Programs into slots (atomically), or, where no state is kept, onto the sockets."""
    for record in records:
        if record.pins is not None:
            assert record.loaded is not None
            state.clear_runtime(record.pins)  # runtime rules last until the next start
            state.install(record.pins, record.loaded.fd)
        elif record.loaded is not None:
            attach.attach_filter(record.sock, record.loaded.fd)
    crash_point("installed")


def rule_counts(rules: SocketRules) -> dict[str, int]:
    """How many rules of each kind, for status."""
    return {
        "allow": len(rules.subnets.allow),
        "deny": len(rules.subnets.deny),
        "interface": len(rules.interfaces),
        "knock": int(rules.knock is not None),
        "filter": int(rules.custom is not None),
        "log-drops": rules.log_rate,
    }


def start_forwarder(
    logging: list[tuple[str, state.SocketState]], service: str, app_pid: int = 0
) -> int:
    """The journal forwarder of the drop log of these sockets (name, state), if any and
    journald runs; its pid, or 0 (events then wait in the ring buffers for
    `alfwrapper log`)."""
    from alfwrapper.host import companion  # noqa: PLC0415
    from alfwrapper.lifecycle import droplog  # noqa: PLC0415

    if not logging or not droplog.journald_present():
        return 0
    fds = [state.open_pin(where, "events") for _, where in logging]
    try:
        args = [service] + [f"{name}:{fd}" for (name, _), fd in zip(logging, fds, strict=True)]
        return companion.spawn(
            "alfwrapper.lifecycle.droplog", "drop log forwarder", args, fds, app_pid
        )
    finally:
        for fd in fds:
            os.close(fd)


def describe_sockets(
    records: list[SocketRecord], service: str, argv: list[str], watcher: int, forwarder: int
) -> None:
    """What status and reload need to know, in each socket's pinned meta."""
    for record in records:
        if record.pins is None:
            continue
        host, port = record.sock.getsockname()[:2]
        state.write_meta(
            record.pins,
            {
                "service": service,
                "name": record.name,
                "protocol": record.protocol,
                "address": host,
                "port": port,
                "pid": os.getpid(),
                "watcher": watcher,
                "forwarder": forwarder,
                "rules": rule_counts(record.rules),
                "netns": state.netns_cookie(),
                "argv": argv,
                "cwd": os.getcwd(),
                "knock": knock_key(record.rules) if record.rules.knock else "",
                "started": int(time.time()),
                "program": compiler.prog_id(record.loaded) if record.loaded else 0,
                "judged": True,
            },
        )


def judge_connection(record: SocketRecord, command: str) -> bool:
    """Judge the peer of a connected Accept=yes socket by its rules, before COMMAND
    starts (backlog.rules_judge: no program, no BCC).  Returns False when it is
    denied, or gone: the connection has been reset and COMMAND must not start."""
    sock, rules = record.sock, record.rules
    if rules.knock or rules.interfaces or rules.custom:
        # Their verdict needs packets this connection's were not: its handshake
        # (knocking), its interface, or any header a developer's filter reads.
        kind = "knocking" if rules.knock else "--interface" if rules.interfaces else "--filter"
        raise AlfError(
            attach.describe(sock),
            f"{kind} cannot check a connection handed over already accepted (Accept=yes)",
            "use Accept=no for this socket, or leave that rule out",
            EX_CONFIG,
        )
    if rules.empty:
        return True  # not filtered (the note says so)
    try:
        peer = sock.getpeername()[0]
    except OSError:
        peer = "a peer that has already reset it"
    if backlog.connected_peer_allowed(sock, backlog.rules_judge(rules.subnets)):
        return True
    backlog.reset(sock)
    print(
        f"alfwrapper: note: connection from {peer} denied and reset; {command} not started",
        file=sys.stderr,
    )
    return False


def judge_backlog(record: SocketRecord) -> None:
    """Deal with what reached an inherited listening or datagram socket before its
    filter (backlog.py)."""
    assert record.loaded is not None
    sock, rules = record.sock, record.rules
    where = attach.describe(sock)
    judge = backlog.program_judge(record.loaded.fd, bool(rules.interfaces or rules.custom))
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


def start_watcher(loaded: list[compiler.LoadedFilter], service: str, app_pid: int = 0) -> int:
    """The interface watcher for the programs with interface rules; its pid, or 0."""
    following = [lf for lf in loaded if lf.plan.rules.interfaces]
    if not following:
        return 0
    return interfaces.start_watcher(
        [
            interfaces.WatchedMap(
                lf.bpf[b"iface_allowed"].map_fd,
                lf.plan.rules.interfaces,
                lf.bpf[b"iface_alive"].map_fd,
                lf.bpf[b"iface_lease"].map_fd,
            )
            for lf in following
        ],
        service,
        app_pid,
    )


def state_available() -> str:
    """Why this wrapper cannot keep pinned state, or "" if it can.  Without it, each
    socket gets its program directly, which no restart or reload can replace."""
    try:
        state.store().root(create=True)
        return ""
    except AlfError as err:
        return f"{err.what}: {err.why}"


def collect_stale_state() -> None:
    """Forget what sockets of this namespace that are gone left behind.  Done once the
    programs are in, not before: sock_diag's library (pyroute2, about 15 MiB) then
    adds nothing to the start-up's peak memory, which BCC's compile sets."""
    try:
        state.store().gc()
    except (AlfError, OSError) as err:
        print(f"alfwrapper: note: the state of gone sockets was not removed ({err}); "
              "`alfwrapper gc` removes it", file=sys.stderr)  # fmt: skip


def run(
    policy: Policy,
    service: str,
    argv: list[str],
    keep_capabilities: bool = True,
    diverted: dict[int, int] | None = None,
) -> int | NoReturn:
    """Sockets in, filters on, exec.  Returns (0) only when an Accept=yes peer was denied.

    ``service`` names the pinned state; ``argv`` (the rule options) is kept in
    it so that `alfwrapper reload` can build the policy again.  The application
    keeps the capabilities the unit gave, but those that reach its filter,
    unless not ``keep_capabilities`` (privileges.py).  ``diverted``: the
    streams activation.divert_inetd_streams kept off an inetd peer, for the application."""
    check_command(policy.command)
    state.check_meta_room(argv, os.getcwd())
    import seccomp  # noqa: F401, PLC0415  (before any work: privileges.deny_bpf_syscall needs it)

    records = gather_sockets(policy)
    if any(r.rules.interfaces or r.rules.log_rate for r in records):
        from alfwrapper.host import companion  # noqa: PLC0415

        companion.check_libraries()  # of the watcher and the forwarder
    from alfwrapper.loader import client  # noqa: PLC0415

    if client.use_if_needed():
        following = sorted({i for r in records for i in r.rules.interfaces})
        if following:
            raise AlfError(
                f"--interface {following[0]}",
                "without CAP_BPF, filters come from the loader, which cannot follow "
                "interface renames for you",
                "use subnet rules, or give the service CAP_BPF",
                EX_USAGE,
            )
    unpinned = state_available() if any(not r.connected for r in records) else ""
    pinned = any(not r.connected for r in records) and not unpinned
    try:
        if pinned:
            take_sockets(records, service)
        loaded = load_programs(records, service)
        crash_point("loaded")
        install_programs(records)
        for record in records:
            if record.connected:
                if not judge_connection(record, policy.command[0]):
                    return 0
            elif record.inherited and not record.judged and record.loaded is not None:
                judge_backlog(record)
        crash_point("judged")
        for record in records:
            if record.pins is not None and not record.judged:
                state.mark_judged(record.pins)
        for record in records:
            if record.spec is not None:
                bind_socket(record.sock, record.spec)
        crash_point("bound")
    except BaseException:
        # A created socket dies with this process, and its state is of no use; an
        # inherited one keeps its state (its dispatcher is attached: the next start
        # takes it from there).
        for record in records:
            if record.made and record.spec is not None and record.pins is not None:
                state.store().remove(record.pins)
        raise
    if pinned:
        collect_stale_state()
    if unpinned:
        print(
            f"alfwrapper: note: no pinned state ({unpinned}): the filters cannot be "
            "reloaded, and a restart cannot re-filter an inherited socket",
            file=sys.stderr,
        )
    for record in records:
        if record.rules.empty:
            what = (
                "every packet passes until a reload gives it rules"
                if record.pins
                else "it is not filtered"
            )  # fmt: skip
            print(
                f"alfwrapper: note: {attach.describe(record.sock)} named "
                f"{excerpt(record.name)} has no rules: {what}",
                file=sys.stderr,
            )
    watcher = start_watcher(loaded, service)
    forwarder = start_forwarder(
        [(r.name, r.pins) for r in records if r.pins is not None and r.rules.log_rate],
        service,
    )
    describe_sockets(records, service, argv, watcher, forwarder)
    crash_point("described")
    note = privileges.confine_application(keep_capabilities)
    if note:
        print(f"alfwrapper: note: {note}", file=sys.stderr)
    moved = [r for r in records if not r.stdin]
    for record in records:
        if record.stdin:
            record.sock.detach()  # fd 0 (and 1) stay as they are
    activation.exec_with_sockets(
        [r.sock for r in moved], [r.name for r in moved], policy.command, os.environ, diverted
    )
