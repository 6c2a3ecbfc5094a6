"""What reached an inherited socket before its filter did: judged, and removed unless allowed.

systemd listens before the service starts, so the connection that triggered
the start, and any that arrived before the filter was attached, are already
queued, unfiltered.  Right after attaching, the wrapper judges every one of
them with the loaded program itself (BPF_PROG_TEST_RUN on the packet that
opened it: a SYN from the peer, or the datagram), so the verdict is the
kernel's, for every part.  What cannot be judged is treated as denied.

- TCP listener.  The accept queue holds established connections, connections
  the peer has closed (CLOSE_WAIT), and connections the peer has reset
  (CLOSE: gone from the tables sock_diag reads, but still queued with their
  data, and accept() still returns them).  sock_diag (pyroute2) lists the
  first two; the listener's queue length (TCP_INFO) counts all three.  Only
  this listener's are listed: its family (an IPv4 client of a dual-stack
  socket is an IPv6 socket with a mapped address, which a v6-only listener
  never has) and its address; where another listener of the family shares the
  port and address (SO_REUSEPORT), none can be told whose, and none is listed.
  The listing comes first and the queue length after it, so a connection that
  arrives in between can only make the count of unlisted ones too high, never
  too low.  If every queued connection is listed and allowed, the queue is
  left alone and the application serves them, the triggering client included.
  Otherwise the wrapper accepts connections in queue order (accept() is the
  only way to reach a reset one) until none that is denied or unjudgeable is
  left, and resets each one it took: denied ones, reset ones (their peer is
  gone), and allowed ones that were queued ahead of a denied one (an accepted
  connection cannot be put back).  A connection that carries the filter was
  made after it was attached (a connection inherits its listener's filter when
  it is made), so the kernel judged it, and the queue is in arrival order:
  nothing unjudged is behind it, and the wrapper stops there.  The rest stay
  queued for the application.
- Half-open handshakes (SYN_RECV) need nothing here: the packet that
  completes one reaches the listener, whose filter judges it like a SYN.
- UDP: peeks at the queued datagrams one by one (SO_PEEK_OFF) and judges
  each, payload included.  Datagrams up to the last denied one are read and
  discarded; allowed ones after it stay.
- Accept=yes (a connected socket): its peer is judged before the
  application starts; if it is denied, or already reset, it is reset and the
  application is not started.  Every packet such a socket will receive comes
  from that one peer, and only subnet rules may apply to it (the wrapper
  refuses the others), so it is judged by the rules in Python (rules_judge),
  with no program compiled or loaded: a denied peer costs a Python start.

Interface rules need the interface a packet came in on, which nothing
records for a queued connection; a developer's filter may read any header,
and a test run can give it only headers made up from the addresses and the
payload: with either, every queued connection or datagram is unjudgeable, so
it is removed (fail closed).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from alfwrapper.errors import EX_CONFIG, EX_OSERR, AlfError
from alfwrapper.host.attach import describe, has_filter
from alfwrapper.policy.rules import SubnetRules
from alfwrapper.record import Record

if TYPE_CHECKING:
    from alfwrapper.lifecycle.sockets import SocketRecord

SO_PEEK_OFF = 42
TCP_ESTABLISHED, TCP_CLOSE, TCP_CLOSE_WAIT, TCP_LISTEN = 1, 7, 8, 10
# Queued connections sock_diag can list: established, or half-closed by the peer.
LISTED_STATES = (1 << TCP_ESTABLISHED) | (1 << TCP_CLOSE_WAIT)
_TCPI_UNACKED = struct.Struct("=B7xIIIII")  # struct tcp_info up to tcpi_unacked


class Endpoint(Record):
    family: int  # 4 or 6, as the packet on the wire
    address: int
    port: int


# The kernel's verdict on the packet that opened a connection (payload None) or
# on a datagram: True passes, False drops, None cannot be judged.
Judge = Callable[[Endpoint, Endpoint, bytes | None], bool | None]


class Report(Record, frozen=False):
    """What was waiting on one socket, and what became of it."""

    what: str  # "connections" or "datagrams"
    waiting: int = 0
    denied: int = 0  # judged and denied
    unjudged: int = 0  # could not be judged (reset by the peer, interface unknown)
    collateral: int = 0  # allowed, but removed because queued ahead of a denied one
    kept: int = 0

    def count_removed(self, verdict: bool | None) -> None:
        """One item removed, by what its verdict was."""
        if verdict is True:
            self.collateral += 1
        elif verdict is False:
            self.denied += 1
        else:
            self.unjudged += 1

    @property
    def removed(self) -> int:
        return self.denied + self.unjudged + self.collateral

    def __str__(self) -> str:
        parts = []
        if self.denied:
            parts.append(f"{self.denied} from denied sources")
        if self.unjudged:
            parts.append(f"{self.unjudged} that could not be judged")
        if self.collateral:
            parts.append(f"{self.collateral} allowed ones queued ahead of those")
        return (
            f"{self.waiting} {self.what} arrived before the filter; removed "
            f"{', '.join(parts)}; kept {self.kept}"
        )


def endpoint(sockaddr: tuple[str, int] | tuple[str, int, int, int]) -> Endpoint:
    address = ipaddress.ip_address(sockaddr[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped  # an IPv4 client of a dual-stack socket
    return Endpoint(address.version, int(address), sockaddr[1])


def program_judge(prog_fd: int, unjudgeable: bool) -> Judge:
    """Judge with the loaded program; where a test run cannot give the socket's verdict
    (interface rules, a developer's filter), nothing can be judged."""
    # Imported here: an Accept=yes peer is judged by its rules (rules_judge), and a
    # denied one should cost no more than it must.
    from alfwrapper.host.bpf_calls import prog_test_run  # noqa: PLC0415
    from alfwrapper.host.frames import tcp_syn_frame, udp_frame  # noqa: PLC0415

    def judge(peer: Endpoint, local: Endpoint, payload: bytes | None) -> bool | None:
        if unjudgeable:
            return None
        # A dual-stack socket's own address is "::" for its IPv4 clients too.
        to = local.address if local.family == peer.family else 0
        if payload is None:
            frame = tcp_syn_frame(peer.family, peer.address, peer.port, to, local.port)
        else:
            frame = udp_frame(peer.family, peer.address, payload, peer.port, to, local.port)
        return prog_test_run(prog_fd, frame).retval != 0

    return judge


def rules_judge(subnets: SubnetRules) -> Judge:
    """Judge by the subnet rules alone (SubnetRules.passes), for a connected socket,
    whose packets all come from the peer judged."""

    def judge(peer: Endpoint, local: Endpoint, payload: bytes | None) -> bool:
        return subnets.passes(peer.family, peer.address)

    return judge


def accept_queue_length(sock: socket.socket) -> int:
    """Connections in a TCP listener's accept queue (TCP_INFO's tcpi_unacked; Linux 2.6.x)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCPI_UNACKED.size)
    return int(_TCPI_UNACKED.unpack(info)[5])


def tcp_state(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


def waiting_connections(sock: socket.socket) -> list[tuple[Endpoint, Endpoint]]:
    """(peer, local) of this listener's connections that sock_diag lists and nobody has
    accepted yet (no inode): those of its family (a v6-only listener has no IPv4
    clients) and address.  None at all where another listener of the family shares
    the port and address (SO_REUSEPORT): whose they are cannot be told."""
    from pyroute2 import DiagSocket  # noqa: PLC0415

    family = sock.family
    v6only = family == socket.AF_INET6 and bool(
        sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
    )
    bound_text, port = sock.getsockname()[:2]
    bound = ipaddress.ip_address(bound_text)

    def overlaps(text: str) -> bool:
        address = ipaddress.ip_address(text)
        return bound.is_unspecified or address.is_unspecified or address == bound

    found = []
    with DiagSocket() as diag:
        diag.bind()
        others = [
            msg
            for msg in diag.get_sock_stats(
                family=family, states=1 << TCP_LISTEN, protocol=socket.IPPROTO_TCP
            )
            if msg["idiag_sport"] == port and overlaps(msg["idiag_src"])
        ]
        if len(others) > 1:  # ours and another
            return []
        for msg in diag.get_sock_stats(
            family=family, states=LISTED_STATES, protocol=socket.IPPROTO_TCP
        ):
            if msg["idiag_sport"] != port or msg["idiag_inode"] != 0:
                continue
            local_address = ipaddress.ip_address(msg["idiag_src"])
            mapped = isinstance(local_address, ipaddress.IPv6Address) and local_address.ipv4_mapped
            if v6only and mapped:
                continue  # a dual-stack listener's IPv4 client
            if not bound.is_unspecified and local_address != bound:
                continue  # accepted by a listener on another address
            local = endpoint((msg["idiag_src"], msg["idiag_sport"]))
            found.append((endpoint((msg["idiag_dst"], msg["idiag_dport"])), local))
    return found


def reset(conn: socket.socket) -> None:
    # SO_LINGER with a zero timeout: close sends a RST and drops unread data.
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        conn.close()


def purge_listener(sock: socket.socket, judge: Judge) -> Report:
    """Judge the accept queue; remove in queue order until nothing denied is left."""
    report = Report("connections")
    listed = waiting_connections(sock)  # first: see waiting_connections and the module
    queued = accept_queue_length(sock)
    report.waiting = queued
    if queued == 0:
        return report
    verdicts = {(peer, local): judge(peer, local, None) for peer, local in listed}
    bad = {key for key, ok in verdicts.items() if ok is not True}
    if len(listed) == queued and not bad:
        report.kept = queued
        return report
    # Reset connections are queued but not listed.  More listed than queued
    # means some belong to another socket, and which cannot be told: take all.
    unlisted = queued - len(listed) if len(listed) <= queued else queued
    taken = 0
    sock.setblocking(False)
    try:
        while taken < queued and (bad or unlisted > 0):
            try:
                conn, address = sock.accept()
            except BlockingIOError:
                break
            taken += 1
            if has_filter(conn):
                # Made after the filter was attached: the kernel judged it, and
                # nothing unjudged is queued behind it.  It cannot be put back.
                report.collateral += 1
                reset(conn)
                break
            peer = endpoint(address)
            try:
                local = endpoint(conn.getsockname())
                state = tcp_state(conn)
            except OSError:
                local, state = Endpoint(peer.family, 0, 0), TCP_CLOSE
            key = (peer, local)
            if state == TCP_CLOSE:
                verdict = None  # reset by the peer: its data must not reach anyone
            elif key in verdicts:
                verdict = verdicts[key]
            else:
                verdict = judge(peer, local, None)
            if key in bad:
                bad.discard(key)
            elif key not in verdicts:
                unlisted -= 1
            report.count_removed(verdict)
            reset(conn)
    finally:
        sock.setblocking(True)
    report.kept = queued - taken
    return report


def _ipv6_packet(ancillary: list[tuple[int, int, bytes]]) -> bool:
    """Did a datagram on an IPv6 socket come as an IPv6 packet (not IPv4)?

    Its source cannot tell: an IPv4 packet's and an IPv6 packet's from an
    IPv4-mapped address read the same.  Its destination (IPV6_PKTINFO, taken
    from the packet's own header) can: an IPv4 packet's is IPv4-mapped.
    """
    for level, kind, data in ancillary:
        if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_PKTINFO and len(data) >= 16:
            return not data[:12] == bytes(10) + b"\xff\xff"
    return False


def purge_datagrams(sock: socket.socket, judge: Judge) -> Report:
    """Discard queued datagrams up to the last one that is not allowed."""
    report = Report("datagrams")
    local = endpoint(sock.getsockname())
    verdicts = []
    six = sock.family == socket.AF_INET6
    if six:
        pktinfo = sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_PEEK_OFF, 0)
    try:
        while True:
            try:
                data, ancillary, _, address = sock.recvmsg(
                    65536, 256, socket.MSG_PEEK | socket.MSG_DONTWAIT
                )
            except BlockingIOError:
                break
            peer = endpoint(address)
            if six and _ipv6_packet(ancillary):
                # An IPv6 packet, whatever its source looks like (an IPv4-mapped
                # one is judged as the IPv6 packet it is: dropped).
                peer = Endpoint(6, int(ipaddress.IPv6Address(address[0])), address[1])
            verdicts.append(judge(peer, local, data))
    finally:
        sock.setsockopt(socket.SOL_SOCKET, SO_PEEK_OFF, -1)
        if six:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, pktinfo)
    report.waiting = len(verdicts)
    bad = [i for i, ok in enumerate(verdicts) if ok is not True]
    if not bad:
        report.kept = len(verdicts)
        return report
    for ok in verdicts[: bad[-1] + 1]:
        sock.recv(65536, socket.MSG_DONTWAIT)
        report.count_removed(ok)
    report.kept = len(verdicts) - bad[-1] - 1
    return report


def connected_peer_allowed(sock: socket.socket, judge: Judge) -> bool:
    """Accept=yes: does the program pass the peer of this connected socket?

    A connection the peer has already reset cannot be judged: not allowed.
    """
    try:
        peer, local = endpoint(sock.getpeername()), endpoint(sock.getsockname())
    except OSError as err:
        if err.errno == errno.ENOTCONN:
            return False
        raise
    if tcp_state(sock) == TCP_CLOSE:
        return False
    return judge(peer, local, None) is True


def judge_connection(record: SocketRecord, command: str, service: str) -> bool:
    """Judge the peer of a connected Accept=yes socket by its rules, before COMMAND
    starts (rules_judge: no program, no BCC).  Returns False when it is
    denied, or gone: the connection has been reset (resets.note says so, counted under
    ``service``) and COMMAND must not start."""
    sock, rules = record.sock, record.rules
    named = rules.deny_sets or rules.allow_sets
    if rules.knock or rules.interfaces or rules.custom or named:
        # Their verdict needs packets this connection's were not: its handshake
        # (knocking), its interface, or any header a developer's filter reads; or
        # the named sets, which only a program reads.
        kind = (
            "knocking" if rules.knock else "--interface" if rules.interfaces
            else "--filter" if rules.custom else f"the named set {named[0]}"
        )  # fmt: skip
        raise AlfError(
            describe(sock),
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
    if peer.startswith("::ffff:") and "." in peer:
        peer = peer[len("::ffff:") :]  # IPv4 on a dual-stack socket: written as IPv4
    if connected_peer_allowed(sock, rules_judge(rules.subnets)):
        return True
    try:
        port = int(sock.getsockname()[1])
    except OSError:
        port = 0
    reset(sock)
    from alfwrapper.lifecycle import resets  # noqa: PLC0415  (a denied peer's alone)

    resets.note(service, peer, port, command)
    return False


def judge_backlog(record: SocketRecord) -> None:
    """Deal with what reached an inherited listening or datagram socket before its
    filter (the module's docstring says how)."""
    assert record.loaded is not None
    sock, rules = record.sock, record.rules
    judge = program_judge(record.loaded.fd, bool(rules.interfaces or rules.custom))
    try:
        if sock.type == socket.SOCK_STREAM:
            report = purge_listener(sock, judge)
        else:
            report = purge_datagrams(sock, judge)
    except OSError as err:
        raise AlfError(
            f"checking what reached {describe(sock)} before its filter",
            err.strerror or str(err),
            "run `alfwrapper doctor`",
            EX_OSERR,
        ) from None
    if report.removed:
        print(f"alfwrapper: note: {describe(sock)}: {report}", file=sys.stderr)
