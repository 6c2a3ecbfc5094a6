"""Bans that cut live connections: once a runtime deny or a deny set's new entries are in
force, the TCP connections from those addresses to the sockets that now deny them are
reset (host/sockdiag.py: SOCK_DESTROY), in each service's network namespace.

An accepted connection inherits its listener's filter, so from the ban on its packets
are dropped: without a reset it hangs until TCP gives up, holding a worker of the
daemon.  The ban comes first and stays whatever happens here: what could not be cut
(no CAP_NET_ADMIN, a namespace gone, a kernel without SOCK_DESTROY) is said, and
never undoes or fails the ban.  UDP has no connection to end.
"""

from __future__ import annotations

import errno
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence

from alfwrapper import state
from alfwrapper.bpf.parts import RUNTIME_DENY
from alfwrapper.errors import AlfError
from alfwrapper.host import sockdiag
from alfwrapper.host.netns import netns as enter_netns
from alfwrapper.policy.prefixes import Prefix, parse_prefix
from alfwrapper.record import Record

# The work is bounded: the TCP sockets read in one namespace and family, and the time
# spent on one ban in all.
MOST_SOCKETS = 1 << 16
SECONDS = 5.0

Rules = tuple[tuple[int, int, int, int], ...]  # runtime rules: (family, value, length, verdict)


class Target(Record):
    """A live TCP socket of a service whose program now denies the banned prefixes."""

    title: str  # how lines name it: SERVICE NAME (tcp ADDRESS:PORT)
    pid: int  # its application, whose network namespace it is in
    netns: int  # that namespace's cookie
    address: str  # the address it is bound to
    port: int
    # For a runtime deny, the socket's runtime rules (the most specific decides, and an
    # allow nested in the deny keeps passing); for a deny set, none: a deny set drops
    # whatever a runtime allow says (sets.c).
    runtime: Rules = ()


class Cut(Record, frozen=False):
    """What a ban cut (one line per socket with resets) and what it could not."""

    done: list[str]
    problems: list[str]


def covers(prefix: Prefix, address: Prefix) -> bool:
    """Is the address (a /32 or /128) in the prefix?"""
    if prefix.family != address.family:
        return False
    shift = (32 if address.family == 4 else 128) - prefix.length
    return address.value >> shift == prefix.value >> shift


def still_denied(address: Prefix, runtime: Rules) -> bool:
    """Does the most specific of the socket's runtime rules that covers the address
    deny it (runtime.c), or do none cover it (a deny set's ban)?"""
    covering = [
        (length, verdict)
        for family, value, length, verdict in runtime
        if covers(Prefix(family, value, length), address)
    ]
    return not covering or max(covering)[1] == RUNTIME_DENY


def bound_to(target: Target, local: str) -> bool:
    """Is a connection with this local address one the target's listener accepted?"""
    if target.address in ("", "0.0.0.0", "::"):
        return True
    return parse_prefix(local) == parse_prefix(target.address)


class Banned:
    """The banned prefixes, by family and length: whether an address is in one of them
    costs a lookup per length in use (a bouncer's resync hands over every ban)."""

    def __init__(self, prefixes: Sequence[Prefix]) -> None:
        self.by_length: dict[tuple[int, int], set[int]] = {}
        for p in prefixes:
            self.by_length.setdefault((p.family, p.length), set()).add(p.value)

    def holds(self, address: Prefix) -> bool:
        width = 32 if address.family == 4 else 128
        return any(
            address.value >> (width - length) << (width - length) in values
            for (family, length), values in self.by_length.items()
            if family == address.family
        )


def choose(
    found: Sequence[sockdiag.Connection], target: Target, banned: Banned
) -> list[sockdiag.Connection]:
    """The connections on the target's port whose peer the ban now denies there (an
    IPv4-mapped peer of an IPv6 socket judged as IPv4, as the filter sees it)."""
    chosen = []
    for connection in found:
        if connection.port != target.port or not bound_to(target, connection.local):
            continue
        peer = parse_prefix(connection.peer)
        if banned.holds(peer) and still_denied(peer, target.runtime):
            chosen.append(connection)
    return chosen


def families(address: str) -> tuple[int, ...]:
    """The sock_diag families a socket bound to this address has connections in."""
    return (socket.AF_INET,) if ":" not in address else (socket.AF_INET6,)


def _reset(targets: Sequence[Target], banned: Banned, deadline: float) -> list[str]:
    """Reset the chosen connections of targets of this namespace; a line per target."""
    lines = []
    for target in targets:
        cut = 0
        for family in families(target.address):
            for connection in choose(
                sockdiag.tcp_connections(family, target.port, MOST_SOCKETS), target, banned
            ):
                if time.monotonic() > deadline:
                    raise TimeoutError(errno.ETIMEDOUT, f"not done in {SECONDS:g} s")
                try:
                    sockdiag.destroy(connection)
                    cut += 1
                except FileNotFoundError:
                    pass  # closed meanwhile
        if cut:
            lines.append(f"{target.title}: reset {cut} connection(s) from the banned addresses")
    return lines


def _in_netns(pid: int, cookie: int, work: Callable[[], list[str]]) -> list[str]:
    """Do ``work`` in the network namespace of ``pid`` (checked by its cookie), in a
    thread of its own, so that this process's namespace never changes."""
    if cookie == state.netns_cookie():
        return work()
    result: list[list[str]] = []
    failed: list[BaseException] = []

    def inside() -> None:
        try:
            with enter_netns(f"/proc/{pid}/ns/net"):
                if state.netns_cookie() != cookie:
                    raise OSError(errno.ESRCH, f"pid {pid} left the service's network namespace")
                result.append(work())
        except (OSError, AlfError) as err:
            failed.append(err)

    thread = threading.Thread(target=inside, name="alfwrapper-cut", daemon=True)
    thread.start()
    thread.join(SECONDS)
    if failed:
        raise failed[0]
    if not result:
        raise TimeoutError(errno.ETIMEDOUT, f"not done in {SECONDS:g} s")
    return result[0]


def why(err: BaseException) -> str:
    """Why a cut failed, and what would make it work."""
    code = getattr(err, "errno", None)
    if code == errno.EPERM:
        return (
            "resetting needs CAP_NET_ADMIN, and entering another network namespace "
            "CAP_SYS_ADMIN (run as root)"
        )
    if code == errno.EOPNOTSUPP:
        return "this kernel cannot destroy sockets (CONFIG_INET_DIAG_DESTROY)"
    if code in (errno.ENOENT, errno.ESRCH):
        return "the service's network namespace is gone"
    text = err.why if isinstance(err, AlfError) else getattr(err, "strerror", None) or str(err)
    return str(text)


def _work(targets: Sequence[Target], banned: Banned, deadline: float) -> Callable[[], list[str]]:
    return lambda: _reset(targets, banned, deadline)


def cut(targets: Sequence[Target], banned: Sequence[Prefix], what: str) -> Cut:
    """Reset the TCP connections from ``banned`` to these sockets that their programs now
    deny.  ``what`` names the ban in the lines said about what was not cut."""
    report = Cut([], [])
    if not targets:
        return report
    deadline = time.monotonic() + SECONDS
    index = Banned(banned)
    places: dict[tuple[int, int], list[Target]] = {}
    for target in targets:
        places.setdefault((target.pid, target.netns), []).append(target)
    for (pid, cookie), here in places.items():
        try:
            report.done += _in_netns(pid, cookie, _work(here, index, deadline))
        except (OSError, AlfError) as err:
            names = ", ".join(t.title for t in here)
            report.problems.append(
                f"{what} is in force, but the connections to {names} were not reset: {why(err)}"
            )
    return report


def title(service: str, meta: dict[str, object]) -> str:
    """How lines name a socket: SERVICE NAME (tcp ADDRESS:PORT), as lifecycle/service.py's."""
    address = str(meta.get("address", "?"))
    host = f"[{address}]" if ":" in address else address
    return f"{service} {meta.get('name', '?')} (tcp {host}:{meta.get('port', '?')})"


def target_of(meta: dict[str, object], title: str, runtime: Rules = ()) -> Target | None:
    """A socket's Target, from its meta, if it is a live TCP socket."""
    pid, cookie, port = meta.get("pid"), meta.get("netns"), meta.get("port")
    if meta.get("protocol") != "tcp" or not isinstance(port, int) or not state.alive(pid):
        return None
    assert isinstance(pid, int)
    return Target(title, pid, int(str(cookie or 0)), str(meta.get("address", "")), port, runtime)


def denying_set(name: str) -> tuple[list[Target], list[str]]:
    """The live TCP sockets of every service (root's, and users' kept by the loader)
    whose program denies set ``name``; and the trees that could not be read."""
    stores = [state.Store(state.ROOT), *state.user_stores()]
    found, unread = [], []
    for store in stores:
        try:
            services = store.services() if store.base.is_dir() else []
            for service in services:
                for where in store.sockets_of(service):
                    meta = state.read_meta(where)
                    names = meta.get("deny_sets")
                    if isinstance(names, list) and name in names:
                        target = target_of(meta, title(service, meta))
                        found += [target] if target is not None else []
        except (OSError, AlfError) as err:
            unread.append(f"{store.base}: {why(err)}")
    return found, unread


def cut_for_set(name: str, banned: Sequence[Prefix]) -> Cut:
    """After `set add NAME` (or the bouncer's new bans): reset the connections from
    ``banned`` to every live socket that denies the set."""
    if not banned:
        return Cut([], [])
    targets, unread = denying_set(name)
    what = f"set {name}'s new entries"
    report = cut(targets, banned, what)
    report.problems += [f"{what} are in force, but {u}" for u in unread]
    return report


def say_problems(report: Cut) -> None:
    """What was not cut, a line each, on stderr (the ban itself is in force)."""
    for line in report.problems:
        print(f"alfwrapper: note: {line}", file=sys.stderr, flush=True)
