"""Run in a guest as an ordinary user: ask the loader for one program after another,
each for a throw-away socket with N allow rules, keep only the program's fd (the
socket is closed at once), until the loader refuses or MOST were made.  Prints a
JSON line per request: the answer, fds held, and MemAvailable (KiB).

    hoard.py N MOST
"""

from __future__ import annotations

import json
import socket
import sys

import numpy as np

from alfwrapper.loader import protocol
from alfwrapper.policy.prefix_list import PrefixList
from alfwrapper.policy.rules import SocketRules, SubnetRules


def available() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:  # noqa: PTH123
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))


n, most = int(sys.argv[1]), int(sys.argv[2])
index = np.arange(n, dtype=np.uint64)
allow = PrefixList(np.full(n, 6, np.uint8), np.full(n, 64, np.uint8),
                   np.uint64(0x20010DB8 << 32) | index, np.zeros(n, np.uint64))  # fmt: skip
request = {"op": "load", "label": "hoard",
           "rules": protocol.encode_rules(SocketRules(SubnetRules(allow=allow)))}  # fmt: skip
held: list[int] = []
print(json.dumps({"held": 0, "available": available()}), flush=True)
for _ in range(most):
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
        sock.bind(("::1", 0))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(900)
            protocol.connect(conn, protocol.socket_path())
            protocol.send(conn, request, [sock.fileno()])
            answer, fds = protocol.receive(conn, protocol.REQUEST_LIMIT, 900, 8)
    held += fds  # the program outlives its socket: only this fd holds it
    print(json.dumps({"answer": answer, "held": len(held), "available": available()}), flush=True)
    if "error" in answer:
        break
