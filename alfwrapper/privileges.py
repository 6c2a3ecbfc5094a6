"""Give up privileges before exec: the application gets no capability at all.

The order matters, and this is the one place it is written down:

1. no_new_privs (Linux 3.5): from here on, exec cannot grant anything, not
   even to root (the kernel caps the new permitted set at the old one);
2. clear the ambient set (Linux 4.3), which would otherwise survive exec;
3. drop every capability from the bounding set we are allowed to (needs
   CAP_SETPCAP; without it, steps 1 and 4 already keep exec from regaining any);
4. empty the effective, permitted and inheritable sets with capset(2).

The interface watcher (watcher.py) moves to its own user and keeps only
CAP_BPF, which kernels before 6.5 ask for even to update a map.
"""

from __future__ import annotations

import errno
import os

from alfwrapper import syscalls
from alfwrapper.errors import EX_OSERR, AlfError

CAP_SETGID = 6
CAP_SETUID = 7
CAP_SYS_ADMIN = 21
CAP_BPF = 39
CAP_LAST = 63
PR_SET_DUMPABLE = 4
PR_SET_KEEPCAPS = 8


def permitted(field: str = "CapPrm") -> int:
    """This process's permitted capability set (or another: CapEff), from
    /proc/self/status."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1], 16)
    return 0


def effective() -> int:
    return permitted("CapEff")


def set_dumpable(dumpable: bool) -> None:
    """PR_SET_DUMPABLE: an undumpable process cannot be traced or read through /proc
    by processes of its own user that lack CAP_SYS_PTRACE."""
    syscalls.prctl(PR_SET_DUMPABLE, int(dumpable))


def switch_user(uid: int, gid: int, keep: int = 0) -> None:
    """As root: become uid/gid with no supplementary groups, keeping only ``keep``."""
    _drop_bounding(keep)
    syscalls.prctl(PR_SET_KEEPCAPS, 1)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    syscalls.prctl(PR_SET_KEEPCAPS, 0)
    drop_privileges(keep)


def _drop_bounding(keep: int) -> None:
    for cap in range(CAP_LAST + 1):
        if keep >> cap & 1:
            continue
        try:
            syscalls.prctl(syscalls.PR_CAPBSET_DROP, cap)
        except OSError as err:
            if err.errno not in (errno.EPERM, errno.EINVAL):
                raise


def drop_privileges(keep: int = 0) -> None:
    """Keep only the capabilities in the ``keep`` mask that we hold, and set no_new_privs."""
    try:
        keep &= permitted()
        syscalls.prctl(syscalls.PR_SET_NO_NEW_PRIVS, 1)
        syscalls.prctl(syscalls.PR_CAP_AMBIENT, syscalls.PR_CAP_AMBIENT_CLEAR_ALL)
        _drop_bounding(keep)
        syscalls.capset(keep, keep, 0)
    except OSError as err:
        raise AlfError(
            "dropping privileges before exec",
            err.strerror or str(err),
            "the application was not started; check the unit's capability settings",
            EX_OSERR,
        ) from None
