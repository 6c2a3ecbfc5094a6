#!/usr/bin/python3
"""A socket unit in miniature, for attacks on the activation race: listen, wait, exec.

    activate.py --go FILE SPEC ... -- COMMAND [ARG...]
    activate.py --go FILE --supervise [--crash POINT | --kill-after SECONDS]
                [--generations N] [--pause FILE] SPEC ... -- COMMAND [ARG...]

SPEC is tcp|udp:ADDR:PORT:NAME, or tcp6only:[ADDR]:PORT:NAME for an IPv6-only
listener (BindIPv6Only=ipv6-only).  Creates and binds the sockets (listening for
TCP), prints "listening", waits until FILE exists (at most 60 s), then execs
COMMAND with them at fds 3, 4, ... and LISTEN_FDS, LISTEN_PID and LISTEN_FDNAMES
set, as systemd does.  So a test can queue whatever it likes on the sockets before
any filter exists.

With --supervise it keeps the sockets and runs COMMAND as a service manager with
Restart=always would: a first time with ALFWRAPPER_CRASH_AT=POINT in its
environment (faults.py: it kills itself there), or killed with SIGKILL after
SECONDS; then again, as it is, until this process is stopped (or N times in all,
the sockets kept open after).
It prints "generation N exited STATUS" as each one ends.  With --pause, it waits
after the first generation until FILE exists (a test may change things then).
"""

import fcntl
import os
import signal
import socket
import sys
import time


def make_sockets(specs: list[str]) -> tuple[list[socket.socket], list[str]]:
    sockets, names = [], []
    for spec in specs:
        proto, rest = spec.split(":", 1)
        rest, name = rest.rsplit(":", 1)
        host, port = rest.rsplit(":", 1)
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        kind = socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM
        sock = socket.socket(family, kind)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(proto == "tcp6only"))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        if kind == socket.SOCK_STREAM:
            sock.listen(128)
        sockets.append(sock)
        names.append(name)
    return sockets, names


def place(sockets: list[socket.socket]) -> None:
    """The sockets at fds 3, 4, ... (inheritable), as sd_listen_fds(3) wants them."""
    parked = [fcntl.fcntl(s.fileno(), fcntl.F_DUPFD_CLOEXEC, 100) for s in sockets]
    for i, fd in enumerate(parked):
        os.dup2(fd, 3 + i, inheritable=True)


def environment(sockets: list[socket.socket], names: list[str], pid: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(LISTEN_FDS=str(len(sockets)), LISTEN_PID=str(pid), LISTEN_FDNAMES=":".join(names))
    return env


def wait_for(path: str) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"activate.py: no {path} in 60 s")
        time.sleep(0.02)


def supervise(
    sockets: list[socket.socket],
    names: list[str],
    command: list[str],
    crash: str,
    kill: float,
    generations: int,
    pause: str,
) -> None:
    running = {"child": 0, "stop": False}

    def on_term(signum: int, frame: object) -> None:
        running["stop"] = True
        if running["child"]:
            try:
                os.kill(running["child"], signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, on_term)
    generation = 0
    while not running["stop"] and generation < generations:
        generation += 1
        child = os.fork()
        if child == 0:
            place(sockets)
            env = environment(sockets, names, os.getpid())
            if generation == 1 and crash:
                env["ALFWRAPPER_CRASH_AT"] = crash
            os.execvpe(command[0], command, env)
        running["child"] = child
        if generation == 1 and kill >= 0:
            time.sleep(kill)
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, status = os.waitpid(child, 0)
        running["child"] = 0
        print(f"generation {generation} exited {status}", flush=True)
        if generation == 1 and pause:
            wait_for(pause)
        time.sleep(0.1)  # RestartSec=, as systemd's default
    while not running["stop"]:  # the sockets stay, as a socket unit's do
        signal.pause()


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    options, command = args[:split], args[split + 1 :]
    go = options[options.index("--go") + 1]
    crash = options[options.index("--crash") + 1] if "--crash" in options else ""
    kill = float(options[options.index("--kill-after") + 1]) if "--kill-after" in options else -1
    generations = (
        int(options[options.index("--generations") + 1]) if "--generations" in options else 1 << 30
    )
    pause = options[options.index("--pause") + 1] if "--pause" in options else ""
    specs = [o for o in options if o.startswith(("tcp:", "udp:", "tcp6only:"))]
    sockets, names = make_sockets(specs)
    print("listening", flush=True)
    wait_for(go)
    if "--supervise" in options:
        supervise(sockets, names, command, crash, kill, generations, pause)
        return
    place(sockets)
    os.execvpe(command[0], command, environment(sockets, names, os.getpid()))


if __name__ == "__main__":
    main()
