"""One user's worst at the loader, for a while: connections opened and closed as fast
as they go, 300 held open (half of them with a half-sent request), and 16 MiB
requests, all at once.  Prints what it did.

    loader_flood.py SOCKET SECONDS
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time

path, seconds = sys.argv[1], float(sys.argv[2])
end = time.monotonic() + seconds
done = {"churned": 0, "held": 0, "huge": 0}


def connect() -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(2)
    try:
        conn.connect(path)
        return conn
    except OSError:
        conn.close()
        return None


def churn() -> None:
    while time.monotonic() < end:
        conn = connect()
        if conn is not None:
            conn.close()
            done["churned"] += 1


def hold() -> None:
    held = []
    for i in range(300):
        conn = connect()
        if conn is None:
            continue
        if i % 2:
            try:
                conn.sendall(b'\0\0\3\350{"op":')
            except OSError:
                pass
        held.append(conn)
        done["held"] += 1
    while time.monotonic() < end:
        time.sleep(0.1)


def huge() -> None:
    body = b"[" * ((16 << 20) - 16)
    while time.monotonic() < end:
        conn = connect()
        if conn is None:
            continue
        try:
            conn.sendall(struct.pack("!I", len(body)) + body)
            done["huge"] += 1
        except OSError:
            pass
        conn.close()


threads = [threading.Thread(target=f, daemon=True) for f in (churn, churn, hold, huge)]
for thread in threads:
    thread.start()
print("flooding", flush=True)
for thread in threads:
    thread.join(seconds + 30)
print(" ".join(f"{k}={v}" for k, v in done.items()), flush=True)
