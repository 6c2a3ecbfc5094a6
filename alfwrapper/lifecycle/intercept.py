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

Not yet: rules for one bound socket (every socket gets the rules for every socket),
knocking and interface rules, pinned state (so no runtime rules, reload, status or
explain SERVICE for these sockets; named sets change live).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import sys
from collections.abc import Sequence

from alfwrapper.errors import EX_OSERR, EX_USAGE, AlfError
from alfwrapper.host import notify
from alfwrapper.host.attach import SO_ATTACH_BPF, SO_LOCK_FILTER, socket_cookie
from alfwrapper.host.faults import crash_point
from alfwrapper.policy.files import Policy
from alfwrapper.policy.rules import SocketRules

NR_BIND, NR_LISTEN = 49, 50  # x86-64's: the filter notifies only the native ABI
CAP_NET_BIND_SERVICE = 10
SOCKADDR_MOST = 128  # sizeof(struct sockaddr_storage)


def rules_of(policy: Policy) -> SocketRules:
    """The rules every intercepted socket gets; what interception cannot do yet is an
    error, never a rule quietly left out."""
    if policy.names:
        raise AlfError("rules for named sockets", "a daemon's own sockets have no names",
                       "give rules for every socket (--allow CIDR, not NAME=CIDR)",
                       EX_USAGE)  # fmt: skip
    rules = policy.rules_for("")
    if rules.empty:
        raise AlfError("sockets", "none inherited, none to create, and no rules",
                       "give rules, and --listen or a socket unit, or let COMMAND bind "
                       "its own", EX_USAGE)  # fmt: skip
    if rules.knock is not None or rules.interfaces:
        raise AlfError("a daemon's own sockets", "cannot be given knock or interface "
                       "rules yet", "give the daemon its sockets (--listen, a socket "
                       "unit) for those", EX_USAGE)  # fmt: skip
    return rules


def prepare(policy: Policy, service: str) -> socket.socket:
    """The program loaded and the supervisor started; the channel that hand_over sends
    the listener down."""
    from alfwrapper import sets, state  # noqa: PLC0415
    from alfwrapper.bpf import program  # noqa: PLC0415
    from alfwrapper.bpf.parts import FillEnv  # noqa: PLC0415
    from alfwrapper.host import companion  # noqa: PLC0415

    rules = rules_of(policy)
    env = sets.fill_env(FillEnv.of_host([rules]), [rules])
    label = program.label(service, "any", 0)
    loaded = state.store().load_filter(rules, None, label, [], None, env)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        companion.spawn("alfwrapper.lifecycle.intercept", "bind supervisor",
                        [service, str(theirs.fileno()), str(loaded.fd)],
                        [theirs.fileno(), loaded.fd])  # fmt: skip
    finally:
        theirs.close()
    return ours


def hand_over(channel: socket.socket) -> None:
    """The filters loaded into this process (it execs COMMAND next), their listener
    sent to the supervisor, and its word awaited."""
    try:
        listener = notify.install()
    except (OSError, RuntimeError, ValueError) as err:
        raise AlfError("intercepting the daemon's binds (seccomp)", str(err),
                       "the unit's SystemCallFilter= must allow seccomp(2); Linux 5.6",
                       EX_OSERR) from None  # fmt: skip
    try:
        socket.send_fds(channel, [b"listener"], [listener])
        channel.settimeout(10)
        if channel.recv(16) != b"taken":
            raise OSError(errno.EPIPE, "the supervisor did not take the listener")
    except OSError as err:
        raise AlfError("handing the daemon's binds to the supervisor", str(err),
                       "its own message above says why", EX_OSERR) from None  # fmt: skip
    finally:
        os.close(listener)
        channel.close()


# --- the supervisor ---


class Supervisor:
    def __init__(self, listener: int, prog: int) -> None:
        self.listener, self.prog = listener, prog
        self.filtered: set[int] = set()  # cookies of the sockets it filtered
        self.taken = 0

    def serve(self, app_pidfd: int) -> None:
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
            except OSError as err:
                result = -(err.errno or errno.EPERM)
            except Exception as err:  # noqa: BLE001  (the call fails; we go on)
                print(f"alfwrapper: bind supervisor: {type(err).__name__}: {err}",
                      file=sys.stderr, flush=True)  # fmt: skip
                result = -errno.EPERM
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
                if inet:
                    self.filter(sock)
                backlog = struct.unpack("=i", struct.pack("=I", call.args[1] & 0xFFFFFFFF))[0]
                return notify.listen(fd, backlog)
            if not inet:
                return as_the_daemon(call.pid, fd, address)
            if sock.type == socket.SOCK_DGRAM:
                self.filter(sock)
            if not may_bind(call.pid, address):
                return -errno.EACCES
            return notify.bind(fd, address)
        finally:
            sock.close()
            os.close(fd)

    def filter(self, sock: socket.socket) -> None:
        """The program attached and locked, once a socket: before it can receive."""
        cookie = socket_cookie(sock)
        if cookie in self.filtered:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_BPF, self.prog)
            crash_point("intercept-attached")
            sock.setsockopt(socket.SOL_SOCKET, SO_LOCK_FILTER, 1)
        except OSError as err:  # a filter the daemon locked on it first: refused
            raise OSError(err.errno or errno.EPERM, "attaching the filter") from None
        self.filtered.add(cookie)
        self.taken += 1


def may_bind(pid: int, address: bytes) -> bool:
    """Whether the daemon itself may bind this port: one below
    ip_unprivileged_port_start needs its CAP_NET_BIND_SERVICE."""
    if len(address) < 4:
        return True
    port = int.from_bytes(address[2:4], "big")
    with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as f:  # noqa: PTH123
        first = int(f.read())
    return port == 0 or port >= first or bool(_status(pid)["CapEff"] >> CAP_NET_BIND_SERVICE & 1)


def _status(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:  # noqa: PTH123
        for line in f:
            key, _, value = line.partition(":")
            if key == "CapEff":
                return {key: int(value, 16)}
    return {"CapEff": 0}


def as_the_daemon(pid: int, fd: int, address: bytes) -> int:
    """A bind of another family (a Unix socket's path: its directory, permissions and
    owner are the daemon's) by a child that is the daemon for the file system: its
    root, working directory, umask, and user and group ids."""
    with open(f"/proc/{pid}/status") as f:  # noqa: PTH123
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
                os.chroot(f"/proc/{pid}/root")
                os.fchdir(cwd)
                os.umask(umask)
                os.setgroups(groups)
                os.setresgid(*gids)
                os.setresuid(*uids)
                code = -notify.bind(fd, address)
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
    finally:
        os.close(cwd)
    code = os.waitstatus_to_exitcode(status)
    return -code if code > 0 else (0 if code == 0 else -errno.EPERM)


def main(argv: Sequence[str]) -> int:
    """python3 -m alfwrapper.lifecycle.intercept SERVICE PIDFD READYFD CHANNEL PROG"""
    service, pidfd, ready_w = argv[0], int(argv[1]), int(argv[2])
    channel, prog = socket.socket(fileno=int(argv[3])), int(argv[4])
    from alfwrapper.host.companion import name_process  # noqa: PLC0415

    name_process(f"alfwrapper-bind {service}")
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
    Supervisor(fds[0], prog).serve(pidfd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
