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

PROBE = r"""
import socket, struct, sys
sys.path.insert(0, sys.argv[1])
from pyroute2 import DiagSocket
from alfwrapper.host import sockdiag
socks = []
for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    listener = socket.socket(family)
    listener.bind((host, 0))
    listener.listen(512)
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


def test_the_dump_lists_what_pyroute2_lists() -> None:
    out = subprocess.run(
        ["unshare", "--net", "sh", "-c", "ip link set lo up && exec \"$@\"", "-",
         sys.executable, "-c", PROBE, str(ROOT)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    ours, mine, theirs, same, covered = out.stdout.split()
    assert (ours, mine, theirs) == ("682", "682", "682"), out.stdout  # 2 x (1 + 300 + 40)
    assert same == "True" and covered == "True", out.stdout
