"""The loader's per-user memory quota, counted by the kernel: a memory cgroup each.

Since Linux 5.11 the kernel charges every BPF map and program to the memory
cgroup of the process that made it, for as long as the object lives, whoever
then holds its fds or pins.  The loader's unit delegates the memory controller
(Delegate=memory), so the loader moves itself into a leaf of its own cgroup
("serve": cgroup v2 keeps processes only in leaves) and serves each request of
user UID in the cgroup "u<UID>" beside it, whose memory.max is that user's
quota.  Everything a user's requests made and still exists, with the request
being served (its compile too), can then never pass the quota: the kernel
refuses the allocation that would.

Where the controller is not delegated (a cgroup v1 or hybrid host, or a manager
that is not PID 1 without a memory controller to give), delegated() is None and
the loader counts only the maps of its users' live sockets (loader.quota.record_program); it
says so when it starts.  Written by hand: the cgroup v2 interface is files, and no
library in Debian 12 wraps delegation for an unprivileged process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from alfwrapper.record import Record

MOUNT = Path("/sys/fs/cgroup")
SERVE = "serve"  # the loader's own leaf


def own_cgroup(proc: Path = Path("/proc/self/cgroup")) -> Path | None:
    """This process's cgroup v2 directory; None on a v1-only host."""
    for line in proc.read_text().splitlines():
        if line.startswith("0::"):
            return MOUNT / line[3:].lstrip("/")
    return None


class UserMemory(Record):
    """The loader's delegated cgroup, with a child per user."""

    base: Path

    def user(self, uid: int) -> Path:
        return self.base / f"u{uid}"

    def enter(self, uid: int, limit: int) -> None:
        """Move this process into the user's cgroup, made with ``limit`` bytes of
        memory (and no swap) if it is not there yet.  OSError if that fails."""
        path = self.user(uid)
        try:
            path.mkdir(mode=0o700)  # one user's usage is no other user's business
        except FileExistsError:
            pass
        try:  # no swap: a compile over the quota is stopped, not paged out
            (path / "memory.swap.max").write_text("0")
        except FileNotFoundError:  # no swap accounting on this kernel
            pass
        (path / "memory.max").write_text(str(limit))
        (path / "cgroup.procs").write_text(str(os.getpid()))

    def current(self, uid: int) -> int:
        """Bytes charged to the user now (0 before their first request)."""
        try:
            return int((self.user(uid) / "memory.current").read_text())
        except FileNotFoundError:
            return 0

    def limited(self, uid: int) -> int:
        """How many times the user's cgroup reached its limit (memory.events: max and
        oom_kill).  A load that fails while this grows was refused by the quota."""
        return self.watch(uid)()

    def watch(self, uid: int) -> Callable[[], int]:
        """limited(uid), as a call that keeps working after Landlock (the file is open
        already; a cgroup file read again from offset 0 is read afresh)."""
        return self._watch(self.user(uid))

    def watch_all(self) -> Callable[[], int]:
        """The same for the loader's whole cgroup, whose memory.max is its unit's
        MemoryMax=: it grows when anyone's request was refused for everyone's use,
        which is another person's load when the caller's own count did not grow."""
        return self._watch(self.base)

    @staticmethod
    def _watch(path: Path) -> Callable[[], int]:
        try:
            fd = os.open(path / "memory.events", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return lambda: 0

        def count() -> int:
            text = os.pread(fd, 4096, 0).decode("ascii", "replace")
            counts = dict(line.split() for line in text.splitlines() if line.strip())
            return int(counts.get("max", 0)) + int(counts.get("oom_kill", 0))

        return count


def delegated() -> UserMemory | None:
    """The loader's cgroup, set up for per-user quotas, if the memory controller is
    delegated to it; else None.  Moves this process into the leaf ``serve``."""
    try:
        base = own_cgroup()
        if base is None or base == MOUNT:
            return None
        if "memory" not in (base / "cgroup.controllers").read_text().split():
            return None
        if not os.access(base / "cgroup.subtree_control", os.W_OK):
            return None
        serve = base / SERVE
        serve.mkdir(mode=0o755, exist_ok=True)
        (serve / "cgroup.procs").write_text(str(os.getpid()))
        (base / "cgroup.subtree_control").write_text("+memory")
    except OSError:
        return None
    return UserMemory(base)
