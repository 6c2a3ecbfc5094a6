"""Run in a guest as an ordinary user: ask the loader for one program after another,
each for a throw-away socket with N allow rules, keep only the program's fd (the
socket is closed at once), until the loader refuses or MOST were made.  Prints a
JSON line per request: the answer, fds held, MemAvailable (KiB), and, with --counted,
what the kernel counts in the user's memory cgroup (KiB), read from fd 3: its
memory.current, which root opens for this process (the user may not open it).

    hoard.py N MOST [--counted 3< CGROUP/memory.current]
"""

from __future__ import annotations

import json
import os
import socket
import sys

import numpy as np

from alfwrapper.loader import protocol
from alfwrapper.policy.prefix_list import PrefixList
from alfwrapper.policy.rules import SocketRules, SubnetRules


def available() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))


def counted() -> int:
    return int(os.pread(3, 64, 0)) >> 10 if sys.argv[3:] == ["--counted"] else 0


n, most = int(sys.argv[1]), int(sys.argv[2])
index = np.arange(n, dtype=np.uint64)
allow = PrefixList(
    np.full(n, 6, np.uint8),
    np.full(n, 64, np.uint8),
    np.uint64(0x20010DB8 << 32) | index,
    np.zeros(n, np.uint64),
)
rules = SocketRules(subnets=SubnetRules(allow=allow))
request = {"op": "load", "label": "hoard", "rules": protocol.encode_rules(rules)}
held: list[int] = []
print(json.dumps({"held": 0, "available": available(), "counted": counted()}), flush=True)
for _ in range(most):
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
        sock.bind(("::1", 0))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(900)
            protocol.connect(conn, protocol.socket_path())
            protocol.send(conn, request, [sock.fileno()])
            answer, fds = protocol.receive(conn, protocol.REQUEST_LIMIT, 900, 8)
    held += fds  # the program outlives its socket: only this fd holds it
    print(
        json.dumps(
            {"answer": answer, "held": len(held), "available": available(), "counted": counted()}
        ),
        flush=True,
    )
    if "error" in answer:
        break
