"""One user's worst at the loader, until its stdin closes (at most SECONDS):
connections opened and closed as fast as they go, 300 held open (half of them with a
half-sent request), and 16 MiB requests, all at once.  Prints what it did.

    loader_flood.py SOCKET SECONDS
"""

from __future__ import annotations

import socket
import struct
import sys
import threading

path, seconds = sys.argv[1], float(sys.argv[2])
stop = threading.Event()
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
    while not stop.is_set():
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
    stop.wait()


def huge() -> None:
    body = b"[" * ((16 << 20) - 16)
    while not stop.is_set():
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
bound = threading.Timer(seconds, stop.set)
bound.daemon = True
bound.start()
sys.stdin.read()  # the caller closes stdin when it is done
stop.set()
bound.cancel()
for thread in threads:
    thread.join(30)
print(" ".join(f"{k}={v}" for k, v in done.items()), flush=True)
