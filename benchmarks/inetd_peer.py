"""What one Accept=yes connection costs the wrapper: CPU time and peak RSS.

    inetd_peer.py [ROUNDS] [--json]

A connection from a denied source (127.0.0.2) and one from an allowed source
(127.0.0.1) are accepted here and handed to `alfwrapper --allow 127.0.0.1/32 --
true` on fd 0, as systemd (Accept=yes) and `systemd-socket-activate --inetd`
hand them: each with its verdict kept by an earlier start (one untimed start
keeps it: lifecycle/verdicts.py; the allowed peer's COMMAND is then exec'd from
it), and again with no cache (judged in full, as every peer was before
verdicts were kept); beside them, the same wrapper given a listening socket on
fd 0, which it must compile a program for (what every connection cost before
the peer was judged from the rules).  The five take turns in each round.  The
figures are the wrapper process's own (wait4's rusage): user plus system CPU,
and its peak RSS; the median over the rounds.  Needs root (the compile).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARGV = ["-m", "alfwrapper", "--service", "bench-inetd", "--allow", "127.0.0.1/32", "--", "true"]


def one(kind: str, cache: str) -> tuple[float, float]:
    """CPU seconds and peak RSS (MiB) of one wrapper given this kind of socket on fd 0,
    with this program and verdict cache (ALFWRAPPER_CACHE; "" for the environment's)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        if kind == "compiling":
            handed, keep = listener, []
        else:
            client = socket.socket()
            client.bind(("127.0.0.1" if kind.startswith("allowed") else "127.0.0.2", 0))
            client.connect(listener.getsockname())
            handed, _ = listener.accept()
            keep = [client, handed]
        proc = subprocess.Popen(
            [sys.executable, *ARGV],
            stdin=handed.fileno(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, "ALFWRAPPER_CACHE": cache} if cache else None,
        )
        assert proc.stderr is not None
        errors = proc.stderr.read().decode(errors="replace")
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        for sock in keep:
            sock.close()
    if proc.returncode != 0 or kind.startswith("denied") != ("denied and reset" in errors):
        raise RuntimeError(f"{kind}: exit {proc.returncode}: {errors[-500:]}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def run(rounds: int) -> dict[str, tuple[float, float]]:
    """For each kind: median CPU (ms) and median peak RSS (MiB) over ``rounds``."""
    seen: dict[str, list[tuple[float, float]]] = {
        "denied": [],
        "denied, judged in full": [],
        "allowed": [],
        "allowed, judged in full": [],
        "compiling": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        kept = str(Path(tmp) / "cache")
        caches = {
            "denied": kept,
            "denied, judged in full": "off",
            "allowed": kept,
            "allowed, judged in full": "off",
        }
        one("denied", kept)  # keeps the verdict
        for _ in range(rounds):
            for kind, rows in seen.items():
                rows.append(one(kind, caches.get(kind, "")))
    return {
        kind: (
            statistics.median(cpu for cpu, _ in rows) * 1000,
            statistics.median(mib for _, mib in rows),
        )
        for kind, rows in seen.items()
    }


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--json"]
    result = run(int(args[0]) if args else 5)
    if "--json" in sys.argv:
        print(json.dumps(result))
    else:
        for kind, (ms, mib) in result.items():
            print(f"{kind:24} {ms:6.0f} ms CPU  {mib:4.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
