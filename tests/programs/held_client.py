#!/usr/bin/python3
"""Test client for "a ban cuts the banned host's open connection".

    held_client.py ADDRESS PORT

Connects and exchanges a line, then prints "ready" and holds the connection.  A
line on stdin makes it exchange another line on the same connection and print
"echo" (or "timeout", "error").  When the connection ends under it, it prints
"reset T" (ECONNRESET: the server's kernel sent a RST) or "closed T" (anything
else), T being time.monotonic() then, and exits.
"""

import select
import socket
import sys
import time

from long_client import exchange  # beside this file


def main() -> None:
    address, port = sys.argv[1], int(sys.argv[2])
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect((address, port))
        print(exchange(sock, b"held-first"), "ready", flush=True)
        while True:
            readable, _, _ = select.select([sock, sys.stdin], [], [])
            try:
                if sys.stdin in readable:
                    if not sys.stdin.readline():
                        return
                    print(exchange(sock, b"held-again"), flush=True)
                elif not sock.recv(4096):
                    print("closed", time.monotonic(), flush=True)
                    return
            except TimeoutError:
                print("timeout", flush=True)
            except ConnectionResetError:
                print("reset", time.monotonic(), flush=True)
                return
            except OSError as err:
                print("closed", time.monotonic(), err, flush=True)
                return


if __name__ == "__main__":
    main()
