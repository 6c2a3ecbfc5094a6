"""What reached an inherited socket before its filter did: checked, and removed if denied.

systemd listens before the service starts, so with on-demand activation the
connection that triggered the start, and any that arrived before the filter
was attached, are already queued, unfiltered.  After attaching, the wrapper:

- TCP listener: lists the connections waiting in the accept queue with
  sock_diag (no privilege needed; a waiting child has no inode yet) and asks
  the loaded program about each peer (BPF_PROG_TEST_RUN on a SYN from it).
  If all are allowed, the queue is left alone and the application serves
  them, the triggering client included.  If any is denied, the wrapper
  accepts everything waiting: denied connections are reset, and allowed ones
  are closed too (the client retries and is filtered as usual).  Closing is
  the only choice: a socket destroyed with SOCK_DESTROY still hands its
  queued data to the next accept(), and an accepted connection cannot be put
  back into the queue.
- UDP socket: peeks at the queued datagrams one by one (SO_PEEK_OFF) and runs
  the program on each, payload included.  If one is denied, the datagrams up
  to the last denied one are read and discarded; allowed ones after it stay.
- Accept=yes (a connected socket): the peer is checked before the
  application starts; a denied peer's connection is reset.

Handshakes still in progress are safe: their final ACK meets the filter.
"""

from __future__ import annotations

import errno
import socket
import struct
from dataclasses import dataclass

from alfwrapper.syscalls import prog_test_run, tcp_syn_frame, udp_frame

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_ESTABLISHED, TCP_CLOSE_WAIT = 1, 8
# Waiting connections are established, or half-closed if the client gave up and sent
# FIN: its data is still queued for accept().
WAITING_STATES = (1 << TCP_ESTABLISHED) | (1 << TCP_CLOSE_WAIT)
SO_PEEK_OFF = 42

_NLMSG = struct.Struct("=IHHII")
_REQ = struct.Struct("=BBBxI")  # inet_diag_req_v2 up to the socket id
_SOCKID = struct.Struct(">HH16s16s")  # sport, dport, src, dst (then if, cookie)
_MSG_HEAD = struct.Struct("=BBBB")  # inet_diag_msg: family, state, timer, retrans
_MSG_TAIL = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode
_SOCKID_SIZE = 48


@dataclass(frozen=True)
class Endpoint:
    family: int  # 4 or 6, as the packet on the wire
    address: int
    port: int


def endpoint(sockaddr: tuple[str, int] | tuple[str, int, int, int]) -> Endpoint:
    host, port = sockaddr[0], sockaddr[1]
    if host.startswith("::ffff:") and "." in host:
        host = host[7:]
    if ":" in host:
        return Endpoint(6, int.from_bytes(socket.inet_pton(socket.AF_INET6, host), "big"), port)
    return Endpoint(4, int.from_bytes(socket.inet_pton(socket.AF_INET, host), "big"), port)


def _wire(family: int, raw: bytes) -> Endpoint:
    if family == socket.AF_INET:
        return Endpoint(4, int.from_bytes(raw[:4], "big"), 0)
    value = int.from_bytes(raw, "big")
    if value >> 32 == 0xFFFF:  # IPv4 client of a dual-stack socket
        return Endpoint(4, value & 0xFFFFFFFF, 0)
    return Endpoint(6, value, 0)


def waiting_connections(sock: socket.socket) -> list[tuple[Endpoint, Endpoint]]:
    """(peer, local) of connections on this listener not yet accepted."""
    port = sock.getsockname()[1]
    found = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        for family in (socket.AF_INET, socket.AF_INET6):
            request = (
                _REQ.pack(family, socket.IPPROTO_TCP, 0, WAITING_STATES)
                + _SOCKID.pack(port, 0, bytes(16), bytes(16))
                + bytes(12)
            )
            nl.send(
                _NLMSG.pack(
                    _NLMSG.size + len(request),
                    SOCK_DIAG_BY_FAMILY,
                    NLM_F_REQUEST | NLM_F_DUMP,
                    1,
                    0,
                )
                + request
            )
            done = False
            while not done:
                data = nl.recv(65536)
                offset = 0
                while offset < len(data):
                    length, kind, _, _, _ = _NLMSG.unpack_from(data, offset)
                    body = offset + _NLMSG.size
                    if kind == NLMSG_DONE:
                        done = True
                    elif kind == NLMSG_ERROR:
                        code = -struct.unpack_from("=i", data, body)[0]
                        raise OSError(code, f"sock_diag: {errno.errorcode.get(code, code)}")
                    else:
                        fam = data[body]
                        sport, dport, src, dst = _SOCKID.unpack_from(data, body + _MSG_HEAD.size)
                        inode = _MSG_TAIL.unpack_from(data, body + _MSG_HEAD.size + _SOCKID_SIZE)[4]
                        if sport == port and inode == 0:
                            peer, local = _wire(fam, dst), _wire(fam, src)
                            found.append(
                                (
                                    Endpoint(peer.family, peer.address, dport),
                                    Endpoint(local.family, local.address, sport),
                                )
                            )
                    offset += (length + 3) & ~3
    return found


def tcp_allowed(prog_fd: int, peer: Endpoint, local: Endpoint) -> bool:
    """Would the program pass a SYN from peer to local?"""
    frame = tcp_syn_frame(peer.family, peer.address, peer.port, local.address, local.port)
    return prog_test_run(prog_fd, frame).retval != 0


def udp_allowed(prog_fd: int, peer: Endpoint, local: Endpoint, payload: bytes) -> bool:
    frame = udp_frame(peer.family, peer.address, payload, peer.port, local.address, local.port)
    return prog_test_run(prog_fd, frame).retval != 0


def reset(conn: socket.socket) -> None:
    # SO_LINGER with a zero timeout: close sends a RST and drops unread data.
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def purge_listener(sock: socket.socket, prog_fd: int) -> int:
    """Remove waiting connections the program denies; returns how many were denied."""
    waiting = waiting_connections(sock)
    denied = sum(not tcp_allowed(prog_fd, peer, local) for peer, local in waiting)
    if not denied:
        return 0
    sock.setblocking(False)
    try:
        while True:
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                break
            reset(conn)
    finally:
        sock.setblocking(True)
    return denied


def purge_datagrams(sock: socket.socket, prog_fd: int) -> int:
    """Discard queued datagrams up to the last one the program denies; returns the denied."""
    local = endpoint(sock.getsockname())
    verdicts = []
    sock.setsockopt(socket.SOL_SOCKET, SO_PEEK_OFF, 0)
    try:
        while True:
            try:
                data, address = sock.recvfrom(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            peer = endpoint(address)
            verdicts.append(udp_allowed(prog_fd, peer, local, data))
    finally:
        sock.setsockopt(socket.SOL_SOCKET, SO_PEEK_OFF, -1)
    if all(verdicts):
        return 0
    last_denied = max(i for i, ok in enumerate(verdicts) if not ok)
    for _ in range(last_denied + 1):
        sock.recv(65536, socket.MSG_DONTWAIT)
    return verdicts.count(False)


def connected_peer_allowed(sock: socket.socket, prog_fd: int) -> bool:
    """Accept=yes: does the program pass the peer of this connected socket?"""
    return tcp_allowed(prog_fd, endpoint(sock.getpeername()), endpoint(sock.getsockname()))
