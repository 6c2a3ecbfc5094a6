"""The sd_listen_fds(3) protocol, both ways: inherit sockets, and exec with them.

The pure part reads and writes the environment variables (LISTEN_FDS,
LISTEN_PID, LISTEN_FDNAMES); the fd part checks the inherited descriptors and
moves the filtered sockets to fd 3 onwards just before exec.
"""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import signal
import socket
from collections.abc import Mapping, MutableMapping, Sequence

from alfwrapper.errors import EX_CONFIG, EX_NOINPUT, EX_OSERR, AlfError, excerpt

SD_LISTEN_FDS_START = 3  # sd-daemon.h
SOCK_STREAM, SOCK_DGRAM = socket.SOCK_STREAM, socket.SOCK_DGRAM
LISTEN_VARS = ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")
# nginx's own list of inherited sockets, "3;4;" (NGINX_VAR in its src/core/nginx.h,
# read by ngx_add_inherited_sockets): the same fds as LISTEN_FDS, which nginx ignores.
NGINX_VAR = "NGINX"
DEFAULT_NAME = "unknown"  # what sd_listen_fds_with_names(3) reports for unnamed fds
INETD_NAME = "stdin"  # the name of a socket handed over on fd 0 (inetd_socket)

TYPE_CHECKING = False  # typing, and dataclasses' inspect, cost an Accept=yes connection 13 ms
if TYPE_CHECKING:
    from typing import NoReturn


class ListenEnv:
    """What the parent passed: ``count`` fds from 3 on, with these names."""

    __slots__ = ("count", "names")

    def __init__(self, count: int, names: tuple[str, ...]) -> None:
        self.count = count
        self.names = names


def parse_listen_env(environ: Mapping[str, str], pid: int) -> ListenEnv:
    """Read LISTEN_* as sd_listen_fds(3) does, but refuse instead of ignoring.

    Not python-systemd's listen_fds_with_names(): like sd_listen_fds() it quietly
    returns no fds when LISTEN_PID names another process, or LISTEN_FDS is not a
    number.  A firewall must not: those fds would reach the application unfiltered.
    The fds themselves are checked with python-systemd (sd_is_socket(3)).
    """
    fds_text = environ.get("LISTEN_FDS")
    if fds_text is None:
        return ListenEnv(0, ())
    what = "inherited sockets (LISTEN_FDS)"
    if not fds_text.isdigit() or not fds_text.isascii():
        raise AlfError(
            what,
            f"LISTEN_FDS={excerpt(fds_text, quote=False)} is not a number",
            "fix the parent that sets it",
            EX_CONFIG,
        )
    count = int(fds_text)
    if count > _max_fd() - SD_LISTEN_FDS_START:
        raise AlfError(
            what,
            f"LISTEN_FDS={excerpt(fds_text, quote=False)} is more fds than this process can hold",
            "fix the parent that sets it",
            EX_CONFIG,
        )
    pid_text = environ.get("LISTEN_PID")
    if pid_text is None:
        raise AlfError(
            what,
            "LISTEN_FDS is set but LISTEN_PID is not",
            "the parent must set LISTEN_PID to the wrapper's pid",
            EX_CONFIG,
        )
    if pid_text != str(pid):
        raise AlfError(
            what,
            f"LISTEN_PID={excerpt(pid_text, quote=False)} is not this process ({pid})",
            "these sockets were meant for another process; start alfwrapper "
            "directly from the socket unit or systemd-socket-activate",
            EX_CONFIG,
        )
    names_text = environ.get("LISTEN_FDNAMES")
    names = names_text.split(":") if names_text else []
    if len(names) > count:
        raise AlfError(
            what,
            f"LISTEN_FDNAMES has {len(names)} names for {count} fds",
            "fix the parent that sets it",
            EX_CONFIG,
        )
    names += [DEFAULT_NAME] * (count - len(names))
    return ListenEnv(count, tuple(names))


# Settings for the wrapper's own libraries, not the application's: numpy's OpenBLAS
# starts a thread for each core as it loads (about 0.08 s of CPU at every start here,
# more on bigger machines), and alfwrapper does no linear algebra.
OWN_SETTINGS = {"OPENBLAS_NUM_THREADS": "1"}
_set_here: set[str] = set()


def own_environment(environ: MutableMapping[str, str]) -> None:
    """Give this process's libraries OWN_SETTINGS where the environment has none (before
    they load); child_environment leaves out what was set here."""
    for key, value in OWN_SETTINGS.items():
        if key not in environ:
            environ[key] = value
            _set_here.add(key)


def child_environment(environ: Mapping[str, str], names: Sequence[str], pid: int) -> dict[str, str]:
    """The application's environment: ours, with LISTEN_* describing the filtered fds
    (and NGINX listing them for nginx), and without what own_environment set.

    LISTEN_PID is our pid, which exec keeps.  An NGINX we were given is never passed
    on: its fds are closed by then.
    """
    dropped = {*LISTEN_VARS, NGINX_VAR, *_set_here}
    env = {k: v for k, v in environ.items() if k not in dropped}
    if names:
        env["LISTEN_FDS"] = str(len(names))
        env["LISTEN_PID"] = str(pid)
        env["LISTEN_FDNAMES"] = ":".join(names)
        fds = range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + len(names))
        env[NGINX_VAR] = "".join(f"{fd};" for fd in fds)
    return env


def inherit_sockets(environ: Mapping[str, str], pid: int) -> list[tuple[socket.socket, str]]:
    """The inherited sockets, each with its name, in fd order."""
    listen = parse_listen_env(environ, pid)
    sockets = []
    for i in range(listen.count):
        fd = SD_LISTEN_FDS_START + i
        where = f"inherited fd {fd} ({listen.names[i]})"
        if not _inet_socket(fd, where, "LISTEN_FDS counts more fds than were passed"):
            raise AlfError(
                where,
                "is not a socket",
                "alfwrapper filters sockets only; pass only sockets",
                EX_CONFIG,
            )
        sock = socket.socket(fileno=fd)
        if sock.type == socket.SOCK_STREAM and is_connected_stream(sock):
            try:
                sock.getpeername()
            except OSError:
                raise AlfError(
                    where,
                    "is a TCP socket that is neither listening nor connected (never "
                    "listened, or a connection its peer reset before it was handed over)",
                    "pass listening sockets (ListenStream=) or Accept=yes connections",
                    EX_CONFIG,
                ) from None
        sockets.append((sock, listen.names[i]))
    return sockets


def _inet_socket(fd: int, where: str, closed_hint: str) -> bool:
    """Is fd a socket (sd_is_socket(3), python3-systemd)?  If so, it must be TCP or UDP."""
    from systemd import daemon  # noqa: PLC0415

    try:
        if not daemon.is_socket(fd):
            return False
    except OSError as err:
        raise AlfError(where, err.strerror or str(err), closed_hint, EX_CONFIG) from None
    if not any(daemon.is_socket_inet(fd, 0, kind) for kind in (SOCK_STREAM, SOCK_DGRAM)):
        raise AlfError(
            where,
            "is not a TCP or UDP socket",
            "alfwrapper filters IP sockets only (ListenStream=/ListenDatagram=)",
            EX_CONFIG,
        )
    return True


def inetd_socket(taken: Sequence[socket.socket]) -> socket.socket | None:
    """fd 0, when it is a socket that LISTEN_FDS did not pass as well: the way inetd,
    systemd's StandardInput=socket and systemd-socket-activate --inetd hand over a
    connection (Accept=yes) or a datagram socket (Accept=no), with fd 1 the same
    socket.  tcpd(8) checked fd 0 the same way.  A Unix socket on fd 0 (a pipe of a
    supervisor) is none of ours; any other socket family is refused."""
    try:
        if not daemon_socket(0):
            return None
    except OSError:  # fd 0 is closed
        return None
    if not _inet_socket(0, f"fd 0 ({INETD_NAME})", ""):
        return None
    if any(_same_file(0, sock.fileno()) for sock in taken):
        return None
    return socket.socket(fileno=0)


def _same_file(fd: int, other: int) -> bool:
    one, two = os.fstat(fd), os.fstat(other)
    return (one.st_dev, one.st_ino) == (two.st_dev, two.st_ino)


def divert_inetd_streams() -> dict[int, int]:
    """When fd 1 or fd 2 is the inetd socket on fd 0 (StandardOutput=socket, and
    StandardError= left to inherit it), anything written there would reach the peer:
    the wrapper's own messages, and whatever a library prints (BCC writes to stdout).
    Point them at the journal (python3-systemd), or nowhere when journald does not
    run, for the wrapper's whole life.  Returns the saved fds to put back for the
    application (exec_with_sockets), by the fd they were."""
    saved: dict[int, int] = {}
    try:
        if not daemon_socket(0):
            return saved
        streams = [fd for fd in (1, 2) if _same_file(0, fd)]
    except OSError:
        return saved
    for fd in streams:
        saved[fd] = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, SD_LISTEN_FDS_START)
        try:
            from systemd import journal  # noqa: PLC0415

            with journal.stream("alfwrapper") as stream:
                os.dup2(stream.fileno(), fd)
        except OSError:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
    return saved


def daemon_socket(fd: int) -> bool:
    """Is fd a socket, other than a Unix one (sd_is_socket(3), python3-systemd)?"""
    from systemd import daemon  # noqa: PLC0415

    return bool(daemon.is_socket(fd)) and not daemon.is_socket_unix(fd)


def inherit_unix_listener(environ: Mapping[str, str], pid: int) -> socket.socket | None:
    """The one listening Unix stream socket a service like the loader is passed (fd 3),
    or None when nothing was passed."""
    from systemd import daemon  # noqa: PLC0415

    listen = parse_listen_env(environ, pid)
    if listen.count == 0:
        return None
    fd = SD_LISTEN_FDS_START
    if listen.count != 1 or not daemon.is_socket(fd):
        raise AlfError("inherited sockets (LISTEN_FDS)", "expected one Unix socket", "", EX_CONFIG)
    if not daemon.is_socket_unix(fd, SOCK_STREAM, 1):
        raise AlfError(
            f"inherited fd {fd}",
            "is not a listening Unix stream socket",
            "use ListenStream=PATH",
            EX_CONFIG,
        )
    sock = socket.socket(fileno=fd)
    for name in LISTEN_VARS:
        os.environ.pop(name, None)
    return sock


def is_connected_stream(sock: socket.socket) -> bool:
    """A stream socket handed over already connected (Accept=yes), not listening."""
    return sock.type == socket.SOCK_STREAM and not sock.getsockopt(
        socket.SOL_SOCKET, socket.SO_ACCEPTCONN
    )


def exec_with_sockets(
    sockets: Sequence[socket.socket],
    names: Sequence[str],
    argv: Sequence[str],
    environ: Mapping[str, str],
    diverted: Mapping[int, int] | None = None,
    held: Sequence[socket.socket] = (),
) -> NoReturn:
    """Exec argv with the sockets at fds 3, 4, ... and nothing else open above 2 (an
    inetd socket stays at fds 0 and 1) but the ``held`` sockets, right after them and
    not in LISTEN_FDS: SPA sockets, which deliver nothing and must stay open while the
    application runs (no other process is left to hold them).  ``diverted``, from
    divert_inetd_streams: the streams to give back to the application, which the
    wrapper kept off the peer."""
    sockets = [*sockets, *held]  # the held ones placed as sockets are, counted apart
    count = len(sockets)
    diverted = diverted or {}
    # Where the wrapper's messages went, kept (above the sockets) in case exec fails.
    kept = {
        fd: fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, SD_LISTEN_FDS_START + count) for fd in diverted
    }
    for fd, original in diverted.items():
        os.dup2(original, fd)
    env = child_environment(environ, names, os.getpid())  # LISTEN_FDS: len(names)
    # Park every socket above the target range first, so that no dup2 below
    # overwrites a socket that is still to be moved.
    parked = [
        fcntl.fcntl(s.fileno(), fcntl.F_DUPFD_CLOEXEC, SD_LISTEN_FDS_START + count) for s in sockets
    ]
    for sock in sockets:
        sock.detach()  # the socket objects must not close fds in the target range
    for i, fd in enumerate(parked):
        os.dup2(fd, SD_LISTEN_FDS_START + i, inheritable=True)
    low = SD_LISTEN_FDS_START + count
    for keep in sorted(kept.values()):
        os.closerange(low, keep)
        low = keep + 1
    os.closerange(low, _max_fd())
    # Python ignores SIGPIPE and SIGXFSZ, and exec would hand that on.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvpe(argv[0], list(argv), env)
    except OSError as err:
        for fd, away in kept.items():  # the message is not for the peer either
            os.dup2(away, fd)
        # Every other fd is closed by now, so the process must end without the
        # interpreter's clean-up (BCC's would fail on the closed fds).
        raise AlfError(
            f"starting {argv[0]}",
            err.strerror or str(err),
            "check COMMAND: an executable file, with its interpreter present",
            EX_NOINPUT if err.errno in (errno.ENOENT, errno.ENOEXEC, errno.EACCES) else EX_OSERR,
            exit_now=True,
        ) from None


def _max_fd() -> int:
    """Above every fd we could hold: the hard limit, not the soft one SC_OPEN_MAX gives."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = hard if hard != resource.RLIM_INFINITY else 1 << 20
    return max(soft, min(limit, 1 << 30))


def unit_of_this_process() -> str:
    """The systemd service this process runs in (its cgroup's .service), without .service."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return ""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        units = [p for p in path.split("/") if p.endswith(".service")]
        if units and not units[-1].startswith("user@"):
            return units[-1][: -len(".service")]
    return ""
