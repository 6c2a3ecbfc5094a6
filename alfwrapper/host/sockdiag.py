"""sock_diag(7) of this network namespace: every TCP and UDP socket's cookie; the TCP
connections on a local port, by their exact id; and the one way to reset one of them
(SOCK_DESTROY).

Hand-written, although pyroute2 (which the package depends on) has DiagSocket:
importing pyroute2 costs a start 0.1 to 0.2 s (its package imports most of
itself), and every start asks this when some socket's process is gone (the gc
after a start, state.Store.gc) -- for a service on sockets it creates, that is
every start after the first.  One dump request per family and protocol,
inet_diag_req_v2 as linux/inet_diag.h lays it out; the cookie is the one
SO_COOKIE gives (sock_diag_save_cookie: two native 32-bit halves, low first).
tests/host/test_sockdiag.py holds it to pyroute2's answer.

SOCK_DESTROY (Linux 4.5, CONFIG_INET_DIAG_DESTROY: set in Debian 12's and 13's kernels)
has no pyroute2 call at all (its DiagSocket only dumps): the request is the dump's
inet_diag_req_v2 with the socket's id exactly as the dump gave it (ports, addresses,
interface, cookie), sent as message type 21.  The kernel aborts the socket (tcp_abort):
the peer gets a RST, the application ECONNABORTED.  It needs CAP_NET_ADMIN in the
socket's network namespace (EPERM), and a kernel built with it (EOPNOTSUPP).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

from alfwrapper.record import Record

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
SOCK_DESTROY = 21
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
# inet_diag_req_v2: family, protocol, ext, pad, states; then inet_diag_sockid (48 bytes).
_REQUEST_HEAD = struct.Struct("=BBBxI")
_REQUEST = struct.Struct("=BBBxI48x")
# inet_diag_msg: family, state, timer, retrans; sockid: sport, dport, src, dst, if,
# cookie (two native u32, low half first).
_MESSAGE = struct.Struct("=BBBB4x16s16sIII")
_SOCKID = struct.Struct("=4x48s")  # inet_diag_msg's sockid, whole, as a request names it
_PORTS = struct.Struct(">HH")  # its sport and dport, in network order
ALL_STATES = 0xFFFFFFFF
_RECEIVE = 1 << 16

# TCP states (include/net/tcp_states.h) a connection has after its handshake began and
# before it closed: TIME_WAIT and CLOSE hold no peer worth a reset, LISTEN no peer.
TCP_ESTABLISHED, TCP_SYN_RECV, TCP_LISTEN, TCP_NEW_SYN_RECV = 1, 3, 10, 12
CONNECTED = (1, 2, 3, 4, 5, 8, 9, 11, 12)  # ESTABLISHED .. CLOSING, NEW_SYN_RECV
CONNECTED_STATES = sum(1 << s for s in CONNECTED)


class Connection(Record):
    """One TCP socket as sock_diag lists it: enough to choose it, and its exact id to
    destroy it by."""

    family: int  # socket.AF_INET or AF_INET6
    state: int
    local: str  # address, as ipaddress reads it (IPv6 may be an IPv4-mapped one)
    port: int
    peer: str
    peer_port: int
    sockid: bytes  # inet_diag_sockid, 48 bytes

    def __str__(self) -> str:
        host = f"[{self.peer}]" if ":" in self.peer else self.peer
        return f"{host}:{self.peer_port}"


def _address(family: int, raw: bytes) -> str:
    width = 4 if family == socket.AF_INET else 16
    return socket.inet_ntop(family, raw[:width])


def parse_messages(data: bytes) -> Iterator[tuple[int, int, int]]:
    """The messages of one read of a dump: (type, offset of the body, body length).
    Raises OSError for a message that runs past what was read, or for the kernel's
    error; stops at NLMSG_DONE (yielded, for the caller to end on)."""
    at = 0
    while at + _HEADER.size <= len(data):
        length, kind, _, _, _ = _HEADER.unpack_from(data, at)
        if length < _HEADER.size or at + length > len(data):
            raise OSError("sock_diag: a message runs past what was read")
        if kind == NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, at + _HEADER.size)[0]
            if code:
                raise OSError(code, f"sock_diag: {os.strerror(code)}")
        yield kind, at + _HEADER.size, length - _HEADER.size
        if kind == NLMSG_DONE:
            return
        at += (length + 3) & ~3  # NLMSG_ALIGN


def parse_connection(data: bytes, at: int) -> Connection:
    """An inet_diag_msg at ``at`` of a dump's read, as a Connection."""
    family, tcp_state, _, _, src, dst, _, _, _ = _MESSAGE.unpack_from(data, at)
    (sockid,) = _SOCKID.unpack_from(data, at)
    port, peer_port = _PORTS.unpack_from(sockid)
    return Connection(
        family, tcp_state, _address(family, src), port, _address(family, dst), peer_port, sockid
    )


def _netlink() -> socket.socket:
    return socket.socket(
        socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG
    )


def _messages(family: int, protocol: int, states: int, seq: int) -> Iterator[tuple[bytes, int]]:
    """Each inet_diag_msg of one dump request: (the read holding it, its offset)."""
    body = _REQUEST.pack(family, protocol, 0, states)
    header = _HEADER.pack(
        _HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0
    )
    with _netlink() as sock:
        sock.sendto(header + body, (0, 0))
        while True:
            data = sock.recv(_RECEIVE)
            if not data:
                raise OSError("sock_diag: the kernel closed the dump")
            for kind, at, length in parse_messages(data):
                if kind == NLMSG_DONE:
                    return
                if kind == SOCK_DIAG_BY_FAMILY and length >= _MESSAGE.size:
                    yield data, at


def _dump(family: int, protocol: int, seq: int) -> set[int]:
    cookies: set[int] = set()
    for data, at in _messages(family, protocol, ALL_STATES, seq):
        *_, low, high = _MESSAGE.unpack_from(data, at)
        cookies.add(low | high << 32)
    return cookies


def tcp_connections(family: int, port: int, most: int) -> list[Connection]:
    """This namespace's TCP sockets of ``family`` on local ``port`` that are connected
    (CONNECTED: handshakes under way and closing ones included, listeners not).  At most
    ``most`` sockets are read (of every port: the port is chosen here); OSError when
    more would be."""
    found = []
    for read, (data, at) in enumerate(
        _messages(family, socket.IPPROTO_TCP, CONNECTED_STATES, 1), 1
    ):
        if read > most:
            raise OSError(f"sock_diag: more than {most} TCP connections")
        connection = parse_connection(data, at)
        if connection.port == port:
            found.append(connection)
    return found


def destroy(connection: Connection) -> None:
    """Reset one TCP connection by its id (SOCK_DESTROY).  OSError: ENOENT if it is gone
    already, EPERM without CAP_NET_ADMIN here, EOPNOTSUPP on a kernel without it."""
    states = 1 << connection.state
    body = _REQUEST_HEAD.pack(connection.family, socket.IPPROTO_TCP, 0, states) + connection.sockid
    header = _HEADER.pack(_HEADER.size + len(body), SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, 1, 0)
    with _netlink() as sock:
        sock.sendto(header + body, (0, 0))
        data = sock.recv(_RECEIVE)
        for kind, _, _ in parse_messages(data):  # the ack: NLMSG_ERROR 0, or OSError
            if kind == NLMSG_ERROR:
                return
        raise OSError("sock_diag: no answer to SOCK_DESTROY")


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


class Bound(Record):
    """A socket that takes new traffic: a listening TCP socket, or any UDP socket."""

    family: int  # socket.AF_INET or AF_INET6
    protocol: int  # socket.IPPROTO_TCP or IPPROTO_UDP
    local: str  # the address it is bound to ("0.0.0.0", "::": any)
    port: int
    cookie: int
    interface: int = 0  # the index of the interface it is bound to (SO_BINDTODEVICE), or 0


def bound_sockets(most: int) -> list[Bound]:
    """This namespace's listening TCP sockets and its UDP sockets, of both families.  At
    most ``most`` are read in each family and protocol; OSError when more would be."""
    found = []
    seq = 1
    for family in (socket.AF_INET, socket.AF_INET6):
        for protocol, states in (
            (socket.IPPROTO_TCP, 1 << TCP_LISTEN),
            (socket.IPPROTO_UDP, ALL_STATES),
        ):
            for read, (data, at) in enumerate(_messages(family, protocol, states, seq), 1):
                if read > most:
                    raise OSError(f"sock_diag: more than {most} sockets")
                one = parse_connection(data, at)
                *_, interface, low, high = _MESSAGE.unpack_from(data, at)
                found.append(
                    Bound(family, protocol, one.local, one.port, low | high << 32, interface)
                )
            seq += 1
    return found
