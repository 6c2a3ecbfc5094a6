"""A socket's meta record: JSON in an ARRAY[1] of META_SIZE bytes, for status and reload,
and the pid that keeps the state from a gc while a start is at work."""

from __future__ import annotations

import json
import os
import struct

from alfwrapper.errors import EX_USAGE, AlfError
from alfwrapper.host import bpf_calls
from alfwrapper.state.inuse import open_pin
from alfwrapper.state.places import SocketState

META_SIZE = 8192
_U32 = struct.Struct("=I")


# What a socket's meta holds besides the options and the folder: counts, ids and
# names of bounded size (lifecycle/kept.py: describe_sockets), well within this,
# and the names of its deny sets (at most MOST_SETS of 64 characters: 1,100 bytes).
META_FIXED = 2432


def check_meta_room(argv: list[str], cwd: str) -> None:
    """Refuse, before anything is changed, options that its meta could not hold."""
    if len(json.dumps({"argv": argv, "cwd": cwd}).encode()) + META_FIXED > META_SIZE:
        raise AlfError(
            "the rule options",
            f"are too long to keep for reload (at most about {META_SIZE - META_FIXED} bytes "
            "with the working directory)",
            "put the rules in a policy file or a rule file (--policy, --allow-file)",
            EX_USAGE,
        )


def write_meta(state: SocketState, meta: dict[str, object]) -> None:
    data = json.dumps(meta, sort_keys=True).encode()
    if len(data) > META_SIZE:
        raise AlfError(
            f"{state.dir}", "its description is too long", "use shorter paths or options", EX_USAGE
        )
    fd = open_pin(state, "meta")
    try:
        bpf_calls.map_update(fd, _U32.pack(0), data.ljust(META_SIZE, b"\0"))
    finally:
        os.close(fd)


def read_meta(state: SocketState) -> dict[str, object]:
    fd = open_pin(state, "meta")
    try:
        raw = bpf_calls.map_lookup(fd, _U32.pack(0), META_SIZE) or b""
    finally:
        os.close(fd)
    try:
        meta = json.loads(raw.rstrip(b"\0") or b"{}")
    except ValueError:
        meta = {}
    return meta if isinstance(meta, dict) else {}


def claim(where: SocketState, pid: int = 0) -> dict[str, object]:
    """Name this process (or ``pid``) in the meta of a socket's state taken from an earlier start
    (dead, or stopped for a restart), and return the meta.  Until describe_sockets
    rewrites it, a gc then keeps the state by this pid as well as by the socket's
    cookie: whatever a gc's sock_diag listing misses while this start compiles, it
    does not take the state from under it (which would leave the socket locked on a
    dispatcher no start can find again)."""
    meta = read_meta(where)
    if meta.get("pid") != (pid or os.getpid()):
        meta["pid"] = pid or os.getpid()
        write_meta(where, meta)
    return meta


def mark_judged(where: SocketState) -> None:
    """Write down that what was queued on the socket has been judged (Store.take)."""
    meta = read_meta(where)
    meta["judged"] = True
    write_meta(where, meta)
