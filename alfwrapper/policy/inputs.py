"""Reading what a user names (rule files, secrets, filter sources, standard input), bounded in
size and time: missing, unreadable, not a regular file, too large or too slow is an
``AlfError`` naming the file, never empty or partial input."""

from __future__ import annotations

import os
import stat
import time

from alfwrapper.errors import EX_DATAERR, EX_NOINPUT, AlfError, excerpt
from alfwrapper.host.cachedir import Identity, identity

# How much of a file the user names is read, at most, and for how long.  A
# 1,000,000-line rule file of IPv6 addresses written out in full
# (2001:0db8:0000:...:0001/128) is 44 MB.
RULE_FILE_LIMIT = 64 << 20
SECRET_LIMIT = 4096
FILTER_LIMIT = 1 << 20
READ_SECONDS = 30.0
_CHUNK = 1 << 20

# Every file read and every path looked at in this process, with what it was then
# (cachedir.identity) and where it led (resolved): a verdict kept for later starts
# (lifecycle/verdicts.py) holds only while each is still the same, and still found
# where it was.  A path through a symbolic link switched since (a release folder
# behind a `current` link) leads elsewhere, even to a hard link of the same file:
# what is read next to it (a policy's relative rule files) is then another file.
CONSULTED: list[tuple[str, Identity, str]] = []


def here(path: str) -> str:
    """The path from the working directory, not normalised (``..`` after a symbolic
    link is the kernel's to resolve, as it does when the file is opened)."""
    return os.path.join(os.getcwd(), path)


def resolved(path: str) -> str:
    """Where the path leads now: every symbolic link on it followed (os.path.realpath,
    for a missing path as far as it goes)."""
    return os.path.realpath(path)


def _noted(path: str, before: str, ident: Identity) -> None:
    """Note in CONSULTED what ``path`` was, found where ``before`` said it led; if it
    leads elsewhere now (switched meanwhile), where it led is unknown: ""."""
    CONSULTED.append((here(path), ident, before if resolved(path) == before else ""))


def look(path: str) -> Identity:
    """The path's identity now (None if there is none), noted in CONSULTED."""
    before = resolved(path)
    try:
        found = identity(os.stat(path))
    except OSError:
        found = None
    _noted(path, before, found)
    return found


def consulted(path: str, ident: Identity, before: str) -> None:
    """Note in CONSULTED a file whose contents were taken as what they were (a rule
    file the cache remembers: policy/prefix_list.read_rule_file), its identity taken
    where ``before`` (resolved, first) said it led."""
    _noted(path, before, ident)


def read_input(path: str, what: str, limit: int) -> bytes:
    """A regular file the user named, at most ``limit`` bytes, read within READ_SECONDS.

    Missing, unreadable, not a regular file (a FIFO, a device, a directory),
    too large or too slow is an error, never empty or partial input.
    """
    return read_identified(path, what, limit)[0]


def read_identified(path: str, what: str, limit: int, shown: str = "") -> tuple[bytes, Identity]:
    """read_input, and the identity of the file read (taken from the open file).
    ``shown``: the path as the user gave it, for messages (``path`` by default)."""
    where = f"{what} {excerpt(shown or path, 200, quote=False)}"
    before = resolved(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not hang; it is refused below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise AlfError(where, "no such file", "check the path", EX_NOINPUT) from None
    except OSError as err:
        raise AlfError(
            where,
            err.strerror or str(err),
            "check the path and its permissions",
            EX_NOINPUT,
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise AlfError(
                where,
                f"is not a regular file (it is a {_file_kind(info.st_mode)})",
                "give a file, not a FIFO, device or directory",
                EX_NOINPUT,
            )
        too_big = AlfError(
            where,
            f"is larger than {limit} bytes",
            "split it, or check that it is the file you meant",
            EX_DATAERR,
        )
        if info.st_size > limit:
            raise too_big
        deadline = time.monotonic() + READ_SECONDS
        chunks = []
        total = 0
        while True:
            try:
                chunk = os.read(fd, _CHUNK)
            except OSError as err:
                raise AlfError(
                    where, err.strerror or str(err), "check the file", EX_NOINPUT
                ) from None
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise too_big
            if time.monotonic() > deadline:
                raise AlfError(
                    where,
                    f"reading took longer than {READ_SECONDS:.0f} s",
                    "put it on a local file system",
                    EX_NOINPUT,
                )
            chunks.append(chunk)
        _noted(path, before, identity(info))
        return b"".join(chunks), identity(info)
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISSOCK, "socket"),
    )
    return next((name for test, name in kinds if test(mode)), "special file")


def read_text_input(path: str, what: str, hint: str, limit: int) -> str:
    """read_input, decoded as UTF-8; anything else is bad data."""
    try:
        return read_input(path, what, limit).decode("utf-8")
    except UnicodeDecodeError as err:
        raise AlfError(
            f"{what} {excerpt(path, 200, quote=False)}",
            f"not UTF-8 text ({err.reason} at byte {err.start})",
            hint,
            EX_DATAERR,
        ) from None
