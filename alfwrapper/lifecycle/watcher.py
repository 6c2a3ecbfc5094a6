"""The interface watcher process: keeps iface_allowed following interface names.

Started by interfaces.start_watcher as ``python3 -m alfwrapper.lifecycle.watcher SERVICE
PIDFD READYFD ALLOWED:ALIVE:LEASE:NAME,NAME ...``.  It listens to netlink link
events in the service's network namespace:

- a link with an allowed name appears (created or renamed): its index enters
  the map;
- a link is deleted or renamed away: its index leaves the map, so another
  interface that later reuses the index is not allowed by mistake.

It resynchronises from a full dump on start and whenever netlink reports
lost events, renews every program's iface_lease every second (a watcher that
is stopped stops renewing, and the filter then drops every packet:
interfaces.c), and exits when the application does (its pidfd, Linux 5.3).
It never loads BCC: the maps are updated through libbpf (host/bpf_calls.py).
Started as root, it first moves to its own user, so that the application
(root or not, with no capabilities) cannot signal it, and makes itself
undumpable, so that no process of its own user can trace it.
"""

from __future__ import annotations

import os
import pwd
import select
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any

from alfwrapper.host import bpf_calls, privileges
from alfwrapper.host.capabilities import CAP_BPF, CAP_SETGID, CAP_SETUID
from alfwrapper.host.interfaces import LEASE_NS, renew_lease

WATCHER_USERS = ("alfwrapper", "nobody")  # the first that exists
RENEW_SECONDS = 1.0  # the lease is renewed this often, LEASE_NS ahead
_U32 = struct.Struct("=I")


class Target:
    """One program's map: the names it allows, and what it holds now."""

    def __init__(self, spec: str) -> None:
        allowed, alive, lease, names = spec.split(":", 3)
        self.map_fd = int(allowed)
        self.alive_fd = int(alive)  # held open, never used: its life is the filter's
        self.lease_fd = int(lease)
        self.names = frozenset(names.split(","))

    def renew(self) -> None:
        renew_lease(self.lease_fd, LEASE_NS)

    def publish(self, state: dict[int, str]) -> None:
        """Make the map hold exactly the allowed indexes: additions first, then removals."""
        wanted = {index for index, name in state.items() if name in self.names}
        for index in wanted:
            bpf_calls.map_update(self.map_fd, _U32.pack(index), _U32.pack(1))
        for key in bpf_calls.map_keys(self.map_fd, _U32.size):
            if _U32.unpack(key)[0] not in wanted:
                bpf_calls.map_delete(self.map_fd, key)


def become_watcher_user() -> None:
    """As root: switch to the watcher's own user, keeping only CAP_BPF (kernels before
    6.5 check it for map updates too).  Without the capabilities to switch (a
    service's own user, or uid 0 with a bounded capability set, as in a unit
    with CapabilityBoundingSet=), stay that user, with CAP_BPF alone."""
    privileges.set_dumpable(False)
    switch = (1 << CAP_SETUID) | (1 << CAP_SETGID)
    if os.geteuid() != 0 or privileges.permitted() & switch != switch:
        privileges.drop_privileges(keep=1 << CAP_BPF)
        return
    for name in WATCHER_USERS:
        try:
            user = pwd.getpwnam(name)
            break
        except KeyError:
            continue
    else:
        raise OSError(0, f"none of the users {', '.join(WATCHER_USERS)} exists")
    privileges.switch_user(user.pw_uid, user.pw_gid, keep=1 << CAP_BPF)
    privileges.set_dumpable(False)  # a change of credentials resets it


def link_names(ipr: Any) -> dict[str, int]:
    return {link.get_attr("IFLA_IFNAME"): link["index"] for link in ipr.get_links()}


def watch(targets: Sequence[Target], pidfd: int, ready_w: int, events: Any, dump: Any) -> None:  # noqa: C901
    wanted = frozenset().union(*(t.names for t in targets))
    current: dict[int, str] = {}

    def publish(state: dict[int, str]) -> None:
        nonlocal current
        if state != current:
            for target in targets:
                target.publish(state)
            current = dict(state)

    with events, dump:
        # Events between the wrapper's first look and bind() are caught by this dump.
        publish({i: n for n, i in link_names(dump).items() if n in wanted})
        for target in targets:
            target.renew()
        os.write(ready_w, b"ready")
        os.close(ready_w)
        renewed = time.monotonic()
        while True:
            ready, _, _ = select.select([events.fileno(), pidfd], [], [], RENEW_SECONDS)
            if pidfd in ready:
                return
            if time.monotonic() - renewed >= RENEW_SECONDS:
                for target in targets:
                    target.renew()
                renewed = time.monotonic()
            if events.fileno() not in ready:
                continue
            state = dict(current)
            try:
                messages: list[Any] = list(events.get())
            except OSError:  # ENOBUFS: events were lost; start from a full dump
                publish({i: n for n, i in link_names(dump).items() if n in wanted})
                continue
            for msg in messages:
                index, name = msg["index"], msg.get_attr("IFLA_IFNAME")
                if msg["event"] == "RTM_NEWLINK" and name in wanted:
                    state[index] = name
                else:  # deleted, or a new name that is not allowed
                    state.pop(index, None)
            publish(state)


def main(argv: Sequence[str]) -> int:
    service, pidfd, ready_w = argv[0], int(argv[1]), int(argv[2])
    try:
        from alfwrapper.host.companion import name_process  # noqa: PLC0415

        name_process(f"alfwrapper-watch {service}")
        targets = [Target(spec) for spec in argv[3:]]
        # Everything read from files before giving up root: the checkout or the
        # installed package may not be readable by the watcher's own user.
        from pyroute2 import IPRoute  # noqa: PLC0415
        from pyroute2.netlink.rtnl import RTMGRP_LINK  # noqa: PLC0415

        bpf_calls.libbpf()
        events, dump = IPRoute(), IPRoute()
        events.bind(groups=RTMGRP_LINK)
        link_names(dump)  # loads what decoding needs
        become_watcher_user()
        watch(targets, pidfd, ready_w, events, dump)
        return 0
    except Exception as err:  # noqa: BLE001  (one line, never a traceback)
        print(
            f"alfwrapper: interface watcher of {service}: {err} (its sockets now drop every "
            "packet: restart the service)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
