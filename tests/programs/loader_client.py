"""A raw loader client, run as some user: send one request, print what came back.

    loader_client.py REQUEST_JSON|@FILE [--socket tcp|udp] [--pins SERVICE:COOKIE:NAME,...]
                     [--file PATH] [--raw BYTES_HEX]

Prints one JSON line: the answer, for each fd handed back its kind
(prog:TYPE or map:TYPE), and this process's pid.  --pins sends fds of the user's own pinned maps
(opened through the loader first), --file an open file's.  With --raw, sends
those bytes as they are instead (for malformed requests) and prints the
answer, or {"closed": true}.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from alfwrapper.host import bpf_calls
from alfwrapper.loader import client, protocol


def kind(fd: int) -> str:
    link = os.readlink(f"/proc/self/fd/{fd}")
    if link == "anon_inode:bpf-prog":
        return f"prog:{bpf_calls.prog_type(fd)}"
    if link == "anon_inode:bpf-map":
        return f"map:{bpf_calls.map_shape(fd)[0]}"
    return link


def main(argv: list[str]) -> int:
    path = protocol.socket_path()
    fds: list[int] = []
    request = None
    if argv[0] != "--raw":
        text = argv[0]
        if text.startswith("@"):  # a request too long for a command line
            with open(text[1:], encoding="utf-8") as f:
                text = f.read()
        request = json.loads(text)
        if "--socket" in argv:
            kind_ = (
                socket.SOCK_STREAM
                if argv[argv.index("--socket") + 1] == "tcp"
                else (socket.SOCK_DGRAM)
            )
            sock = socket.socket(socket.AF_INET6, kind_)
            sock.bind(("::1", 0))
            fds = [sock.fileno()]
        if "--pins" in argv:  # before connecting: a connection idle for 10 s is closed
            broker = client.Broker(path)
            for pin in argv[argv.index("--pins") + 1].split(","):
                service, cookie, name = pin.split(":")
                fds.append(broker.open_pin(broker.state(service, int(cookie)), name))
        if "--file" in argv:
            fds.append(os.open(argv[argv.index("--file") + 1], os.O_RDONLY))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(60)
        protocol.connect(conn, path)
        if request is None:
            conn.sendall(bytes.fromhex(argv[1]))
            conn.shutdown(socket.SHUT_WR)
        else:
            try:
                protocol.send(conn, request, fds)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before it was all read: the answer says why (as client.py)
        try:
            answer, got = protocol.receive(conn, protocol.REQUEST_LIMIT, 60, 8)
        except Exception as err:  # noqa: BLE001  (the answer is the test's business)
            print(json.dumps({"closed": True, "why": str(err)}))
            return 0
    print(json.dumps({"answer": answer, "fds": [kind(fd) for fd in got], "pid": os.getpid()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
