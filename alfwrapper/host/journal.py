"""The journal's native protocol, for an entry with fields of its own (ALF_*) from a
process whose stderr systemd connected to the journal.

Written here rather than with python-systemd's ``journal.send`` for one caller: a
denied Accept=yes peer's wrapper (lifecycle/resets.py), whose whole cost is Python's
start and a few milliseconds, would pay about 40 ms more for that import (uuid,
datetime, logging and traceback come with it).  The protocol is systemd's
(systemd.journal-fields(7); "Native Journal Protocol" in systemd's documentation):
one datagram to /run/systemd/journal/socket, a ``KEY=value`` line per field, or for
a value with a newline the key, a newline, its length as 64-bit little endian, the
value and a newline.  Standard library only, no ctypes.
"""

from __future__ import annotations

import os

SOCKET = "/run/systemd/journal/socket"
MAX_DATAGRAM = 64 << 10  # far below journald's limit; an entry here is a few hundred bytes


def stderr_is_journal() -> bool:
    """Does stderr lead to the journal?  systemd sets JOURNAL_STREAM to the
    device:inode of the stream it connected (systemd.exec(5)), so that a process may
    send native entries instead: then the line it would print goes there, fields and
    all.  Anything else (a terminal, a file, inetd's peer, a closed fd): no."""
    want = os.environ.get("JOURNAL_STREAM", "")
    try:
        info = os.fstat(2)
    except OSError:
        return False
    return want == f"{info.st_dev}:{info.st_ino}"


def encode(fields: dict[str, str]) -> bytes:
    """One entry in the native protocol's form (keys: A-Z, 0-9 and _, not starting
    with _, as journald requires; the caller's are constants)."""
    out = bytearray()
    for key, value in fields.items():
        raw = value.encode("utf-8", "replace")
        if b"\n" in raw:
            out += key.encode() + b"\n" + len(raw).to_bytes(8, "little") + raw + b"\n"
        else:
            out += key.encode() + b"=" + raw + b"\n"
    return bytes(out)


def send(fields: dict[str, str]) -> bool:
    """Send one entry; False if the journal did not take it (no journald, a full
    socket buffer, an entry too long), for the caller to print its line instead."""
    data = encode(fields)
    if len(data) > MAX_DATAGRAM:
        return False
    try:
        import _socket  # noqa: PLC0415  (socket.py and its enums cost 4 ms)

        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
    except (ImportError, OSError):
        return False
    try:
        sock.setblocking(False)  # never wait on a busy journald: print instead
        sock.sendto(data, SOCKET)
        return True
    except OSError:
        return False
    finally:
        sock.close()
