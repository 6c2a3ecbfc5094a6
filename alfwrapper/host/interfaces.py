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
those sockets is dropped (interfaces.c).  And it renews their iface_lease
every second: stopped (SIGSTOP, by an application that runs as the same user
where no other can be had), it stops renewing, and every packet is dropped
too.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence

from alfwrapper.errors import EX_CONFIG, EX_OSERR, AlfError
from alfwrapper.host import bpf_calls, companion
from alfwrapper.record import Record

# interfaces.c's iface_lease: the watcher renews it every second for LEASE_NS ahead;
# a start gives it START_LEASE_NS, to cover the time until its watcher runs.
LEASE_NS = 5_000_000_000
START_LEASE_NS = 120_000_000_000


def renew_lease(lease_fd: int, ahead_ns: int) -> None:
    """iface_lease's one entry: now (CLOCK_MONOTONIC, the filter's clock) + ahead."""
    bpf_calls.map_update(
        lease_fd, struct.pack("=I", 0), struct.pack("=Q", time.monotonic_ns() + ahead_ns)
    )


def link_names() -> dict[str, int]:
    """Every interface in this network namespace: name -> index."""
    from pyroute2 import IPRoute  # noqa: PLC0415

    with IPRoute() as ipr:
        return {link.get_attr("IFLA_IFNAME"): link["index"] for link in ipr.get_links()}


def local_addresses() -> list[tuple[int, bytes]]:
    """Every address of this network namespace's interfaces: (4 or 6, its bytes)."""
    from pyroute2 import IPRoute  # noqa: PLC0415

    found = []
    with IPRoute() as ipr:
        for message in ipr.get_addr():
            family = 4 if message["family"] == socket.AF_INET else 6
            text = message.get_attr("IFA_LOCAL") or message.get_attr("IFA_ADDRESS")
            if text:
                found.append((family, socket.inet_pton(message["family"], text)))
    return found


UPPER_KINDS = ("vlan", "macvlan", "macvtap", "ipvlan", "ipvtap")


def stacked(index: int) -> str:
    """What the stack would take this interface's frames as, if not its own: its master
    (a bridge or a bond it is a port of), or an upper device (a VLAN on it); "" if
    neither."""
    from pyroute2 import IPRoute  # noqa: PLC0415

    with IPRoute() as ipr:
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            if link["index"] == index and link.get_attr("IFLA_MASTER"):
                return f"a port of interface index {link.get_attr('IFLA_MASTER')}"
            info = link.get_attr("IFLA_LINKINFO")
            kind = info.get_attr("IFLA_INFO_KIND") if info else None
            if link.get_attr("IFLA_LINK") == index and kind in UPPER_KINDS:
                return f"the lower device of {kind} {name}"
    return ""


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


class WatchedMap(Record):
    """One program's iface_allowed map, the names it allows, its iface_alive array and
    its iface_lease (interfaces.c)."""

    allowed_fd: int
    names: tuple[str, ...]
    alive_fd: int
    lease_fd: int


def start_watcher(maps: Sequence[WatchedMap], service: str, app_pid: int = 0) -> int:
    """Start the watcher for these maps; returns its pid once it reports ready (after its
    first full dump: until then the rules would not follow renames).

    ``service`` names the service in the watcher's command line and messages;
    the watcher exits with the process ``app_pid`` (default: this one, which
    becomes the application).
    """
    watched = (f"{m.allowed_fd}:{m.alive_fd}:{m.lease_fd}:{','.join(m.names)}" for m in maps)
    args = [service, *watched]
    keep = [fd for m in maps for fd in (m.allowed_fd, m.alive_fd, m.lease_fd)]
    return companion.spawn("alfwrapper.lifecycle.watcher", "interface watcher", args, keep, app_pid)
