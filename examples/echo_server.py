#!/usr/bin/python3
"""A small socket-activated echo service (sd_listen_fds), the example behind alfwrapper.

It serves every socket it is given at fd 3 onwards: TCP connections get each
line echoed back, UDP datagrams get an echo reply.  It writes one line to
stdout per thing it receives, so you (and the tests) can see what reached it:

    ready fds=3,4 names=web:dns
    accept web 192.0.2.2
    tcp web 192.0.2.2 hello
    udp dns 2001:db8:1::2 hello

It uses only the standard library and follows sd_listen_fds(3): LISTEN_PID
must be its own pid, or it serves nothing.  With ECHO_IDLE_EXIT=SECONDS in its
environment it exits after that long without traffic, as socket-activated
services often do.  With ECHO_BIND=NAME=tcp:PORT,NAME=udp:PORT it binds its own
sockets instead, as most daemons do.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys


def listen_fds() -> list[tuple[socket.socket, str]]:
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return []
    count = int(os.environ.get("LISTEN_FDS", "0"))
    names = os.environ.get("LISTEN_FDNAMES", "").split(":")
    names += ["unknown"] * (count - len(names))
    return [(socket.socket(fileno=3 + i), names[i]) for i in range(count)]


def open_descriptors() -> list[int]:
    """The fds this process holds, leaving out the one used to list them."""
    held = []
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))  # the listing's own fd is closed by now
        except OSError:
            continue
        held.append(int(name))
    return sorted(held)


def say(*words: object) -> None:
    print(*words, flush=True)


def peer_host(address: tuple[str, int] | tuple[str, int, int, int]) -> str:
    host = address[0]
    return host.removeprefix("::ffff:")  # IPv4 clients of a dual-stack socket


def own_sockets(spec: str) -> list[tuple[socket.socket, str]]:
    """ECHO_BIND=NAME=tcp:PORT,NAME=udp:PORT: sockets it binds itself (dual-stack), as
    most daemons do (nginx, PostgreSQL, ...): what alfwrapper must then intercept."""
    sockets = []
    for item in spec.split(","):
        name, _, where = item.partition("=")
        kind, _, port = where.partition(":")
        sock = socket.socket(
            socket.AF_INET6, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM
        )
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::", int(port)))
        if kind == "tcp":
            sock.listen(64)
        sockets.append((sock, name))
    return sockets


def main() -> int:  # noqa: C901
    spec = os.environ.get("ECHO_BIND")
    sockets = own_sockets(spec) if spec else listen_fds()
    if not sockets:
        say("no sockets passed (LISTEN_FDS/LISTEN_PID); start me under alfwrapper")
        return 1
    open_fds = open_descriptors()
    select = selectors.DefaultSelector()
    buffers: dict[socket.socket, bytes] = {}
    for sock, name in sockets:
        sock.setblocking(False)
        connected = sock.type == socket.SOCK_STREAM and not sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_ACCEPTCONN
        )
        if connected:  # Accept=yes: systemd accepted it for us
            buffers[sock] = b""
            peer = (name, peer_host(sock.getpeername()))
            select.register(sock, selectors.EVENT_READ, ("conn", peer))
        else:
            select.register(sock, selectors.EVENT_READ, ("listener", name))
    # Listed before the selector opened its own fd: what we were handed.
    say(f"ready fds={','.join(map(str, open_fds))} names={':'.join(n for _, n in sockets)}")
    # ECHO_IDLE_EXIT=SECONDS: exit when nothing came for that long and no
    # connection is open, as many socket-activated services do.
    idle = float(os.environ.get("ECHO_IDLE_EXIT", "0")) or None
    while True:
        events = select.select(timeout=idle)
        if not events and not buffers:
            say("idle: exiting")
            return 0
        for key, _ in events:
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            role, name = key.data
            if role == "listener" and sock.type == socket.SOCK_STREAM:
                try:
                    conn, address = sock.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                buffers[conn] = b""
                say("accept", name, peer_host(address))
                select.register(conn, selectors.EVENT_READ, ("conn", (name, peer_host(address))))
            elif role == "listener":
                try:
                    data, address = sock.recvfrom(65535)
                except BlockingIOError:
                    continue
                say("udp", name, peer_host(address), data.decode(errors="replace").strip())
                try:
                    sock.sendto(b"echo " + data, address)
                except OSError:  # no route back: the sender is told nothing
                    pass
            else:
                cname, peer = name
                try:
                    data = sock.recv(65535)
                except (BlockingIOError, ConnectionError):
                    data = b""
                if not data:
                    select.unregister(sock)
                    buffers.pop(sock, None)
                    sock.close()
                    if not select.get_map():  # Accept=yes: our one connection is over
                        return 0
                    continue
                buffers[sock] += data
                while b"\n" in buffers[sock]:
                    line, buffers[sock] = buffers[sock].split(b"\n", 1)
                    say("tcp", cname, peer, line.decode(errors="replace").strip())
                    try:
                        sock.sendall(b"echo " + line + b"\n")
                    except OSError:  # the peer is gone; its next read ends the connection
                        pass


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(0)
