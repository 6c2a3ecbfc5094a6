#!/usr/bin/python3
"""Test client: one connection held open, one line a second on it.

    steady_client.py ADDRESS PORT COUNT

Sends long-1 ... long-COUNT, one a second, on one TCP connection, waiting for
each echo (at most 5 s).  Prints "sent N echoed M".
"""

import socket
import sys
import time


def main() -> str:
    address, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    echoed = 0
    with socket.create_connection((address, port), timeout=5) as sock:
        reader = sock.makefile("rb")
        for i in range(1, count + 1):
            line = f"long-{i}".encode()
            try:
                sock.sendall(line + b"\n")
                if reader.readline().strip() == b"echo " + line:
                    echoed += 1
            except OSError:
                pass
            time.sleep(1)
    return f"sent {count} echoed {echoed}"


if __name__ == "__main__":
    print(main(), flush=True)
