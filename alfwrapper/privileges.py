"""Give up privileges before exec: the application gets no capability at all.

The order matters, and this is the one place it is written down:

1. no_new_privs (Linux 3.5): from here on, exec cannot grant anything, not
   even to root (the kernel caps the new permitted set at the old one);
2. clear the ambient set (Linux 4.3), which would otherwise survive exec;
3. drop every capability from the bounding set we are allowed to (needs
   CAP_SETPCAP; without it, steps 1 and 4 already keep exec from regaining any);
4. empty the effective, permitted and inheritable sets with capset(2).

The interface watcher keeps only CAP_BPF, which it needs to update its map.
"""

from __future__ import annotations

import errno

from alfwrapper import syscalls
from alfwrapper.errors import EX_OSERR, AlfError

CAP_BPF = 39
CAP_LAST = 63


def permitted() -> int:
    """This process's permitted capability set, from /proc/self/status."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("CapPrm:"):
                return int(line.split()[1], 16)
    return 0


def drop_privileges(keep: int = 0) -> None:
    """Keep only the capabilities in the ``keep`` mask that we hold, and set no_new_privs."""
    try:
        keep &= permitted()
        syscalls.prctl(syscalls.PR_SET_NO_NEW_PRIVS, 1)
        syscalls.prctl(syscalls.PR_CAP_AMBIENT, syscalls.PR_CAP_AMBIENT_CLEAR_ALL)
        for cap in range(CAP_LAST + 1):
            if keep >> cap & 1:
                continue
            try:
                syscalls.prctl(syscalls.PR_CAPBSET_DROP, cap)
            except OSError as err:
                if err.errno not in (errno.EPERM, errno.EINVAL):
                    raise
        syscalls.capset(keep, keep, 0)
    except OSError as err:
        raise AlfError(
            "dropping privileges before exec",
            err.strerror or str(err),
            "the application was not started; check the unit's capability settings",
            EX_OSERR,
        ) from None
