"""A socket's runtime rules (live allow and deny): read, changed one at a time, and
handed on to the sockets of its name across restarts."""

from __future__ import annotations

import os
import struct

from alfwrapper.bpf.parts import RUNTIME_KEY
from alfwrapper.errors import AlfError
from alfwrapper.host import bpf_calls
from alfwrapper.host.faults import crash_point
from alfwrapper.state.inuse import Pins, open_pin, pins_in_use
from alfwrapper.state.meta import read_meta
from alfwrapper.state.places import SocketState
from alfwrapper.state.trust import failure

_U32 = struct.Struct("=I")


def runtime_key(family: int, value: int, length: int) -> bytes:
    """A runtime rule as struct alf_runtime_key (parts.RUNTIME_KEY)."""
    width = 32 if family == 4 else 128
    return RUNTIME_KEY.pack(
        32 + length, family, b"", value.to_bytes(width // 8, "big").ljust(16, b"\0")
    )


def runtime_rules(where: SocketState) -> list[tuple[int, int, int, int]]:
    """The socket's runtime rules: (family, value, length, verdict)."""
    fd = open_pin(where, "runtime")
    try:
        out = []
        for key in bpf_calls.map_keys(fd, RUNTIME_KEY.size):
            length, family, _, raw = RUNTIME_KEY.unpack(key)
            verdict = bpf_calls.map_lookup(fd, key, 1)
            width = 32 if family == 4 else 128
            value = int.from_bytes(raw[: width // 8], "big")
            out.append((family, value, length - 32, verdict[0] if verdict else 0))
        return out
    finally:
        os.close(fd)


def set_runtime(where: SocketState, key: bytes, verdict: int | None) -> bool:
    """Add (verdict 1 allow, 2 deny) or remove (None) one runtime rule.  Returns whether
    anything changed.  Touches one map entry, and the "may have rules" flag the filter
    checks first: set on the first rule, never cleared (clearing it on a revoke could
    race with a deny made at the same time)."""
    fd, flag = open_pin(where, "runtime"), open_pin(where, "runtime_count")
    try:
        if verdict is None:
            return bpf_calls.map_delete(fd, key)
        old = bpf_calls.map_lookup(fd, key, 1)
        # The flag first: a kill between the two leaves a flag with no rule (a trie
        # walk for nothing), never a rule the filter does not look at.
        bpf_calls.map_update(flag, _U32.pack(0), _U32.pack(1))
        crash_point("rule-flagged")
        bpf_calls.map_update(fd, key, bytes([verdict]))
        return old != bytes([verdict])
    except OSError as err:
        raise failure(f"changing the runtime rules of {where.dir}", err) from None
    finally:
        os.close(fd)
        os.close(flag)


def holds_runtime_rules(where: SocketState, tree: Pins | None = None) -> bool:
    """Does the socket's runtime map hold any rule (one key looked up, not all)?"""
    tree = tree or pins_in_use()
    if not tree.has_pin(where, "runtime"):
        return False
    try:
        fd = tree.open_pin(where, "runtime")
    except AlfError:
        return False  # removed meanwhile
    try:
        return bpf_calls.map_first_key(fd, RUNTIME_KEY.size) is not None
    finally:
        os.close(fd)


def inherit_runtime(where: SocketState, name: str) -> int:
    """Give this socket the runtime rules of its service's other sockets named ``name``
    (gone or alive: the state of a gone one with rules is kept until a socket of its
    name holds them, collection.py), so that a restart that makes new sockets
    keeps every ban.  A prefix one holds as allow and another as deny is denied.  Run
    by every start before its program is installed, and again once its meta names the
    socket (a deny in between reached the old sockets alone).  Returns how many rules
    this socket was given."""
    wanted: dict[bytes, int] = {}
    for other in pins_in_use().sockets_of(where.service):
        if other.cookie == where.cookie:
            continue
        try:
            if read_meta(other).get("name") != name or not pins_in_use().has_pin(other, "runtime"):
                continue
            rules = runtime_rules(other)
        except AlfError:
            continue  # collected meanwhile: a socket of this name holds its rules
        for family, value, length, verdict in rules:
            key = runtime_key(family, value, length)
            wanted[key] = max(wanted.get(key, 0), verdict)  # RUNTIME_DENY (2) wins
    if not wanted:
        return 0
    mine = {runtime_key(f, v, n): verdict for f, v, n, verdict in runtime_rules(where)}
    given = 0
    for key, verdict in wanted.items():
        if mine.get(key, 0) < verdict:
            set_runtime(where, key, verdict)
            crash_point("rule-inherited")
            given += 1
    return given
