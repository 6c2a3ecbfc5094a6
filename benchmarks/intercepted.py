#!/usr/bin/python3
"""A daemon's own binds under alfwrapper's interception (lifecycle/intercept.py), side by
side with the same daemon alone: the time of one bind and of one listen, and the bind
supervisor's memory.  As root.

    intercepted.py [--smoke] [--json]

The daemon binds COUNT UDP sockets and makes COUNT TCP sockets listen, each on a port of
its own on the loopback, timing each call; the figures are medians.  Each intercepted
socket gets its pinned state and its program (from the program cache) before the call is
done, as any socket of --listen does at a start."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DAEMON = r"""
import json, os, socket, sys, time
count, base = int(sys.argv[1]), int(sys.argv[2])
binds, listens, held = [], [], []
for i in range(count):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    begin = time.perf_counter(); u.bind(("127.0.0.1", base + i))
    binds.append(time.perf_counter() - begin)
    t = socket.socket(); t.bind(("127.0.0.1", base + count + i))
    begin = time.perf_counter(); t.listen(8); listens.append(time.perf_counter() - begin)
    held += [u, t]
print(json.dumps([binds, listens]), flush=True)
sys.stdin.read(1)  # held until the bench has read the supervisor's memory
"""


def run(count: int, base: int, wrapped: bool) -> dict[str, float]:
    argv = [sys.executable, "-c", DAEMON, str(count), str(base)]
    if wrapped:
        argv = [sys.executable, "-m", "alfwrapper", "--service", "benchbind",
                "--allow", "127.0.0.0/8", "--", *argv]  # fmt: skip
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    binds, listens = json.loads(proc.stdout.readline())
    rss = supervisor_rss() if wrapped else 0.0
    proc.stdin.write("x")
    proc.stdin.close()
    proc.wait(timeout=60)
    return {"bind_ms": statistics.median(binds) * 1e3,
            "listen_ms": statistics.median(listens) * 1e3, "supervisor_mib": rss}  # fmt: skip


def supervisor_rss() -> float:
    found = subprocess.run(["pgrep", "-f", "alfwrapper-bind benchbind"], capture_output=True,
                           text=True, check=False)  # fmt: skip
    for pid in found.stdout.split():
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    smoke = "--smoke" in sys.argv
    count = 5 if smoke else 50
    run(2, 39000, True)  # the program cache filled, as after a first start
    time.sleep(0.2)
    result = {"count": count, "alone": run(count, 39100, False),
              "intercepted": run(count, 39300, True)}  # fmt: skip
    if "--json" in sys.argv:
        print(json.dumps(result))
    else:
        for key in ("alone", "intercepted"):
            print(key, result[key])
    return 0


if __name__ == "__main__":
    sys.exit(main())
