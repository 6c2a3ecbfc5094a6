"""Early drop (filters/early.c, alfwrapper/sets/early.py) agrees with the sockets' own
programs: random sets, random sockets denying random sets, and frames from inside and
outside the sets, each judged by the kernel twice (BPF_PROG_TEST_RUN): once by the XDP
program, with its ports map as sets/early.py computes it from the sockets this
namespace holds, and once by the program of the socket the frame is addressed to.
The XDP program never drops what that socket's program passes, and drops every SYN
and datagram that the socket's deny sets drop."""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import subprocess
import time
from collections.abc import Iterator

import pytest
from helpers.support import WRAPPER

from alfwrapper import sets, state
from alfwrapper.bpf import compiler, program
from alfwrapper.bpf.parts import FillEnv
from alfwrapper.errors import AlfError
from alfwrapper.host import sockdiag
from alfwrapper.host.bpf_calls import (
    link_info,
    map_update,
    prog_info,
    prog_test_run,
    xdp_link,
    xdp_test_run,
)
from alfwrapper.host.frames import ip_frame, tcp_syn_frame, udp_frame
from alfwrapper.host.netns import netns as enter_netns
from alfwrapper.policy.prefixes import Prefix
from alfwrapper.policy.rules import SocketRules
from alfwrapper.sets import creation, early

pytestmark = pytest.mark.host

XDP_DROP, XDP_PASS = 1, 2
ENV = FillEnv(open_set=creation.read_only)


@pytest.fixture
def own_netns(bpf_root: None) -> Iterator[str]:
    """The test runs in a network namespace of its own (this thread's, and what it
    starts): early drop it attaches there is never in force where the tests beside it
    start services."""
    name = f"alfe{os.getpid()}x{time.monotonic_ns() % 10**6}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        with enter_netns(f"/run/netns/{name}"):
            yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture
def names(bpf_root: None) -> Iterator[tuple[str, ...]]:
    stem = f"e{os.getpid()}-{time.monotonic_ns() % 10**8}"
    made = tuple(f"{stem}-{i}" for i in range(3))
    yield made
    for name in made:
        sets.destroy(name)


def source(rng: random.Random, family: int) -> int:
    if family == 4:
        return 0xC6336400 | rng.getrandbits(8)  # 198.51.100.0/24
    return (0x20010DB8 << 96) | rng.getrandbits(16)  # 2001:db8::/112


def fill_sets(rng: random.Random, names: tuple[str, ...]) -> None:
    for name in names:
        entries = []
        for _ in range(rng.randrange(5, 40)):
            family = rng.choice((4, 6))
            length = rng.choice((32, 30, 28) if family == 4 else (128, 124, 120))
            width = 32 if family == 4 else 128
            value = source(rng, family) >> (width - length) << (width - length)
            entries.append(Prefix(family, value, length))
        sets.create(name, entries)


class Sock:
    def __init__(
        self,
        rng: random.Random,
        names: tuple[str, ...],
        family: int,
        kind: int,
        denies: tuple[str, ...] | None = None,
    ) -> None:
        self.family, self.kind = family, kind
        self.sock = socket.socket(family, kind)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self.any = rng.random() < 0.4
        loopback = "127.0.0.1" if family == socket.AF_INET else "::1"
        wildcard = "0.0.0.0" if family == socket.AF_INET else "::"
        if family == socket.AF_INET6:
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        self.sock.bind((wildcard if self.any else loopback, 0))
        if kind == socket.SOCK_STREAM:
            self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.denies = (
            denies if denies is not None else tuple(n for n in names if rng.random() < 0.5)
        )
        self.loaded = compiler.load_program(
            program.plan_program(SocketRules(deny_sets=self.denies)), ENV
        )
        self.cookie = state.socket_cookie(self.sock)

    def frame(self, src: int, destination: int) -> bytes:
        family = 4 if self.family == socket.AF_INET else 6
        if self.kind == socket.SOCK_STREAM:
            return tcp_syn_frame(family, src, 40001, destination, self.port)
        return udp_frame(family, src, b"x", 40001, destination, self.port)


def loopback(family: int) -> int:
    return 0x7F000001 if family == socket.AF_INET else 1


def test_early_drop_agrees_with_the_sockets_programs(names: tuple[str, ...]) -> None:
    seed = int(os.environ.get("ALF_SEED", "0")) or random.randrange(1 << 30)
    rng = random.Random(seed)
    fill_sets(rng, names)
    socks = [
        Sock(rng, names, rng.choice((socket.AF_INET, socket.AF_INET6)), kind)
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM)
        for _ in range(4)
    ]
    # A socket that is no service's, sharing an address and port with one of ours that
    # denies every set (SO_REUSEPORT): the kernel may hand it the frame, so early drop
    # leaves that port.
    shared = Sock(
        rng,
        names,
        rng.choice((socket.AF_INET, socket.AF_INET6)),
        rng.choice((socket.SOCK_STREAM, socket.SOCK_DGRAM)),
        denies=names,
    )
    socks.append(shared)
    stranger = socket.socket(shared.family, shared.kind)
    stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if shared.family == socket.AF_INET6:
        stranger.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    stranger.bind(shared.sock.getsockname()[:2])
    if shared.kind == socket.SOCK_STREAM:
        stranger.listen(8)
    xdp = compiler.compile_and_load(program.plan_early(names, "early"), ENV)
    denied = {s.cookie: sum(1 << i for i, n in enumerate(names) if n in s.denies) for s in socks}
    ports = early.wanted_ports(names, denied, sockdiag.bound_sockets(early.MOST_SOCKETS))
    early.write(xdp.tables["alf_early_ports"].map_fd, ports)
    for key in early.wanted_local():
        map_update(xdp.tables["alf_early_local"].map_fd, key, struct.pack("=Q", 1))

    judged = dropped_early = 0
    for sock in socks:
        family = 4 if sock.family == socket.AF_INET else 6
        for _ in range(60):
            src = source(rng, family)
            frame = sock.frame(src, loopback(sock.family))
            at_xdp = xdp_test_run(xdp.fd, frame).retval
            by_socket = prog_test_run(sock.loaded.fd, frame).retval
            where = f"seed {seed}: {sock.denies} port {sock.port} from {src:#x}"
            assert at_xdp in (XDP_DROP, XDP_PASS), where
            if at_xdp == XDP_DROP:
                assert by_socket == 0, f"dropped early, passed by its socket: {where}"
            expected = by_socket == 0 and sock is not shared
            assert (at_xdp == XDP_DROP) == expected, where
            judged += 1
            dropped_early += at_xdp == XDP_DROP
            if sock.any:  # to an address that is not this host's: forwarded, never dropped
                away = 0xCB007109 if family == 4 else (0x20010DB8 << 96) | 0xFEED
                assert xdp_test_run(xdp.fd, sock.frame(src, away)).retval == XDP_PASS
    assert dropped_early, f"seed {seed}: no frame was dropped early in {judged}"
    stranger.close()


def test_only_new_connections_and_datagrams_are_dropped_early(names: tuple[str, ...]) -> None:
    """A denied source's TCP packet that is not a SYN, an IPv4 fragment and another
    protocol pass: the stack and the socket's program judge them."""
    sets.create(names[0], [Prefix(4, 0xC6336400, 24)])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    xdp = compiler.compile_and_load(program.plan_early(names[:1], "early"), ENV)
    bound = sockdiag.bound_sockets(early.MOST_SOCKETS)
    ports = early.wanted_ports(names[:1], {state.socket_cookie(listener): 1}, bound)
    early.write(xdp.tables["alf_early_ports"].map_fd, ports)
    for key in early.wanted_local():
        map_update(xdp.tables["alf_early_local"].map_fd, key, struct.pack("=Q", 1))
    src = 0xC6336407
    syn = tcp_syn_frame(4, src, 40001, 0x7F000001, port)
    assert xdp_test_run(xdp.fd, syn).retval == XDP_DROP
    for flags in (0x10, 0x12, 0x04):  # ACK, SYN and ACK, RST: a connection's
        other = bytearray(syn)
        other[14 + 20 + 13] = flags
        assert xdp_test_run(xdp.fd, bytes(other)).retval == XDP_PASS, flags
    fragment = bytearray(syn)
    fragment[14 + 6] = 0x20  # more fragments
    assert xdp_test_run(xdp.fd, bytes(fragment)).retval == XDP_PASS
    icmp = ip_frame(4, src, 0x7F000001, 1, b"\x08\0\0\0\0\0\0\0")
    assert xdp_test_run(xdp.fd, icmp).retval == XDP_PASS
    tagged = syn[:12] + b"\x81\x00\x00\x07" + syn[12:]  # 802.1Q, VLAN 7
    assert xdp_test_run(xdp.fd, tagged).retval == XDP_PASS
    listener.close()  # no socket there now: the kernel finds none, and nothing is dropped
    assert xdp_test_run(xdp.fd, syn).retval == XDP_PASS
    # Another program's socket on the same address and port before the next refresh
    # (man alfwrapper: EARLY DROP): dropped until then, and no more after.
    stranger = socket.socket()
    stranger.bind(("127.0.0.1", port))
    stranger.listen(4)
    assert xdp_test_run(xdp.fd, syn).retval == XDP_DROP
    ports = early.wanted_ports(names[:1], {}, sockdiag.bound_sockets(early.MOST_SOCKETS))
    early.write(xdp.tables["alf_early_ports"].map_fd, ports)
    assert xdp_test_run(xdp.fd, syn).retval == XDP_PASS
    stranger.close()


def test_ipv6_extension_headers_pass(names: tuple[str, ...]) -> None:
    from helpers.craft import frame, packet  # noqa: PLC0415  (scapy: slow to import)

    sets.create(names[0], [Prefix(6, 0x20010DB8 << 96, 32)])
    listener = socket.socket(socket.AF_INET6)
    listener.bind(("::1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    xdp = compiler.compile_and_load(program.plan_early(names[:1], "early"), ENV)
    bound = sockdiag.bound_sockets(early.MOST_SOCKETS)
    early.write(
        xdp.tables["alf_early_ports"].map_fd,
        early.wanted_ports(names[:1], {state.socket_cookie(listener): 1}, bound),
    )
    for key in early.wanted_local():
        map_update(xdp.tables["alf_early_local"].map_fd, key, struct.pack("=Q", 1))
    plain = frame(packet("6", "2001:db8::7", "::1", "syn", port))
    assert xdp_test_run(xdp.fd, plain).retval == XDP_DROP
    for ext in ("hbh", "dest", "frag"):
        wrapped = frame(packet("6", "2001:db8::7", "::1", "syn", port, exts=(ext,)))
        assert xdp_test_run(xdp.fd, wrapped).retval == XDP_PASS, ext
    listener.close()


def test_an_interface_takes_16_sets_and_refuses_another_program(
    names: tuple[str, ...], own_netns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past 16 sets on one interface: exit 64, nothing attached; an interface with an
    XDP program that is not alfwrapper's: exit 69, one line, the other program kept."""
    many = [early.Interface("lo", state.netns_cookie(), tuple(f"s{i}" for i in range(16)))]
    monkeypatch.setattr(early, "here", lambda: many)
    monkeypatch.setattr(early, "attach", lambda *_: pytest.fail("attached past 16 sets"))
    sets.create(names[0], [])
    with pytest.raises(AlfError) as refused:
        early.set_early(names[0], ["lo"])
    assert refused.value.exit_code == 64 and "more than 16 sets" in str(refused.value)
    monkeypatch.undo()

    veth = f"ea{os.getpid() % 100000}"
    subprocess.run(
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p"], check=True
    )
    other = compiler.compile_and_load(program.plan_early(names[:1], "early"), ENV)
    try:
        index = socket.if_nametoindex(veth)
        link = xdp_link(other.fd, index)
        out = subprocess.run(
            [*WRAPPER, "set", "early", names[0], veth], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 69, out.stderr
        assert out.stderr.count("\n") == 1, out.stderr
        assert "another XDP program is attached" in out.stderr
        assert link_info(link) == (prog_info(other.fd).id, index)  # still there
        os.close(link)
    finally:
        subprocess.run(["ip", "link", "del", veth], check=False)


def test_an_interface_whose_driver_refuses_gets_generic_xdp(
    names: tuple[str, ...], own_netns: str
) -> None:
    """veth refuses a native program past a page's MTU (ERANGE): early drop then runs
    in the kernel's generic mode, and says nothing of it; native otherwise."""
    veth = f"eg{os.getpid() % 100000}"
    subprocess.run(
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p"], check=True
    )
    try:
        sets.create(names[0], [])
        for mtu, mode in (("9000", 2), ("1500", 1)):  # 2: generic, 1: native (if_link.h)
            for end in (veth, f"{veth}p"):  # the peer's MTU is the one veth checks
                subprocess.run(["ip", "link", "set", end, "mtu", mtu], check=True)
            out = subprocess.run(
                [*WRAPPER, "set", "early", names[0], veth], capture_output=True, text=True
            )
            assert out.returncode == 0 and not out.stderr, out.stderr
            shown = subprocess.run(
                ["ip", "-j", "-d", "link", "show", veth], capture_output=True, text=True
            ).stdout
            assert json.loads(shown)[0]["xdp"]["mode"] == mode, (mtu, shown)
            out = subprocess.run([*WRAPPER, "set", "early", names[0]], capture_output=True)
            assert out.returncode == 0
    finally:
        subprocess.run(["ip", "link", "del", veth], check=False)


@pytest.mark.parametrize(("point", "after"), [("early-updated", 1), ("early-named", 2)])
def test_a_kill_mid_change_is_mended_by_the_next_refresh(
    names: tuple[str, ...], own_netns: str, point: str, after: int
) -> None:
    """`set early` killed after the link runs the new program but before its pins follow
    (early-updated: the old sets' names still pinned) or after the names only
    (early-named): the next `status` finds pins that are not the program's and attaches
    again, from the names pinned: the change undone, or done."""
    veth = f"ek{os.getpid() % 100000}"
    subprocess.run(
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p"], check=True
    )
    try:
        for name in names[:2]:
            sets.create(name, [])
        assert subprocess.run([*WRAPPER, "set", "early", names[0], veth]).returncode == 0
        killed = subprocess.run(
            [*WRAPPER, "set", "early", names[1], veth],
            env={**os.environ, "ALFWRAPPER_CRASH_AT": point},
            capture_output=True,
        )
        assert killed.returncode == -9, killed.stderr
        mine = early.Interface(veth, state.netns_cookie(), ())
        found = next(f for f in early.here() if f.name == veth)
        assert not early._consistent(found)
        out = subprocess.run([*WRAPPER, "status"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        found = next(f for f in early.here() if f.name == veth)
        assert found.sets == names[:after], found
        assert early._consistent(found), sorted(p.name for p in mine.folder.iterdir())
    finally:
        for name in names[:2]:
            subprocess.run([*WRAPPER, "set", "early", name], capture_output=True)
        subprocess.run(["ip", "link", "del", veth], check=False)


def in_netns(netns: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["nsenter", f"--net=/run/netns/{netns}", *WRAPPER, *argv], capture_output=True, text=True
    )


def test_destroy_and_gc_reach_other_network_namespaces(names: tuple[str, ...]) -> None:
    """`set destroy` run on the host removes the set's early drop in another namespace
    (its other sets with it, said so); `gc` removes that of a namespace that is gone,
    whose program held the sets' maps."""
    spaces = [f"ee{os.getpid() % 100000}{i}" for i in range(2)]
    try:
        for netns in spaces:
            subprocess.run(["ip", "netns", "add", netns], check=True)
            subprocess.run(
                ["ip", "-n", netns, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                check=True,
            )
        for name in names[:2]:
            sets.create(name, [])
        for netns in spaces:
            for name in names[:2]:
                assert in_netns(netns, "set", "early", name, "v0").returncode == 0
        out = subprocess.run([*WRAPPER, "set", "destroy", names[0]], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.count("early drop removed; run `alfwrapper set early` there") == 2
        for netns in spaces:
            shown = subprocess.run(
                ["ip", "-n", netns, "-j", "-d", "link", "show", "v0"],
                capture_output=True,
                text=True,
            ).stdout
            assert "xdp" not in json.loads(shown)[0], shown
        assert not [f for f in early.configured() if f.name == "v0" and names[0] in f.sets]
        for netns in spaces:
            assert in_netns(netns, "set", "early", names[1], "v0").returncode == 0
        subprocess.run(["ip", "netns", "del", spaces[0]], check=True)
        out = subprocess.run([*WRAPPER, "gc"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        left = {f.netns for f in early.configured() if f.name == "v0" and names[1] in f.sets}
        assert len(left) == 1, (left, out.stdout)  # the living namespace's stays
        assert "early drop of" in out.stdout, out.stdout
    finally:
        for netns in spaces:
            in_netns(netns, "set", "early", names[1])
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        subprocess.run([*WRAPPER, "gc"], capture_output=True)


def test_set_early_is_roots(names: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Not as root: one line, exit 77, before anything is read."""
    monkeypatch.setattr(early.os, "geteuid", lambda: 65534)
    with pytest.raises(AlfError) as refused:
        early.set_early(names[0], ["lo"])
    assert refused.value.exit_code == 77
    assert str(refused.value).startswith(f"set early {names[0]}: early drop is root's"), refused


def test_multicast_and_device_bound_ports_are_left_to_the_sockets(
    names: tuple[str, ...],
) -> None:
    """A frame to a multicast address goes to every socket bound there, of which the
    lookup finds one: never dropped early.  A port with a socket bound to a device
    (SO_BINDTODEVICE), which the stack finds by a device XDP does not know: left alone."""
    sets.create(names[0], [Prefix(4, 0xC6336400, 24)])
    group = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    group.bind(("239.1.2.3", 0))
    near = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    near.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    near.bind(("127.0.0.1", 0))
    port = near.getsockname()[1]
    bound = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    bound.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
    xdp = compiler.compile_and_load(program.plan_early(names[:1], "early"), ENV)
    ours = {state.socket_cookie(s): 1 for s in (group, near)}
    for key in early.wanted_local():
        map_update(xdp.tables["alf_early_local"].map_fd, key, struct.pack("=Q", 1))

    def judged(destination: int, dport: int) -> int:
        ports = early.wanted_ports(names[:1], ours, sockdiag.bound_sockets(early.MOST_SOCKETS))
        early.write(xdp.tables["alf_early_ports"].map_fd, ports)
        frame = udp_frame(4, 0xC6336407, b"x", 40001, destination, dport)
        return xdp_test_run(xdp.fd, frame).retval

    assert judged(0xEF010203, group.getsockname()[1]) == XDP_PASS
    assert judged(0x7F000001, port) == XDP_DROP  # the same source, to a unicast socket
    bound.bind(("0.0.0.0", port))
    assert judged(0x7F000001, port) == XDP_PASS
    for s in (group, near, bound):
        s.close()


def test_an_interface_under_another_is_refused(names: tuple[str, ...], own_netns: str) -> None:
    """A bridge's port, or a macvlan's lower device: the stack takes its frames as
    another interface's (exit 64, one line, nothing attached)."""
    tag = f"{os.getpid() % 100000}"
    veth, bridge, upper = f"eu{tag}", f"eb{tag}", f"em{tag}"
    subprocess.run(
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p"], check=True
    )
    try:
        sets.create(names[0], [])
        subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", veth, "master", bridge], check=True)
        subprocess.run(
            ["ip", "link", "add", upper, "link", f"{veth}p", "type", "macvlan"], check=True
        )
        for lower, said in ((veth, "is a port of"), (f"{veth}p", "lower device of macvlan")):
            out = subprocess.run(
                [*WRAPPER, "set", "early", names[0], lower], capture_output=True, text=True
            )
            assert out.returncode == 64, out.stderr
            assert said in out.stderr and out.stderr.count("\n") == 1, out.stderr
            assert not [f for f in early.here() if f.name == lower]
    finally:
        for link in (upper, bridge, veth):
            subprocess.run(["ip", "link", "del", link], capture_output=True)


def test_a_recreated_interface_gets_a_new_link(names: tuple[str, ...], own_netns: str) -> None:
    """The interface deleted and made again under its name: the next `set early` there
    attaches to the new one (the old link was let go of by the kernel)."""
    veth = f"er{os.getpid() % 100000}"
    make = ["ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p"]
    subprocess.run(make, check=True)
    try:
        for name in names[:2]:
            sets.create(name, [])
        assert subprocess.run([*WRAPPER, "set", "early", names[0], veth]).returncode == 0
        subprocess.run(["ip", "link", "del", veth], check=True)
        subprocess.run(make, check=True)
        out = subprocess.run(
            [*WRAPPER, "set", "early", names[1], veth], capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        shown = subprocess.run(
            ["ip", "-j", "-d", "link", "show", veth], capture_output=True, text=True
        ).stdout
        assert json.loads(shown)[0]["xdp"]["mode"] == 1, shown
        assert next(f for f in early.here() if f.name == veth).sets == names[:2]
    finally:
        for name in names[:2]:
            subprocess.run([*WRAPPER, "set", "early", name], capture_output=True)
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
