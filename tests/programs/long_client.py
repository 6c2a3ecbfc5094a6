#!/usr/bin/python3
"""Test client for "established connections outlive the knock window".

    long_client.py ADDRESS PORT WAIT

Connects and exchanges a line, waits WAIT seconds, exchanges another line on
the same connection, then tries a new connection.  Prints three words: the
result of each step ("echo", "timeout", "refused" or "error").
"""

import socket
import sys
import time


def exchange(sock: socket.socket, line: bytes) -> str:
    sock.sendall(line + b"\n")
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            return "error"
        reply += chunk
    return "echo" if reply.strip() == b"echo " + line else "error"


def attempt(address: str, port: int, line: bytes) -> str:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.5)
        try:
            sock.connect((address, port))
            return exchange(sock, line)
        except TimeoutError:
            return "timeout"
        except ConnectionRefusedError:
            return "refused"


def main() -> None:
    address, port, wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    results = []
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect((address, port))
        results.append(exchange(sock, b"long-first"))
        time.sleep(wait)
        try:
            results.append(exchange(sock, b"long-second"))
        except OSError:
            results.append("error")
        results.append(attempt(address, port, b"long-new"))
    print(" ".join(results), flush=True)


if __name__ == "__main__":
    main()
