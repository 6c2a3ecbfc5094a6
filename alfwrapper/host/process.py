"""This process's capabilities (capset(2), prctl(2)) and its own mount namespace
(unshare(2), umount2(2)), through glibc."""

from __future__ import annotations

import ctypes
import os

from alfwrapper.host.libc import LIBC, check

_LINUX_CAPABILITY_VERSION_3 = 0x20080522


PR_SET_NO_NEW_PRIVS = 38


PR_CAP_AMBIENT = 47


PR_CAP_AMBIENT_CLEAR_ALL = 4


PR_CAPBSET_DROP = 24


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def prctl(option: int, arg2: int = 0, arg3: int = 0) -> None:
    check(
        LIBC.prctl(
            option, ctypes.c_ulong(arg2), ctypes.c_ulong(arg3), ctypes.c_ulong(0), ctypes.c_ulong(0)
        ),
        f"prctl({option})",
    )


def capset(effective: int, permitted: int, inheritable: int) -> None:
    """Set this thread's capability sets (bit masks over all 64 capabilities)."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    for i in range(2):
        data[i].effective = effective >> (32 * i) & 0xFFFFFFFF
        data[i].permitted = permitted >> (32 * i) & 0xFFFFFFFF
        data[i].inheritable = inheritable >> (32 * i) & 0xFFFFFFFF
    check(LIBC.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


CLONE_NEWNS = 0x00020000


MS_REC = 1 << 14


MS_SLAVE = 1 << 19


MNT_DETACH = 2


def unshare_mounts() -> None:
    """A mount namespace of this process's own that hears of the host's mounts and
    unmounts but tells the host of none of its own (MS_SLAVE, recursively)."""
    check(LIBC.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    check(LIBC.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None), "mount(/, MS_SLAVE)")


def umount_detach(path: str) -> None:
    check(LIBC.umount2(os.fsencode(path), MNT_DETACH), f"umount2({path})")
