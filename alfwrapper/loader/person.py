"""Who a caller is for the loader's fairness: the person whose subordinate uid range
(/etc/subuid) holds the caller's uid, else the uid itself.

Debian's useradd gives every user 65,536 subordinate uids, and newuidmap (package
uidmap) lets that user act as any of them: counted per uid, one person would hold
every worker and 65,536 quotas.  So workers, waiting connections and the memory
quota are counted per person; each uid keeps its own pinned tree (who reaches what
is still SO_PEERCRED's uid alone).

A uid in two ranges belongs to the owner of the first line that lists it: useradd
appends, so the first owner is the one the range was given to first, and any one
rule gives one uid one person, which is all fairness needs (a later owner shares
nothing it did not already share).  A uid inside a range counts as the range's owner
even if it is an account of its own: the owner can act as it.  Owners' own ranges
are followed (A's range holds B, B's holds C: C is A's), a bounded number of steps.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Callable
from pathlib import Path

SUBUID = Path("/etc/subuid")
SUBUID_BYTES = 1 << 20  # read at most; lines past it are not seen (tens of thousands)
HOPS = 8  # owners' owners followed at most
UID_END = 1 << 32  # uids are 32 bits; (uid_t)-1 is no uid
_LINE = re.compile(r"^\s*([^:#\s]+):([0-9]{1,10}):([0-9]{1,10})\s*$")

Range = tuple[int, int, int]  # start, end (exclusive), owner's uid


def passwd_uid(name: str) -> int | None:
    """The uid of an owner written by name, None if there is none."""
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def parse_subuid(text: str, uid_of: Callable[[str], int | None] = passwd_uid) -> list[Range]:
    """The ranges of a subuid file, in its order.  Junk lines (comments, other shapes,
    unknown owners, empty or overflowing ranges) are skipped, never an error: the
    file is the administrator's, and one bad line must not unfair everyone."""
    ranges: list[Range] = []
    owners: dict[str, int | None] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        name, start, count = match.group(1), int(match.group(2)), int(match.group(3))
        if count == 0 or start + count > UID_END:
            continue
        if name not in owners:  # an owner is a name or a uid (shadow's subuid(5))
            owners[name] = int(name) if name.isascii() and name.isdigit() else uid_of(name)
        owner = owners[name]
        if owner is not None and 0 <= owner < UID_END:
            ranges.append((start, start + count, owner))
    return ranges


def owner_in(uid: int, ranges: list[Range]) -> int:
    """The person ``uid`` counts as, given parsed ranges (see the module's text)."""
    seen = {uid}
    for _ in range(HOPS):
        owner = next((o for start, end, o in ranges if start <= uid < end and o != uid), None)
        if owner is None or owner in seen:  # nobody's, or a loop: stop where we are
            return uid
        seen.add(owner)
        uid = owner
    return uid


def person_of(uid: int, subuid_text: str, uid_of: Callable[[str], int | None] = passwd_uid) -> int:
    """The person ``uid`` counts as, by the text of a subuid file."""
    return owner_in(uid, parse_subuid(subuid_text, uid_of))


class SubuidFile:
    """/etc/subuid, read again only when it changes (its mtime, size or inode): the
    loader asks for every connection it accepts."""

    def __init__(self, path: Path = SUBUID) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._ranges: list[Range] = []

    def ranges(self) -> list[Range]:
        try:
            info = os.stat(self.path)
        except OSError:  # no file: every uid is its own person
            self._seen, self._ranges = None, []
            return self._ranges
        seen = (info.st_mtime_ns, info.st_size, info.st_ino)
        if seen != self._seen:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
                try:  # a FIFO or a huge file put there must not hang or swamp the loader
                    text = os.read(fd, SUBUID_BYTES) if os.path.isfile(self.path) else b""
                finally:
                    os.close(fd)
            except OSError:
                return self._ranges  # keep what was read last
            if len(text) == SUBUID_BYTES:  # cut short: its last line may be half a line
                text = text[: text.rfind(b"\n") + 1]
            self._ranges = parse_subuid(text.decode("utf-8", "replace"))
            self._seen = seen
        return self._ranges

    def person(self, uid: int) -> int:
        return owner_in(uid, self.ranges())
