#!/usr/bin/python3
"""Throughput client: send for SECONDS to ADDRESS:PORT, print bits per second.

    blast.py ADDRESS PORT SECONDS

The sink reads to EOF and closes; the clock stops when its close arrives, so
every byte counted was received.
"""

import socket
import sys
import time


def main() -> None:
    address, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    data = b"\0" * (256 << 10)
    sent = 0
    with socket.create_connection((address, port), timeout=10) as sock:
        begin = time.monotonic()
        while time.monotonic() - begin < seconds:
            sock.sendall(data)
            sent += len(data)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)
        elapsed = time.monotonic() - begin
    print(f"{sent * 8 / elapsed:.0f}", flush=True)


if __name__ == "__main__":
    main()
