#!/usr/bin/python3
"""A socket unit in miniature, for attacks on the activation race: listen, wait, exec.

    activate.py --go FILE tcp|udp:ADDR:PORT:NAME ... -- COMMAND [ARG...]

Creates and binds the sockets (listening for TCP), prints "listening", waits
until FILE exists (at most 60 s), then execs COMMAND with them at fds 3, 4, ...
and LISTEN_FDS, LISTEN_PID and LISTEN_FDNAMES set, as systemd does.  So a
test can queue whatever it likes on the sockets before any filter exists.
"""

import fcntl
import os
import socket
import sys
import time


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    options, command = args[:split], args[split + 1 :]
    go = options[options.index("--go") + 1]
    specs = [o for o in options if o.startswith(("tcp:", "udp:"))]
    sockets, names = [], []
    for spec in specs:
        proto, rest = spec.split(":", 1)
        rest, name = rest.rsplit(":", 1)
        host, port = rest.rsplit(":", 1)
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        if proto == "tcp":
            sock.listen(128)
        sockets.append(sock)
        names.append(name)
    print("listening", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit("activate.py: never told to go")
        time.sleep(0.02)
    parked = [fcntl.fcntl(s.fileno(), fcntl.F_DUPFD_CLOEXEC, 100) for s in sockets]
    for i, fd in enumerate(parked):
        os.dup2(fd, 3 + i, inheritable=True)
    env = dict(os.environ)
    env.update(
        LISTEN_FDS=str(len(sockets)), LISTEN_PID=str(os.getpid()), LISTEN_FDNAMES=":".join(names)
    )
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    main()
