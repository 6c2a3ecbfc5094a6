"""The pure parts of bans that cut live connections: a sock_diag dump read into
connections (host/sockdiag.py), and which of them a ban cuts (lifecycle/cut.py: the
port and address of the listener, the banned prefixes, an IPv4-mapped peer, a more
specific runtime allow).  tests/netns/test_cut.py holds them to real traffic."""

from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alfwrapper.bpf.parts import RUNTIME_ALLOW, RUNTIME_DENY
from alfwrapper.host import sockdiag
from alfwrapper.lifecycle import bouncer, cut
from alfwrapper.policy.prefixes import parse_prefix

pytestmark = pytest.mark.unit


def message(family: int, state: int, local: str, port: int, peer: str, peer_port: int) -> bytes:
    """One SOCK_DIAG_BY_FAMILY message, as the kernel writes it (inet_diag_msg + padding)."""
    src = socket.inet_pton(family, local).ljust(16, b"\0")
    dst = socket.inet_pton(family, peer).ljust(16, b"\0")
    body = struct.pack("=BBBB", family, state, 0, 0) + struct.pack(">HH", port, peer_port)
    body += src + dst + struct.pack("=IQ", 0, 12345) + bytes(20)  # if, cookie; the rest
    return struct.pack("=IHHII", 16 + len(body), 20, 2, 1, 0) + body


DONE = struct.pack("=IHHIIi", 20, 3, 2, 1, 0, 0)


def read(data: bytes) -> list[sockdiag.Connection]:
    return [
        sockdiag.parse_connection(data, at)
        for kind, at, _ in sockdiag.parse_messages(data)
        if kind == sockdiag.SOCK_DIAG_BY_FAMILY
    ]


def test_a_dump_reads_into_connections_with_their_ids() -> None:
    data = message(socket.AF_INET6, 1, "::ffff:192.0.2.1", 8080, "::ffff:198.51.100.2", 40000)
    data += message(socket.AF_INET, 8, "192.0.2.1", 22, "203.0.113.9", 50000) + DONE
    first, second = read(data)
    assert (first.local, first.port, first.peer, first.peer_port) == (
        "::ffff:192.0.2.1",
        8080,
        "::ffff:198.51.100.2",
        40000,
    )
    assert (second.family, second.state, str(second)) == (socket.AF_INET, 8, "203.0.113.9:50000")
    # The id, whole, as SOCK_DESTROY names the socket: ports, addresses, interface, cookie.
    assert first.sockid == data[20:68] and struct.unpack_from("=Q", first.sockid, 40) == (12345,)


def test_the_kernels_error_and_a_cut_message_are_oserrors() -> None:
    with pytest.raises(OSError, match="Operation not supported") as err:
        list(sockdiag.parse_messages(struct.pack("=IHHIIi", 20, 2, 0, 1, 0, -95)))
    assert err.value.errno == 95
    assert list(sockdiag.parse_messages(struct.pack("=IHHIIi", 20, 2, 0, 1, 0, 0))) == [
        (2, 16, 4)
    ]  # an ack
    with pytest.raises(OSError, match="runs past"):
        list(sockdiag.parse_messages(message(socket.AF_INET, 1, "1.2.3.4", 1, "5.6.7.8", 2)[:50]))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_read_parses_or_is_refused_with_an_oserror(data: bytes) -> None:
    try:
        read(data)
    except OSError:
        pass


def connection(local: str, port: int, peer: str) -> sockdiag.Connection:
    family = socket.AF_INET6 if ":" in local else socket.AF_INET
    return read(message(family, 1, local, port, peer, 40000) + DONE)[0]


WILD = cut.Target("web", 1, 1, "::", 8080)
CONNECTIONS = [
    connection("::ffff:192.0.2.1", 8080, "::ffff:198.51.100.2"),  # IPv4 on a dual-stack socket
    connection("::ffff:192.0.2.1", 8080, "::ffff:192.0.2.2"),
    connection("2001:db8:b::1", 8080, "2001:db8:b::2"),
    connection("2001:db8:b::1", 9090, "2001:db8:b::2"),  # another port: another socket's
]


def peers(chosen: list[sockdiag.Connection]) -> list[tuple[str, int]]:
    return [(c.peer, c.port) for c in chosen]


def test_a_ban_chooses_the_banned_peers_on_the_sockets_port() -> None:
    banned = cut.Banned([parse_prefix("198.51.100.0/24"), parse_prefix("2001:db8:b::/48")])
    assert peers(cut.choose(CONNECTIONS, WILD, banned)) == [
        ("::ffff:198.51.100.2", 8080),
        ("2001:db8:b::2", 8080),
    ]
    assert cut.choose(CONNECTIONS, WILD, cut.Banned([parse_prefix("203.0.113.0/24")])) == []


def test_a_socket_bound_to_one_address_takes_its_own_connections_alone() -> None:
    bound = cut.Target("web", 1, 1, "2001:db8:a::1", 8080)
    banned = cut.Banned([parse_prefix("2001:db8:b::2")])
    assert cut.choose(CONNECTIONS, bound, banned) == []
    bound = cut.Target("web", 1, 1, "2001:db8:b::1", 8080)
    assert peers(cut.choose(CONNECTIONS, bound, banned)) == [("2001:db8:b::2", 8080)]


def test_a_more_specific_runtime_allow_keeps_its_peer() -> None:
    """The most specific runtime rule decides (runtime.c): a deny of a network leaves the
    host allowed inside it; an allow of a wider network does not save the host."""
    deny = parse_prefix("198.51.100.0/24")
    host = parse_prefix("198.51.100.2")
    wide = parse_prefix("198.0.0.0/8")
    rules = ((4, deny.value, 24, RUNTIME_DENY), (4, host.value, 32, RUNTIME_ALLOW))
    target = cut.Target("web", 1, 1, "::", 8080, rules)
    assert cut.choose(CONNECTIONS, target, cut.Banned([deny])) == []
    rules = ((4, deny.value, 24, RUNTIME_DENY), (4, wide.value, 8, RUNTIME_ALLOW))
    target = cut.Target("web", 1, 1, "::", 8080, rules)
    assert peers(cut.choose(CONNECTIONS, target, cut.Banned([deny]))) == [
        ("::ffff:198.51.100.2", 8080)
    ]


def test_the_banned_index_agrees_with_covers() -> None:
    prefixes = [parse_prefix(p) for p in ("10.0.0.0/8", "10.1.2.3", "2001:db8::/32", "0.0.0.0/0")]
    for address in ("10.9.9.9", "11.0.0.1", "2001:db8:1::1", "2001:db9::1", "10.1.2.3"):
        peer = parse_prefix(address)
        for chosen in (prefixes[:1], prefixes[1:2], prefixes[2:3], prefixes):
            assert cut.Banned(chosen).holds(peer) == any(cut.covers(p, peer) for p in chosen)


def test_the_bouncer_says_what_it_could_not_cut_once_a_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each poll with new bans cuts again, and says what it reset; a reason it could not
    is said the first time only (every poll would flood the journal)."""
    report = cut.Cut(["web main (tcp [::]:8080): reset 1 connection(s)"], ["cannot: EPERM"])
    monkeypatch.setattr(bouncer, "_SAID", set())
    monkeypatch.setattr(cut, "cut_for_set", lambda name, banned: report)
    bouncer.cut_bans("crowdsec", [parse_prefix("198.51.100.7")])
    bouncer.cut_bans("crowdsec", [parse_prefix("198.51.100.8")])
    said = capsys.readouterr()
    assert said.out.count("reset 1 connection(s)") == 2, said.out
    assert said.err == "alfwrapper crowdsec: note: cannot: EPERM\n", said.err
