"""Interface names to indexes, and the watcher that keeps the filter following the names.

An interface rule names an interface, but a packet carries only an index,
and an index changes when, say, a VPN's wg0 is deleted and created again.
So before exec the wrapper starts one small watcher process (double-forked:
it is not the application's child, and it stays in the service's cgroup).
It listens to netlink link events in the service's network namespace:

- a link with an allowed name appears (created or renamed): its index enters
  the map;
- a link is deleted or renamed away: its index leaves the map, so another
  interface that later reuses the index is not allowed by mistake.

It resynchronises from a full dump on start and whenever netlink reports
lost events, and exits when the application does (a pidfd, Linux 5.3).
"""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from alfwrapper import privileges
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


def start_watcher(
    names: Iterable[str], update: Callable[[dict[int, str]], None], keep_fds: Iterable[int]
) -> None:
    """Fork the watcher; returns in the wrapper at once.

    ``update`` receives the full set {index: name} of allowed interfaces
    whenever it changes.  ``keep_fds`` are the map fds it needs; the
    watcher closes every other descriptor, listening sockets included.
    """
    wanted = set(names)
    app_pid = os.getpid()
    pidfd = os.pidfd_open(app_pid)
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child:
        os.close(pidfd)
        os.close(ready_w)
        os.waitpid(child, 0)
        # The watcher says "ready" after its first full dump; until then the
        # interface rules would not follow renames, so do not start without it.
        ready, _, _ = select.select([ready_r], [], [], 10)
        word = os.read(ready_r, 16) if ready else b""
        os.close(ready_r)
        if word != b"ready":
            raise AlfError(
                "starting the interface watcher",
                "it did not report ready",
                "run with -v; check that netlink works here",
                EX_OSERR,
            )
        return
    try:
        os.close(ready_r)
        os.setsid()
        if os.fork():
            os._exit(0)
        keep = {0, 1, 2, pidfd, ready_w, *keep_fds}
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        privileges.drop_privileges(keep=1 << privileges.CAP_BPF)  # map updates need it
        _watch(wanted, update, pidfd, ready_w)
        os._exit(0)
    except BaseException as err:  # never return into the wrapper's code
        print(
            f"alfwrapper: interface watcher: {err} (interface rules no longer follow "
            "renames; restart the service)",
            file=sys.stderr,
        )
        os._exit(1)


def _watch(
    wanted: set[str], update: Callable[[dict[int, str]], None], pidfd: int, ready_w: int
) -> None:
    from pyroute2 import IPRoute  # noqa: PLC0415

    with IPRoute() as ipr:
        ipr.bind(groups=RTMGRP_LINK)
        current: dict[int, str] = {}

        def publish(state: dict[int, str]) -> None:
            nonlocal current
            if state != current:
                update(state)
                current = dict(state)

        # Events between the wrapper's first look and bind() are caught by this dump.
        publish({i: n for n, i in link_names().items() if n in wanted})
        os.write(ready_w, b"ready")
        os.close(ready_w)
        while True:
            ready, _, _ = select.select([ipr.fileno(), pidfd], [], [])
            if pidfd in ready:
                return
            state = dict(current)
            try:
                messages: list[Any] = list(ipr.get())
            except OSError:  # ENOBUFS: events were lost; start from a full dump
                publish({i: n for n, i in link_names().items() if n in wanted})
                continue
            for msg in messages:
                index, name = msg["index"], msg.get_attr("IFLA_IFNAME")
                if msg["event"] == "RTM_NEWLINK" and name in wanted:
                    state[index] = name
                else:  # deleted, or a new name that is not allowed
                    state.pop(index, None)
            publish(state)
