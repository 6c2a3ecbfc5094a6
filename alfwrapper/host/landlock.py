"""Landlock (Linux 5.13): its three syscalls and structs from uapi/linux/landlock.h, by
number, since glibc 2.36 has no wrappers and Debian 12 no library."""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from alfwrapper.host.libc import LIBC, check
from alfwrapper.host.process import PR_SET_NO_NEW_PRIVS, prctl

# Landlock (Linux 5.13): no library in Debian's Python; its three syscalls and
# structs from uapi/linux/landlock.h.
_SYS_LANDLOCK_CREATE_RULESET = 444


_SYS_LANDLOCK_ADD_RULE = 445


_SYS_LANDLOCK_RESTRICT_SELF = 446


_LANDLOCK_RULE_PATH_BENEATH = 1


_LANDLOCK_CREATE_RULESET_VERSION = 1


# What changes the file system, as of ABI 1: write a file, remove a file or a
# directory, make a character device, a directory, a regular file (a BPF pin
# is one), a socket, a FIFO, a block device or a symbolic link.
_LANDLOCK_WRITES_V1 = (1 << 1) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (
    1 << 9) | (1 << 10) | (1 << 11) | (1 << 12)  # fmt: skip


_LANDLOCK_READS_V1 = (1 << 0) | (1 << 2) | (1 << 3)  # run a file, read a file, list a folder


_LANDLOCK_FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14)  # execute, write, read, truncate


_LANDLOCK_REFER = 1 << 13  # ABI 2: link or rename across folders


_LANDLOCK_TRUNCATE = 1 << 14  # ABI 3


_LANDLOCK_SCOPE_SIGNAL = 1 << 1  # ABI 6


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers; 0 without Landlock (not built,
    not in the boot's lsm= list, or its syscalls filtered)."""
    abi = LIBC.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(abi), 0)


def landlock_restrict(
    writable: list[str], readable: list[str] | None = None, scope_signals: bool = False
) -> None:
    """From now on this process (and what it starts) may change the file system only
    beneath ``writable``; with ``readable``, it may also read (and run) files only
    beneath those and ``writable``, else reading is untouched.  With
    ``scope_signals`` (ABI 6, Linux 6.12), it may signal only processes it started.
    OSError when Landlock is unavailable (or too old for what is asked)."""
    abi = LIBC.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    check(abi, "landlock_create_ruleset")
    if scope_signals and abi < 6:
        raise OSError(errno.ENOSYS, f"Landlock ABI {abi}: signal scoping needs 6 (Linux 6.12)")
    handled = _LANDLOCK_WRITES_V1
    if abi >= 2:
        handled |= _LANDLOCK_REFER
    if abi >= 3:
        handled |= _LANDLOCK_TRUNCATE
    reads = _LANDLOCK_READS_V1 if readable is not None else 0
    handled |= reads
    # struct landlock_ruleset_attr: handled_access_fs, handled_access_net (ABI 4), scoped (ABI 6)
    attr = (ctypes.c_uint64 * 3)(handled, 0, _LANDLOCK_SCOPE_SIGNAL if scope_signals else 0)
    size = 24 if scope_signals else 8
    ruleset = LIBC.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    check(ruleset, "landlock_create_ruleset")
    try:
        rules = [(p, handled) for p in writable] + [(p, reads) for p in readable or []]
        for path, wanted in rules:
            folder = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                # A file (not a folder) takes only the rights a file can have.
                a_file = not stat.S_ISDIR(os.fstat(folder).st_mode)
                rule = _PathBeneath(wanted & _LANDLOCK_FILE_RIGHTS if a_file else wanted, folder)
                check(
                    LIBC.syscall(
                        _SYS_LANDLOCK_ADD_RULE,
                        ruleset,
                        _LANDLOCK_RULE_PATH_BENEATH,
                        ctypes.byref(rule),
                        0,
                    ),
                    "landlock_add_rule",
                )
            finally:
                os.close(folder)
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        check(LIBC.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
