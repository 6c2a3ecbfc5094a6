"""Is a socket or a process alive: sock_diag's cookies, /proc, network namespaces."""

from __future__ import annotations

import socket

from alfwrapper.host import attach, netns, sockdiag

SO_NETNS_COOKIE = 71  # Linux 5.14


socket_cookie = attach.socket_cookie


def socket_netns_cookie(sock: socket.socket) -> int:
    """The network namespace a socket lives in (SO_NETNS_COOKIE, Linux 5.14), or 0."""
    try:
        return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")
    except OSError:
        return 0


def netns_cookie() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return socket_netns_cookie(s)


def live_cookies() -> set[int]:
    """The cookies of every TCP and UDP socket in this network namespace (sock_diag)."""
    return sockdiag.live_cookies()


def alive(pid: object) -> bool:
    """Does this process run (neither gone nor a zombie that nobody has reaped)?"""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(1024)
    except OSError:
        return False
    end = stat.rfind(b")")  # the command name in brackets may hold anything
    return stat[end + 2 : end + 3] not in (b"Z", b"X")


def live_everywhere(strict: bool = True) -> tuple[set[int], set[int]]:
    """The cookies of every socket in every network namespace we can enter (as root),
    and those namespaces' cookies; unless ``strict``, in this one alone where we may
    not enter them (an OSError otherwise)."""
    live: set[int] = set()
    seen: set[int] = set()
    try:
        for _ in netns.each_netns():
            live |= live_cookies()
            seen.add(netns_cookie())
    except OSError:
        if strict:
            raise
        return live_cookies(), {netns_cookie()}
    return live, seen
