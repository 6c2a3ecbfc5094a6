"""Daemons that bind their own sockets (nginx, Apache, PostgreSQL, Redis, ...): with no
socket inherited and none to create, the wrapper filters every TCP socket COMMAND, or
any process it starts, listens on, and every UDP socket it binds, before it can
receive a packet.

    wrapper: program loaded -> supervisor started (companion.spawn: not under the
      filter, so its own binds are never stopped) -> privileges dropped -> seccomp
      filters loaded (host/notify.py), their listener sent to the supervisor -> exec
    supervisor, for each stopped bind(2) or listen(2) of the daemon's:
      the socket taken (pidfd_getfd) -> if it is to receive (a TCP socket's listen,
      a UDP socket's bind), the filter attached and locked -> the call done by the
      supervisor on that very socket -> its result answered

The call is done here, on the socket that was checked, never let through to be done
again by the kernel on whatever the fd names by then (SECCOMP_USER_NOTIF_FLAG_CONTINUE
would be open to a thread swapping the fd), and with the sockaddr read once.  A bind
to a port below net.ipv4.ip_unprivileged_port_start needs the daemon's own
CAP_NET_BIND_SERVICE; a bind of any other family (a Unix socket's path) is done by a
child process that takes the daemon's root, working directory, umask and user and
group ids first.  A socket that only connects out is never bound by a call, so its
replies are never filtered.  If the supervisor dies, the kernel fails the daemon's
next bind and listen (ENOSYS): nothing listens unfiltered.  io_uring (whose bind and
listen need no system call of their own) is refused, and so are the other ABIs' bind
and listen (i386, x32).

Each socket is named PROTOCOL-PORT (``tcp-8080``, ``udp-53``: what a policy's
[socket.tcp-8080] gives rules of its own) and gets pinned state, as a socket of
--listen does (state.Store.take: the dispatcher attached and locked first, its empty
slot dropping, then the program in the slot), so that runtime rules, `reload`,
`status` and `explain SERVICE` reach it.  Not yet: knocking and interface rules.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import select
import socket
import struct
import sys
from collections.abc import Callable, Sequence

from alfwrapper.errors import EX_OSERR, EX_USAGE, AlfError
from alfwrapper.host import notify
from alfwrapper.host.attach import socket_cookie
from alfwrapper.host.faults import crash_point
from alfwrapper.lifecycle.sockets import SocketRecord
from alfwrapper.policy.files import Policy

NR_BIND, NR_LISTEN = 49, 50  # x86-64's: the filter notifies only the native ABI
CAP_NET_BIND_SERVICE = 10
SOCKADDR_MOST = 128  # sizeof(struct sockaddr_storage)


_NAME = re.compile(r"^(tcp|udp)-([1-9][0-9]{0,4})$")


def check(policy: Policy) -> None:
    """What interception cannot do is an error, never a rule quietly left out: the
    daemon's sockets are named PROTOCOL-PORT, and take no knock or interface rules."""
    for name in sorted(policy.names):
        found = _NAME.match(name)
        if not found or int(found.group(2)) > 65535:
            raise AlfError(
                f"rules for socket {name}",
                "a daemon's own sockets are named by protocol and port",
                "name them tcp-PORT or udp-PORT (--allow tcp-8080=CIDR)",
                EX_USAGE,
            )
    scopes = [policy.rules_for(n) for n in ["", *sorted(policy.names)]]
    if all(rules.empty for rules in scopes):
        raise AlfError(
            "sockets",
            "none inherited, none to create, and no rules",
            "give rules, and --listen or a socket unit, or let COMMAND bind its own",
            EX_USAGE,
        )
    if any(rules.knock is not None or rules.interfaces for rules in scopes):
        raise AlfError(
            "a daemon's own sockets",
            "cannot be given knock or interface rules yet",
            "give the daemon its sockets (--listen, a socket unit) for those",
            EX_USAGE,
        )


def prepare(policy: Policy, service: str, argv: list[str]) -> socket.socket:
    """The supervisor started, with the policy; the channel that hand_over sends the
    listener down.  Each rule set's program is loaded once here, so that one that
    cannot be is this start's error, and the supervisor's loads come from the cache."""
    from alfwrapper import sets, state  # noqa: PLC0415
    from alfwrapper.bpf import program  # noqa: PLC0415
    from alfwrapper.bpf.parts import FillEnv  # noqa: PLC0415
    from alfwrapper.host import companion  # noqa: PLC0415

    check(policy)
    from alfwrapper.lifecycle.kept import state_available  # noqa: PLC0415

    missing = state_available()
    if missing:
        raise AlfError(
            "a daemon's own sockets",
            f"need pinned state ({missing})",
            "mount the BPF file system (/sys/fs/bpf)",
            EX_OSERR,
        )
    for name in ["", *sorted(policy.names)]:
        rules = policy.rules_for(name)
        if not rules.empty:
            env = sets.fill_env(FillEnv.of_host([rules]), [rules])
            label = program.label(service, name[:3] or "any", 0)
            state.store_in_use().load_filter(rules, None, label, [], None, env)  # dropped again
    given = os.memfd_create("alfwrapper-policy", os.MFD_CLOEXEC)
    os.write(given, pickle.dumps((policy, argv)))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        companion.spawn(
            "alfwrapper.supervise",
            "bind supervisor",
            [service, str(theirs.fileno()), str(given)],
            [theirs.fileno(), given],
        )
    finally:
        theirs.close()
        os.close(given)
    return ours


def hand_over(channel: socket.socket) -> None:
    """The filters loaded into this process (it execs COMMAND next), their listener
    sent to the supervisor, and its word awaited."""
    try:
        listener = notify.install()
    except (OSError, RuntimeError, ValueError) as err:
        raise AlfError(
            "intercepting the daemon's binds (seccomp)",
            str(err),
            "the unit's SystemCallFilter= must allow seccomp(2); Linux 5.6",
            EX_OSERR,
        ) from None
    try:
        socket.send_fds(channel, [b"listener"], [listener])
        channel.settimeout(10)
        if channel.recv(16) != b"taken":
            raise OSError(errno.EPIPE, "the supervisor did not take the listener")
    except OSError as err:
        raise AlfError(
            "handing the daemon's binds to the supervisor",
            str(err),
            "its own message above says why",
            EX_OSERR,
        ) from None
    finally:
        os.close(listener)
        channel.close()


# --- the supervisor ---


class Supervisor:
    def __init__(self, listener: int, service: str, policy: Policy, argv: list[str],
                 app: int, build: Callable[[list[str]], Policy]) -> None:  # fmt: skip
        self.listener, self.service, self.policy, self.argv = listener, service, policy, argv
        self.app = app  # the application's pid: the sockets' holder, in their meta
        self.build = build
        self.seen: tuple[str, ...] = ()  # the reloads its sockets' metas name (their ids)
        self.filtered: set[int] = set()  # cookies of the sockets it filtered

    def current(self) -> Policy:
        """The policy in force: the start's, or the last `alfwrapper reload`'s, built
        again from the options the sockets' metas keep (with the files as they are
        now, as the reload read them) whenever a reload was done since."""
        from alfwrapper import state  # noqa: PLC0415

        try:
            held = state.store_in_use().sockets_of(self.service)
        except AlfError:
            held = []  # none yet: its first socket
        # This application's sockets alone: an earlier run's state, not collected
        # yet, may name a reload of its own, with the options of its own day.
        metas = [m for m in map(state.read_meta, held) if m.get("pid") == self.app]
        reloaded = [m for m in metas if m.get("reload")]
        reloads = tuple(sorted({str(m["reload"]) for m in reloaded}))
        if reloads and reloads != self.seen:
            newest = max(reloaded, key=lambda m: int(str(m.get("reloaded") or 0)))
            given = newest.get("argv")
            self.argv = [str(a) for a in given] if isinstance(given, list) else self.argv
            self.policy = self.build(self.argv)
            self.seen = reloads
        return self.policy

    def serve(self) -> None:
        """Until every process under the filter is gone (the listener hangs up)."""
        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        while True:
            events = poller.poll()
            if any(e & (select.POLLHUP | select.POLLERR) for _, e in events):
                return
            call = notify.receive(self.listener)
            if call is None:
                continue
            try:
                result = self.handle(call)
            except Exception as err:  # noqa: BLE001  (the call fails, said; we go on)
                said = err.line() if isinstance(err, AlfError) else f"{type(err).__name__}: {err}"
                call_name = "bind" if call.nr == NR_BIND else "listen"
                print(
                    f"alfwrapper: bind supervisor: {call_name} of process {call.pid} "
                    f"refused: {said.removeprefix('alfwrapper: ')}",
                    file=sys.stderr,
                    flush=True,
                )
                result = -((err.errno if isinstance(err, OSError) else 0) or errno.EPERM)
            notify.answer(self.listener, call, result)

    def handle(self, call: notify.Call) -> int:
        if call.nr not in (NR_BIND, NR_LISTEN):
            return -errno.ENOSYS
        address = b""
        if call.nr == NR_BIND:
            size = call.args[2] & 0xFFFFFFFF
            if not 2 <= size <= SOCKADDR_MOST:
                return -errno.EINVAL
            address = notify.read_memory(call.pid, call.args[1], size)
            if len(address) != size:
                return -errno.EFAULT
        pidfd = os.pidfd_open(call.pid)
        try:
            if not notify.valid(self.listener, call):  # the pidfd is of the caller
                return -errno.ESRCH
            fd = notify.take_fd(pidfd, call.args[0] & 0xFFFFFFFF)
        finally:
            os.close(pidfd)
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            os.close(fd)
            return -errno.ENOTSOCK
        try:
            crash_point("intercept-taken")
            inet = sock.family in (socket.AF_INET, socket.AF_INET6)
            if call.nr == NR_LISTEN:
                record = self.filter(sock, "tcp", sock.getsockname()[1]) if inet else None
                backlog = struct.unpack("=i", struct.pack("=I", call.args[1] & 0xFFFFFFFF))[0]
                return self.done(record, notify.listen(fd, backlog))
            if not inet:
                return as_the_daemon(call.pid, fd, address)
            port = int.from_bytes(address[2:4], "big") if len(address) >= 4 else 0
            record = None
            if sock.type == socket.SOCK_DGRAM:
                record = self.filter(sock, "udp", port)
            if not may_bind(call.pid, address):
                return -errno.EACCES
            return self.done(record, notify.bind(fd, address))
        finally:
            sock.close()
            os.close(fd)

    def filter(self, sock: socket.socket, protocol: str, port: int) -> SocketRecord | None:
        """The socket's filter, attached and locked before it can receive: its pinned
        state taken (the dispatcher first: its empty slot drops), its program loaded
        into the slot; once a socket.  None if it has one, or no rules."""
        from alfwrapper import sets, state  # noqa: PLC0415
        from alfwrapper.bpf import program  # noqa: PLC0415
        from alfwrapper.bpf.parts import FillEnv  # noqa: PLC0415

        cookie = socket_cookie(sock)
        if cookie in self.filtered:
            return None
        name = f"{protocol}-{port}" if port else protocol
        rules = self.current().rules_for(name)
        if rules.empty:
            return None
        record = SocketRecord(sock, name, rules)
        record.label = program.label(self.service, protocol, port)
        store = state.store_in_use()
        record.pins = store.take(self.service, sock, record.label, self.app).state
        crash_point("intercept-attached")
        env = sets.fill_env(FillEnv.of_host([rules]), [rules])
        record.loaded = store.load_filter(rules, record.pins, record.label, [], None, env)
        state.inherit_runtime(record.pins, name)  # before a packet meets it
        store.install(record.pins, record.loaded.fd)
        self.filtered.add(cookie)
        return record

    def done(self, record: SocketRecord | None, result: int) -> int:
        """After the call: a socket filtered and bound (or listening) is written down
        for status, reload and explain (its name now by the port it got)."""
        if record is not None and result == 0:
            from alfwrapper.lifecycle.kept import describe_sockets, refresh_early  # noqa: PLC0415

            port = record.sock.getsockname()[1]
            if record.name in ("tcp", "udp"):
                record.name = f"{record.name}-{port}"
            describe_sockets([record], self.service, self.argv, 0, 0, self.app, intercepted=True)
            refresh_early()
        return result


def may_bind(pid: int, address: bytes) -> bool:
    """Whether the daemon itself may bind this port: one below
    ip_unprivileged_port_start needs its CAP_NET_BIND_SERVICE."""
    if len(address) < 4:
        return True
    port = int.from_bytes(address[2:4], "big")
    with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as f:
        first = int(f.read())
    return port == 0 or port >= first or bool(_status(pid)["CapEff"] >> CAP_NET_BIND_SERVICE & 1)


def _status(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == "CapEff":
                return {key: int(value, 16)}
    return {"CapEff": 0}


def as_the_daemon(pid: int, fd: int, address: bytes) -> int:
    """A bind of another family (a Unix socket's path: its directory, permissions and
    owner are the daemon's) by a child that is the daemon for the file system: its
    root, working directory, umask, and user and group ids."""
    with open(f"/proc/{pid}/status") as f:
        lines = dict(line.split(":", 1) for line in f if ":" in line)
    uids = [int(v) for v in lines["Uid"].split()[:3]]
    gids = [int(v) for v in lines["Gid"].split()[:3]]
    groups = [int(v) for v in lines["Groups"].split()]
    umask = int(lines["Umask"], 8)
    cwd = os.open(f"/proc/{pid}/cwd", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        child = os.fork()
        if child == 0:
            code = errno.EPERM
            try:
                # Each step only where the daemon differs (chroot and setgroups need
                # capabilities a unit may not give: CAP_SYS_CHROOT, CAP_SETGID).
                root = os.stat(f"/proc/{pid}/root")
                if (root.st_dev, root.st_ino) != _identity("/"):
                    os.chroot(f"/proc/{pid}/root")
                os.fchdir(cwd)
                os.umask(umask)
                if sorted(groups) != sorted(os.getgroups()):
                    os.setgroups(groups)
                if tuple(gids) != os.getresgid():
                    os.setresgid(*gids)
                if tuple(uids) != os.getresuid():
                    os.setresuid(*uids)
                code = -notify.bind(fd, address)
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
    finally:
        os.close(cwd)
    code = os.waitstatus_to_exitcode(status)
    return -code if code > 0 else (0 if code == 0 else -errno.EPERM)


def _identity(path: str) -> tuple[int, int]:
    found = os.stat(path)
    return found.st_dev, found.st_ino


def main(argv: Sequence[str], build: Callable[[list[str]], Policy]) -> int:
    """python3 -m alfwrapper.supervise SERVICE PIDFD READYFD CHANNEL POLICY; ``build``
    makes a Policy of rule options (cli.wrapper.parse_policy), after a reload."""
    service, pidfd, ready_w = argv[0], int(argv[1]), int(argv[2])
    channel, given = socket.socket(fileno=int(argv[3])), int(argv[4])
    from alfwrapper.host.companion import name_process  # noqa: PLC0415

    name_process(f"alfwrapper-bind {service}")
    with os.fdopen(given, "rb") as f:
        f.seek(0)
        policy, options = pickle.loads(f.read())  # the wrapper's, by memfd
    app = pidfd_pid(pidfd)
    os.write(ready_w, b"ready")
    os.close(ready_w)
    channel.settimeout(60)
    try:
        _, fds, _, _ = socket.recv_fds(channel, 16, 1)
    except OSError as err:
        print(f"alfwrapper: bind supervisor: no listener ({err})", file=sys.stderr)
        return 1
    if not fds:
        return 1  # the wrapper failed before handing over: it said why
    channel.send(b"taken")
    channel.close()
    Supervisor(fds[0], service, policy, options, app, build).serve()
    return 0


def pidfd_pid(pidfd: int) -> int:
    """The pid a pidfd names (its fdinfo's Pid line)."""
    with open(f"/proc/self/fdinfo/{pidfd}") as f:
        for line in f:
            if line.startswith("Pid:"):
                return int(line.split()[1])
    return 0
