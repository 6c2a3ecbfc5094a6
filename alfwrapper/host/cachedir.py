"""The cache folder: where a start keeps what it may reuse (compiled programs,
bpf/cache.py; subnet tables, bpf/table_cache.py; rule-file notes,
policy/prefix_list.py; peers' verdicts, lifecycle/verdicts.py), and the only safe ways to read
and write an entry there.  Standard library only: a denied Accept=yes peer reads its
verdict through this before anything else is imported.

- **Where**: ``ALFWRAPPER_CACHE`` (a directory, or ``off``); else the
  ``alfwrapper*`` directory of the unit's ``CacheDirectory=`` (systemd's
  ``$CACHE_DIRECTORY``) + ``/programs``; else, for root,
  ``/var/cache/alfwrapper/programs``; else none.
- **Whose**: the folder must be this user's and closed to others (mode 0700, not
  a link), and an entry a regular file of this user that others cannot write, or
  it is not used: whoever may write an entry chooses what the next start does.
- **Whole**: an entry is written to a temporary file, synced (unless its own
  check finds a torn file: a table's CRC-32) and renamed into place, so a crash or
  a concurrent start never leaves half an entry under a name.
"""

from __future__ import annotations

import os
import stat
import sys

from alfwrapper.host.faults import crash_point

TYPE_CHECKING = False  # typing itself costs a denied peer 3 ms
if TYPE_CHECKING:
    import mmap
    from hashlib import _Hash

# Paths as text, not pathlib's: it costs a denied peer about 10 ms of imports.
SYSTEM_DIR = "/var/cache/alfwrapper/programs"

# What tells a file apart from any other, and from itself before a change: device,
# inode, size, and the modification and change times (the change time cannot be set
# back).  What an entry kept for a file's contents holds to.
Identity = tuple[int, int, int, int, int] | None
# A file changed less than this before its identity is taken may change again within
# the file system's timestamp granularity unseen (git's "racy" files): nothing is kept
# for it.  Times in whole seconds are a coarse file system's (FAT keeps 2 s): those
# are trusted only COARSE_NS after.
RACY_NS = 1_000_000_000
COARSE_NS = 5_000_000_000


def identity(info: os.stat_result | None) -> Identity:
    if info is None:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def identity_at(path: str) -> Identity:
    """The identity of what ``path`` names now (following links); None if nothing."""
    try:
        return identity(os.stat(path))
    except OSError:
        return None


def identity_opened(path: str) -> Identity:
    """The identity of the regular file ``path`` names, taken from the file opened: on
    NFS an open revalidates what a stat may take from a cache for a minute.  None if
    there is no such file (or it is not a regular file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    return identity(info) if stat.S_ISREG(info.st_mode) else None


def code_identity(paths: list[str], modules: tuple[str, ...] = ()) -> str:
    """What a kept result depends on besides its inputs: the identities of these code
    files, and of these modules' (found, not imported), and Python's version.  Taken
    when the caller is imported, it names the code that runs: an upgrade under a
    running start misses the next time, never this one."""
    found = list(paths)
    if modules:
        from importlib.machinery import PathFinder  # noqa: PLC0415

        for module in modules:
            spec = PathFinder.find_spec(module)
            found.append(spec.origin if spec is not None and spec.origin else f"({module})")
    return " ".join([sys.version, *(f"{p}={identity_at(p)}" for p in found)])


def settled(ident: Identity, now_ns: int) -> bool:
    """Is this identity old enough that a later change must show in it?  (Not where
    a file server's clock is behind this machine's by more than the margin, or where
    a file is written through a shared map without its times changing: see the
    docs/limits.md.)"""
    if ident is None:
        return True
    coarse = ident[3] % 1_000_000_000 == 0 or ident[4] % 1_000_000_000 == 0
    return max(ident[3], ident[4]) <= now_ns - (COARSE_NS if coarse else RACY_NS)


def sha256(data: bytes) -> _Hash:
    """SHA-256 from CPython's own module: hashlib loads OpenSSL, 5 ms of imports that
    every start would pay for the few keys and seals it hashes."""
    try:
        from _sha256 import sha256 as own  # type: ignore[import-not-found]  # noqa: PLC0415
    except ImportError:  # CPython 3.12 and later (Debian 13's 3.13) name it _sha2
        try:
            from _sha2 import sha256 as own  # type: ignore[import-not-found]  # noqa: PLC0415
        except ImportError:  # not CPython
            from hashlib import sha256 as own  # noqa: PLC0415
    digest: _Hash = own(data)
    return digest


def directory() -> str | None:
    """Where this process keeps its cache, if anywhere (see the module's docstring)."""
    chosen = os.environ.get("ALFWRAPPER_CACHE", "")
    if chosen == "off":
        return None
    if chosen:
        return chosen
    for folder in os.environ.get("CACHE_DIRECTORY", "").split(":"):
        if folder and os.path.basename(folder.rstrip("/")).startswith("alfwrapper"):
            return os.path.join(folder, "programs")
    return SYSTEM_DIR if os.geteuid() == 0 else None


def ours(info: os.stat_result, kind: int) -> bool:
    return (
        stat.S_IFMT(info.st_mode) == kind
        and info.st_uid == os.geteuid()
        and not (info.st_mode & 0o077 if kind == stat.S_IFDIR else info.st_mode & 0o022)
    )


def usable(folder: str, create: bool) -> bool:
    """The folder is this user's, closed to others; made (0700) if asked and missing."""
    if create:
        for part in (os.path.dirname(os.path.normpath(folder)), folder):
            try:
                os.mkdir(part, 0o700)
            except FileExistsError:
                pass
            except OSError:
                return False
    try:
        return ours(os.lstat(folder), stat.S_IFDIR)
    except OSError:
        return False


def read_entry(folder: str, name: str, limit: int) -> bytes | None:
    """The entry's bytes, if the folder is usable and the entry ours and at most
    ``limit`` bytes; None otherwise.  Marks it used (its mtime: the least recently
    used go first)."""
    fd = _open_entry(folder, name, limit)
    if fd is None:
        return None
    try:
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(limit + 1)
    finally:
        os.close(fd)
    return raw if len(raw) <= limit else None


def map_entry(folder: str, name: str, limit: int) -> mmap.mmap | None:
    """read_entry, as a read-only map of the file: tens of MiB (a subnet table,
    bpf/table_cache.py) are not copied, nor their pages faulted in one by one.  An
    entry is never written in place (Entry renames a new file over it), so what is
    mapped does not change.  None for an empty entry."""
    import mmap  # noqa: PLC0415  (not for a denied peer's verdict)

    fd = _open_entry(folder, name, limit)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        if not 0 < size <= limit:
            return None
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        return mmap.mmap(fd, size, flags, mmap.PROT_READ)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _open_entry(folder: str, name: str, limit: int) -> int | None:
    """The entry, opened, if the folder is usable and the entry ours and at most
    ``limit`` bytes; marked used."""
    if not usable(folder, create=False):
        return None
    path = os.path.join(folder, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
    except OSError:
        info = None
    if info is None or not ours(info, stat.S_IFREG) or info.st_size > limit:
        os.close(fd)
        return None
    try:
        os.utime(path)
    except OSError:
        pass
    return fd


def write_entry(folder: str, name: str, data: bytes) -> bool:
    """Keep ``data`` under ``name`` (replacing any), whole or not at all.  A cache
    that cannot be written is no error: False, and the next start does the work."""
    entry = Entry(folder)
    entry.write(data)
    return entry.commit(name)


class Entry:
    """An entry written a piece at a time (bpf/table_cache.py writes a table as it is
    built), then put in place whole, or not at all.  The file is made at the first
    write; every step after a failure, or past ``limit`` bytes, does nothing, and
    commit() says False.  (Not tempfile: it imports shutil, which a denied peer's
    start should not pay.)"""

    def __init__(self, folder: str, limit: int = 1 << 62) -> None:
        self.folder = folder
        self.temporary = os.path.join(folder, f".new-{os.urandom(8).hex()}")
        self.fd = -1
        self.limit = limit
        self.written = 0
        self.failed = False

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        self.written += len(view)
        if self.failed or self.written > self.limit:
            self.abandon()
            return
        try:
            if self.fd < 0:
                if not usable(self.folder, create=True):
                    raise OSError("the cache folder is not usable")
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                self.fd = os.open(self.temporary, flags, 0o600)
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError:
            self.abandon()
        except BaseException:
            self.abandon()
            raise

    def abandon(self) -> None:
        self.failed = True
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            _unlink(self.temporary)

    def commit(self, name: str, sync: bool = True) -> bool:
        """Put the entry in place.  ``sync``: on disk first (an entry whose own check
        finds a torn file, as a table's CRC-32 does, need not wait for it)."""
        if self.fd < 0 or self.failed:
            self.abandon()
            return False
        try:
            try:
                if sync:
                    os.fsync(self.fd)
            finally:
                os.close(self.fd)
                self.fd = -1
            crash_point("cache-written")
            os.replace(self.temporary, os.path.join(self.folder, name))
        except BaseException as err:
            _unlink(self.temporary)  # gone already if a gc took it for a leftover
            if isinstance(err, OSError):
                return False
            raise
        return True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
