#!/usr/bin/python3
"""A socket-activated sink for the throughput benchmark: reads each connection to EOF."""

import os
import socket
import sys


def main() -> int:
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return 1
    listener = socket.socket(fileno=3)
    print("ready", flush=True)
    buffer = bytearray(1 << 20)
    while True:
        conn, _ = listener.accept()
        with conn:
            while conn.recv_into(buffer):
                pass


if __name__ == "__main__":
    sys.exit(main())
