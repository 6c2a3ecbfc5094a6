"""host/sockdiag.py's hand-written dump against pyroute2's DiagSocket, in a network
namespace of its own holding only the sockets made here: listening, connected (both
ends), half-closed, UDP bound and connected, IPv4 and IPv6, and enough of them that
the dump spans many reads."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers.support import ROOT

pytestmark = pytest.mark.host

HEAD = r"""
import errno, socket, struct, sys, time
sys.path.insert(0, sys.argv[1])
from pyroute2 import DiagSocket
from alfwrapper.host import sockdiag
FAMILIES = ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"))
def listening(family, host, backlog):
    listener = socket.socket(family)
    listener.bind((host, 0))
    listener.listen(backlog)
    return listener
"""

PROBE = (
    HEAD
    + r"""
socks = []
for family, host in FAMILIES:
    listener = listening(family, host, 512)
    socks.append(listener)
    for i in range(150):
        client = socket.create_connection(listener.getsockname()[:2])
        server, _ = listener.accept()
        socks += [client, server]
        if i % 3 == 0:
            client.shutdown(socket.SHUT_WR)  # FIN_WAIT2 and CLOSE_WAIT
    for i in range(40):
        udp = socket.socket(family, socket.SOCK_DGRAM)
        udp.bind((host, 0))
        if i % 2:
            udp.connect(listener.getsockname()[:2])
        socks.append(udp)
ours = {struct.unpack("=Q", s.getsockopt(socket.SOL_SOCKET, 57, 8))[0] for s in socks}
theirs = set()
with DiagSocket() as diag:
    diag.bind()
    for family in (socket.AF_INET, socket.AF_INET6):
        for protocol in (socket.IPPROTO_TCP, socket.IPPROTO_UDP):
            for msg in diag.get_sock_stats(family=family, protocol=protocol, states=0xFFFFFFFF):
                theirs.add(int(msg["idiag_cookie"]))
mine = sockdiag.live_cookies()
print(len(ours), len(mine), len(theirs), mine == theirs, ours <= mine)
"""
)


def in_a_netns(probe: str) -> subprocess.CompletedProcess[str]:
    """Run the probe in a network namespace of its own, with lo up."""
    out = subprocess.run(
        ["unshare", "--net", "sh", "-c", "ip link set lo up && exec \"$@\"", "-",
         sys.executable, "-c", probe, str(ROOT)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out


def test_the_dump_lists_what_pyroute2_lists() -> None:
    out = in_a_netns(PROBE)
    ours, mine, theirs, same, covered = out.stdout.split()
    assert (ours, mine, theirs) == ("682", "682", "682"), out.stdout  # 2 x (1 + 300 + 40)
    assert same == "True" and covered == "True", out.stdout


CUT = (
    HEAD
    + r"""
out = []
for family, host in FAMILIES:
    listener = listening(family, host, 64)
    port = listener.getsockname()[1]
    pairs = []
    for _ in range(4):
        client = socket.create_connection((host, port))
        server, _ = listener.accept()
        pairs.append((client, server))
    pairs[3][0].shutdown(socket.SHUT_WR)  # its server end in CLOSE_WAIT
    time.sleep(0.1)
    other = listening(family, host, 1)
    bystander = socket.create_connection(other.getsockname()[:2])  # another port
    found = sockdiag.tcp_connections(family, port, 1000)
    cookies = {struct.unpack("=Q", s.getsockopt(socket.SOL_SOCKET, 57, 8))[0] for _, s in pairs}
    with DiagSocket() as diag:
        diag.bind()
        theirs = {
            (int(m["idiag_cookie"]), m["idiag_dport"])
            for m in diag.get_sock_stats(family=family, states=sockdiag.CONNECTED_STATES)
            if m["idiag_sport"] == port
        }
    mine = {(struct.unpack_from("=Q", c.sockid, 40)[0], c.peer_port) for c in found}
    out.append(mine == theirs and {c for c, _ in mine} == cookies)
    out.append({c.peer_port for c in found} == {s.getpeername()[1] for _, s in pairs})
    out.append(sorted(c.state for c in found) == [1, 1, 1, 8])  # no listener
    victim = next(c for c in found if c.peer_port == pairs[0][0].getsockname()[1])
    started = time.monotonic()
    sockdiag.destroy(victim)
    pairs[0][0].settimeout(1)
    try:
        pairs[0][0].recv(1)
        out.append("no reset")
    except OSError as err:
        out.append(err.errno == errno.ECONNRESET and time.monotonic() - started < 1)
    try:
        pairs[0][1].recv(1)
        out.append("not aborted")
    except OSError as err:
        out.append(err.errno == errno.ECONNABORTED)
    pairs[1][0].sendall(b"x")
    out.append(pairs[1][1].recv(1) == b"x")  # the others untouched
    try:
        sockdiag.destroy(victim)
        out.append("destroyed twice")
    except OSError as err:
        out.append(err.errno == errno.ENOENT)
print(" ".join(map(str, out)))
"""
)


def test_a_connection_destroyed_by_its_id_is_reset_alone() -> None:
    out = in_a_netns(CUT)
    assert out.stdout.split() == ["True"] * 14, out.stdout
