"""Attach and lock socket filters: the socket options, named once.

SO_ATTACH_BPF: Linux 4.0.  SO_LOCK_FILTER: Linux 3.9.  Attaching an already
loaded program needs no capability; after SO_LOCK_FILTER neither the wrapper
nor the application can replace or remove the filter (EPERM).
"""

from __future__ import annotations

import errno
import socket

from alfwrapper.errors import EX_NOPERM, EX_OSERR, AlfError

SO_LOCK_FILTER = 44
SO_ATTACH_BPF = 50
SO_COOKIE = 57  # Linux 4.12


SO_GET_FILTER = 26


def has_filter(sock: socket.socket) -> bool:
    """Does the socket carry a filter?  SO_GET_FILTER gives 0 for none, the length of a
    classic one, and EACCES for an eBPF program (which it cannot dump)."""
    try:
        return sock.getsockopt(socket.SOL_SOCKET, SO_GET_FILTER) != 0
    except OSError as err:
        if err.errno == errno.EACCES:
            return True
        raise


def is_locked(sock: socket.socket) -> bool:
    """Is the socket's filter locked (SO_LOCK_FILTER reads back as a flag)?"""
    return bool(sock.getsockopt(socket.SOL_SOCKET, SO_LOCK_FILTER))


def socket_cookie(sock: socket.socket) -> int:
    """The socket's cookie: what bpf_get_socket_cookie() returns for its packets."""
    return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8), "little")


def describe(sock: socket.socket) -> str:
    """A socket as a user knows it: fd, protocol and local address."""
    proto = "tcp" if sock.type == socket.SOCK_STREAM else "udp"
    try:
        local = sock.getsockname()
        where = (
            f"[{local[0]}]:{local[1]}"
            if sock.family == socket.AF_INET6
            else f"{local[0]}:{local[1]}"
        )
    except OSError:
        where = "?"
    if where in ("0.0.0.0:0", "[::]:0"):
        where = "unbound"
    return f"fd {sock.fileno()} ({proto} {where})"


def attach_filter(sock: socket.socket, prog_fd: int, lock: bool = True) -> None:
    """Attach the program to the socket and, by default, lock it there (prog_fd -1:
    only lock the filter it carries)."""
    try:
        if prog_fd >= 0:
            sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_BPF, prog_fd)
        if lock:
            sock.setsockopt(socket.SOL_SOCKET, SO_LOCK_FILTER, 1)
    except OSError as err:
        if err.errno == errno.EPERM:
            raise AlfError(
                f"attaching the filter to {describe(sock)}",
                "the socket's filter is locked",
                "a filter was attached and locked before; restart the socket's owner",
                EX_NOPERM,
            ) from None
        raise AlfError(
            f"attaching the filter to {describe(sock)}",
            err.strerror or str(err),
            "run `alfwrapper doctor`",
            EX_OSERR,
        ) from None
