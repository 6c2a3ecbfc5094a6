"""seccomp user notification (Linux 5.0; pidfd_getfd 5.6): the daemon's bind(2) and
listen(2) stopped in the kernel and handed to a supervisor (lifecycle/intercept.py),
which takes the socket itself (pidfd_getfd), does the call itself on that socket,
and answers with its result.

The filters are libseccomp's (python3-seccomp): the native one notifies bind and
listen and fails io_uring_setup (io_uring binds and listens from Linux 6.11); on
x86-64 a second one fails bind, listen, socketcall and io_uring_setup of the 32-bit
entry points (i386, x32), so that no other ABI reaches a socket unseen.  The
notifications themselves are read and answered here with the ioctls
(seccomp_unotify(2)): libseccomp's Python binding answers only through the filter
object of the process that loaded it, and the supervisor is another process, started
before the filter, so that its own binds are never stopped.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct

from alfwrapper.host.libc import LIBC

# struct seccomp_notif: id, pid, flags, then struct seccomp_data: nr, arch, ip, args[6].
NOTIF = struct.Struct("=QIIiIQ6Q")
# struct seccomp_notif_resp: id, val, error, flags.
RESP = struct.Struct("=QqiI")
IOCTL_RECV = 0xC0502100  # SECCOMP_IOCTL_NOTIF_RECV: _IOWR('!', 0, struct seccomp_notif)
IOCTL_SEND = 0xC0182101  # SECCOMP_IOCTL_NOTIF_SEND: _IOWR('!', 1, struct seccomp_notif_resp)
IOCTL_ID_VALID = 0x40082102  # SECCOMP_IOCTL_NOTIF_ID_VALID: _IOW('!', 2, __u64)
SYS_PIDFD_GETFD = 438
INTERCEPTED = ("bind", "listen")
ELSEWHERE = ("bind", "listen", "socketcall", "io_uring_setup")  # other ABIs: refused


class Call:
    """One stopped system call."""

    def __init__(self, raw: bytes) -> None:
        self.id, self.pid, _, self.nr, self.arch, _, *args = NOTIF.unpack(raw)
        self.args = tuple(args)


def install() -> int:
    """Load the filters into this process (and all it starts, across exec); the
    listener's fd.  Run after no_new_privs is set or with CAP_SYS_ADMIN, as
    privileges.deny_bpf_syscall is."""
    import seccomp  # noqa: PLC0415  (python3-seccomp)

    if os.uname().machine == "x86_64":  # (system_arch() is unsigned, Arch signed)
        others = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
        others.set_attr(seccomp.Attr.CTL_NNP, 0)
        others.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.ALLOW)
        for arch in (seccomp.Arch.X86, seccomp.Arch.X32):
            others.add_arch(arch)
        others.remove_arch(seccomp.Arch.NATIVE)
        for name in ELSEWHERE:
            others.add_rule(seccomp.ERRNO(errno.EPERM), name)
        others.load()
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    rules.set_attr(seccomp.Attr.CTL_NNP, 0)
    rules.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.ALLOW)  # the filter above's
    for name in INTERCEPTED:
        rules.add_rule(seccomp.NOTIFY, name)
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "io_uring_setup")
    rules.load()
    return int(rules.get_notify_fd())


def receive(listener: int) -> Call | None:
    """The next stopped call (blocks); None if its caller went away meanwhile."""
    buf = bytearray(NOTIF.size)  # zeroed, as the kernel wants it
    try:
        fcntl.ioctl(listener, IOCTL_RECV, buf)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.EINTR):
            return None
        raise
    return Call(bytes(buf))


def valid(listener: int, call: Call) -> bool:
    """Whether the caller is still stopped in this call (its pid not reused)."""
    try:
        fcntl.ioctl(listener, IOCTL_ID_VALID, struct.pack("=Q", call.id))
        return True
    except OSError:
        return False


def answer(listener: int, call: Call, result: int) -> None:
    """The call returns ``result`` (>= 0), or fails with errno -``result``."""
    value, error = (result, 0) if result >= 0 else (0, result)
    try:
        fcntl.ioctl(listener, IOCTL_SEND, bytearray(RESP.pack(call.id, value, error, 0)))
    except OSError as err:
        if err.errno != errno.ENOENT:  # the caller was killed meanwhile
            raise


def take_fd(pidfd: int, fd: int) -> int:
    """A duplicate of the process's fd (pidfd_getfd(2), close-on-exec)."""
    got = LIBC.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
    if got < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(got)


def read_memory(pid: int, address: int, size: int) -> bytes:
    """``size`` bytes of the process's memory at ``address`` (its /proc/PID/mem)."""
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, size, address)
    finally:
        os.close(fd)


def bind(fd: int, address: bytes) -> int:
    """bind(2) with the exact sockaddr the daemon gave: 0, or -errno."""
    return _result(LIBC.bind(fd, address, len(address)))


def listen(fd: int, backlog: int) -> int:
    return _result(LIBC.listen(fd, ctypes.c_int(backlog)))


def _result(code: int) -> int:
    return -ctypes.get_errno() if code < 0 else 0
