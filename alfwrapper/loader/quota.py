"""Who asks the loader (SO_PEERCRED) and what they may have: the per-user limits, and the
ledger of programs and map memory of live sockets where the kernel does not count them
(cgroups.py)."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alfwrapper import state
from alfwrapper.errors import (
    EX_NOPERM,
    EX_USAGE,
    AlfError,
)
from alfwrapper.host import cgroups
from alfwrapper.record import Record, replace

DEFAULT_PROGRAMS = 64


DEFAULT_MAP_MEMORY = 1024 << 20  # a million rules: ~500 MiB while compiling


class Limits(Record):
    programs: int = DEFAULT_PROGRAMS
    map_memory: int = DEFAULT_MAP_MEMORY
    ledger: str = "/run/alfwrapper-loader"
    pins: Path = state.USERS_ROOT  # where the loader sees the users' tree
    memory: cgroups.UserMemory | None = None  # the kernel counts map_memory, if set


class Caller(Record):
    pid: int
    uid: int
    gid: int
    pins: Path = state.USERS_ROOT
    # Whose share this uid draws on (person.py): the owner of the subordinate range
    # that holds it; None: the uid's own.  Workers, waiting and quota count by it.
    owner: int | None = None
    # The cookies pinned in the trees of the person's other uids, read before the
    # request is confined (Landlock lets it read its own tree only afterwards).
    kin_pinned: frozenset[str] = frozenset()

    @property
    def store(self) -> state.Store:
        return state.Store(state.user_base(self.uid, self.pins), self.pins)

    @property
    def person(self) -> int:
        return self.uid if self.owner is None else self.owner


def peer(
    conn: socket.socket, pins: Path = state.USERS_ROOT, person: Callable[[int], int] | None = None
) -> Caller:
    """The caller, and the person it counts as (resolved once, here)."""
    # struct ucred: pid_t, then uid_t and gid_t, which are unsigned (uids past 2**31 exist:
    # subordinate ranges reach 2**32 - 2).
    pid, uid, gid = struct.unpack("i2I", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return Caller(pid, uid, gid, pins, person(uid) if person is not None else None)


def with_kin(who: Caller, person: Callable[[int], int]) -> Caller:
    """The caller with the pinned cookies of the person's other uids' trees: one
    person's quota holds the sockets of all the uids they act as.  The users' tree has
    a folder per uid that ever asked: listed once per request."""
    pinned: set[str] = set()
    try:
        names = os.listdir(who.pins)
    except OSError:
        return who
    for name in names:
        if not name.isdigit() or int(name) == who.uid or person(int(name)) != who.person:
            continue
        tree = state.Store(state.user_base(int(name), who.pins), who.pins)
        for service in services_of(tree):
            try:
                pinned |= {str(w.cookie) for w in tree.sockets_of(service)}
            except AlfError:
                continue
    return replace(who, kin_pinned=frozenset(pinned))


def quota_reached(limits: Limits) -> AlfError:
    return AlfError(
        "loader quota",
        f"your filters and this request would take more than the {limits.map_memory >> 20} "
        "MiB of memory allowed",
        "use fewer rules, stop a service, or ask the administrator to raise --max-map-memory",
        EX_NOPERM,
    )


def no_service(service: str) -> None:
    raise AlfError(
        f"service {service}",
        "has no pinned state of yours",
        "is it running behind alfwrapper? `alfwrapper status` lists services",
        EX_USAGE,
    )


def services_of(tree: state.Store) -> list[str]:
    try:
        return tree.services()
    except AlfError:
        return []


# Per-user accounting: the programs and map memory handed out whose sockets exist.


def _ledger_path(who: Caller, limits: Limits) -> str:
    return os.path.join(limits.ledger, f"{who.person}.json")  # one per person


def _ledger(who: Caller, limits: Limits) -> dict[str, int]:
    try:
        with open(_ledger_path(who, limits), encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            ledger = json.load(f)
    except (OSError, ValueError):
        return {}
    return ledger if isinstance(ledger, dict) else {}


def _usage(who: Caller, ledger: dict[str, int]) -> dict[str, int]:
    """cookie -> map bytes, for the person's programs whose sockets still exist (in the
    loader's network namespace, or with pinned state in the tree of one of their uids)."""
    tree = who.store
    pinned = set(who.kin_pinned)
    for service in services_of(tree):
        try:
            pinned |= {str(w.cookie) for w in tree.sockets_of(service)}
        except AlfError:
            continue
    live = {str(c) for c in state.live_cookies()} | pinned
    usage = {c: int(n) for c, n in ledger.items() if c in live}
    return usage | {c: usage.get(c, 0) for c in pinned}


def _over_quota(usage: dict[str, int], limits: Limits, programs: int, size: int) -> AlfError | None:
    if len(usage) + programs > limits.programs:
        return AlfError(
            "loader quota",
            f"you have {len(usage)} filtered socket(s), and at most {limits.programs} are allowed",
            "stop a service, or ask the administrator to raise --max-programs",
            EX_NOPERM,
        )
    used = sum(usage.values()) + size
    if used > limits.map_memory:
        return AlfError(
            "loader quota",
            f"your filters' maps would take {used / 2**20:.1f} MiB, and at most "
            f"{limits.map_memory >> 20} MiB are allowed",
            "use fewer rules, or ask the administrator to raise --max-map-memory",
            EX_NOPERM,
        )
    return None


def check_quota(who: Caller, limits: Limits, extra_programs: int) -> None:
    """Before the work: is there room for one more socket at all?"""
    error = _over_quota(_usage(who, _ledger(who, limits)), limits, extra_programs, 0)
    if error is not None:
        raise error


def open_ledger(who: Caller, limits: Limits) -> Any:
    os.makedirs(limits.ledger, mode=0o700, exist_ok=True)
    fd = os.open(_ledger_path(who, limits), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "r+", encoding="utf-8")


def record_program(who: Caller, limits: Limits, f: Any, cookie: int, size: int) -> None:
    """Count this socket's program against the user's quota, or refuse it (before the
    fd is handed out: the program then goes away with this process)."""
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            ledger = json.loads(f.read() or "{}")
        except ValueError:
            ledger = {}
        usage = _usage(who, ledger if isinstance(ledger, dict) else {})
        usage.pop(str(cookie), None)  # a reload replaces the socket's program
        error = _over_quota(usage, limits, 1, size)
        if error is not None:
            raise error
        usage[str(cookie)] = size
        f.seek(0)
        f.truncate()
        json.dump(usage, f)
