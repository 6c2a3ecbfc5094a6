#!/usr/bin/python3
"""Test client, run inside a host's namespace: one probe, one word of result.

    client.py tcp|udp ADDRESS PORT MESSAGE TIMEOUT [SOURCE]

Prints "echo" if the service answered with the echo of MESSAGE, "timeout"
if nothing came back in time (what a filtered client sees), "refused" on a
TCP RST or ICMP unreachable, or "error: ..." otherwise.
"""

import socket
import sys


def main() -> str:
    proto, address, port_text, message, timeout_text = sys.argv[1:6]
    source = sys.argv[6] if len(sys.argv) > 6 else None
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    target = (address, int(port_text))
    timeout = float(timeout_text)
    with socket.socket(family, kind) as sock:
        sock.settimeout(timeout)
        if source:
            sock.bind((source, 0))
        try:
            if proto == "tcp":
                sock.connect(target)
                sock.sendall(message.encode() + b"\n")
                reply = b""
                while not reply.endswith(b"\n"):
                    chunk = sock.recv(4096)
                    if not chunk:
                        return "error: connection closed"
                    reply += chunk
            else:
                sock.sendto(message.encode() + b"\n", target)
                reply = sock.recv(4096)
        except TimeoutError:
            return "timeout"
        except ConnectionRefusedError:
            return "refused"
        except OSError as err:
            return f"error: {err}"
    return "echo" if reply.strip() == b"echo " + message.encode() else f"error: got {reply!r}"


if __name__ == "__main__":
    print(main(), flush=True)
