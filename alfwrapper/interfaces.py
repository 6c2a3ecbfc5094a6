"""Interface names to indexes, and starting the watcher that keeps the filter following names.

An interface rule names an interface, but a packet carries only an index,
and an index changes when, say, a VPN's wg0 is deleted and created again.
So before exec the wrapper starts one small watcher process (watcher.py):
double-forked, so it is not the application's child, and it stays in the
service's cgroup.  It is a fresh interpreter that never loads BCC, holds
only the maps it updates, and, when the wrapper runs as root, runs under
its own user (WATCHER_USER, else nobody), so the application cannot signal
or trace it.  It also holds the only reference to the programs' iface_alive
arrays: if it dies anyway, the kernel empties them and every packet on
those sockets is dropped (interfaces.c).
"""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from alfwrapper.errors import EX_CONFIG, EX_OSERR, AlfError

RTMGRP_LINK = 1


def link_names() -> dict[str, int]:
    """Every interface in this network namespace: name -> index."""
    from pyroute2 import IPRoute  # noqa: PLC0415

    with IPRoute() as ipr:
        return {link.get_attr("IFLA_IFNAME"): link["index"] for link in ipr.get_links()}


def link_index(name: str) -> int | None:
    """One interface's index, or None; for --set values (a missing name is no error here)."""
    try:
        return link_names().get(name)
    except (OSError, ImportError):
        return None


def resolve(names: Sequence[str]) -> dict[str, int]:
    """Indexes of the named interfaces; an unknown name is an error at start."""
    try:
        links = link_names()
    except OSError as err:
        raise AlfError(
            "listing interfaces (netlink)",
            err.strerror or str(err),
            "run `alfwrapper doctor`",
            EX_OSERR,
        ) from None
    missing = [n for n in names if n not in links]
    if missing:
        raise AlfError(
            f"--interface {missing[0]}",
            "no such interface here",
            f"interfaces in this namespace: {', '.join(sorted(links))}",
            EX_CONFIG,
        )
    return {n: links[n] for n in names}


@dataclass(frozen=True)
class WatchedMap:
    """One program's iface_allowed map, the names it allows, and its iface_alive array."""

    allowed_fd: int
    names: tuple[str, ...]
    alive_fd: int


READY_SECONDS = 20.0


def start_watcher(maps: Sequence[WatchedMap], label: str, app_pid: int = 0) -> int:
    """Start the watcher for these maps; returns its pid once it reports ready.

    ``label`` names the service in the watcher's command line and messages;
    the watcher exits with the process ``app_pid`` (default: this one, which
    becomes the application).
    """
    app_pid = app_pid or os.getpid()
    pidfd = os.pidfd_open(app_pid)
    ready_r, ready_w = os.pipe()
    pid_r, pid_w = os.pipe()
    child = os.fork()
    if child:
        os.close(pidfd)
        os.close(ready_w)
        os.close(pid_w)
        os.waitpid(child, 0)
        # The watcher says "ready" after its first full dump; until then the
        # interface rules would not follow renames, so do not start without it.
        ready, _, _ = select.select([ready_r], [], [], READY_SECONDS)
        word = os.read(ready_r, 16) if ready else b""
        watcher = int(os.read(pid_r, 16) or b"0")
        os.close(ready_r)
        os.close(pid_r)
        if word != b"ready":
            raise AlfError(
                "starting the interface watcher",
                "it did not report ready",
                "its own message above says why; check that netlink works here",
                EX_OSERR,
            )
        return watcher
    try:
        os.close(ready_r)
        os.close(pid_r)
        os.setsid()
        if os.fork():
            os._exit(0)
        os.write(pid_w, str(os.getpid()).encode())
        os.close(pid_w)
        # Its messages belong in the application's log: the wrapper's stderr is the
        # application's; another caller's (`alfwrapper reload`) is not to be held open.
        if os.path.exists(f"/proc/{app_pid}/fd/2"):
            try:
                log = os.open(f"/proc/{app_pid}/fd/2", os.O_WRONLY | os.O_APPEND)
            except OSError:
                log = os.open(os.devnull, os.O_WRONLY)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        keep = [pidfd, ready_w]
        argv = [sys.executable, "-m", "alfwrapper.watcher", label, str(pidfd), str(ready_w)]
        for m in maps:
            argv.append(f"{m.allowed_fd}:{m.alive_fd}:{','.join(m.names)}")
            keep += [m.allowed_fd, m.alive_fd]
        for fd in keep:
            os.set_inheritable(fd, True)
        # Nothing else of the wrapper's: no listening socket, no other map.
        for name in os.listdir("/proc/self/fd"):
            if int(name) > 2 and int(name) not in keep:
                try:
                    os.close(int(name))
                except OSError:
                    pass  # the listing's own fd
        os.execv(sys.executable, argv)
    except BaseException as err:  # never return into the wrapper's code
        print(f"alfwrapper: starting the interface watcher: {err}", file=sys.stderr)
    os._exit(1)
