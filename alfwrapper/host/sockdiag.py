"""The cookies of every TCP and UDP socket of this network namespace, from sock_diag(7).

Hand-written, although pyroute2 (which the package depends on) has DiagSocket:
importing pyroute2 costs a start 0.1 to 0.2 s (its package imports most of
itself), and every start asks this when some socket's process is gone (the gc
after a start, state.Store.gc) -- for a service on sockets it creates, that is
every start after the first.  One dump request per family and protocol,
inet_diag_req_v2 as linux/inet_diag.h lays it out; the cookie is the one
SO_COOKIE gives (sock_diag_save_cookie: two native 32-bit halves, low first).
tests/host/test_sockdiag.py holds it to pyroute2's answer.
"""

from __future__ import annotations

import os
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
# inet_diag_req_v2: family, protocol, ext, pad, states; then inet_diag_sockid (48 bytes).
_REQUEST = struct.Struct("=BBBxI48x")
# inet_diag_msg: family, state, timer, retrans; sockid: sport, dport, src, dst, if,
# cookie (two native u32, low half first).
_MESSAGE = struct.Struct("=BBBB4x16s16sIII")
ALL_STATES = 0xFFFFFFFF
_RECEIVE = 1 << 16


def _dump(family: int, protocol: int, seq: int) -> set[int]:
    cookies: set[int] = set()
    body = _REQUEST.pack(family, protocol, 0, ALL_STATES)
    header = _HEADER.pack(
        _HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0
    )
    with socket.socket(
        socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG
    ) as sock:
        sock.sendto(header + body, (0, 0))
        while True:
            data = sock.recv(_RECEIVE)
            if not data:
                raise OSError("sock_diag: the kernel closed the dump")
            at = 0
            while at + _HEADER.size <= len(data):
                length, kind, _, _, _ = _HEADER.unpack_from(data, at)
                if length < _HEADER.size or at + length > len(data):
                    raise OSError("sock_diag: a message runs past what was read")
                if kind == NLMSG_DONE:
                    return cookies
                if kind == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", data, at + _HEADER.size)[0]
                    raise OSError(code, f"sock_diag: {os.strerror(code)}")
                if kind == SOCK_DIAG_BY_FAMILY and length >= _HEADER.size + _MESSAGE.size:
                    *_, low, high = _MESSAGE.unpack_from(data, at + _HEADER.size)
                    cookies.add(low | high << 32)
                at += (length + 3) & ~3  # NLMSG_ALIGN


def live_cookies() -> set[int]:
    """Every TCP and UDP socket's cookie in this network namespace; OSError if the
    kernel refuses the dump."""
    found: set[int] = set()
    seq = 1
    for family in (socket.AF_INET, socket.AF_INET6):
        for protocol in (socket.IPPROTO_TCP, socket.IPPROTO_UDP):
            found |= _dump(family, protocol, seq)
            seq += 1
    return found
