"""Entering network namespaces (setns(2)): one by path, or each in use in turn."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from alfwrapper.host.libc import LIBC, check

CLONE_NEWNET = 0x40000000


def setns(fd: int, kind: int) -> None:
    check(LIBC.setns(fd, kind), "setns")


@contextmanager
def netns(path: str) -> Iterator[None]:
    """Run the block in the network namespace at ``path`` (as /proc/PID/ns/net), then
    return to our own.  Needs CAP_SYS_ADMIN; OSError when it cannot enter."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            setns(fd, CLONE_NEWNET)
        finally:
            os.close(fd)
        try:
            yield
        finally:
            setns(home, CLONE_NEWNET)
    finally:
        os.close(home)


def each_netns() -> Iterator[int]:
    """Enter every network namespace in use (by a process, or named in /run/netns) in
    turn, yielding in each; back in our own at the end.  Needs CAP_SYS_ADMIN."""
    seen: set[tuple[int, int]] = set()
    paths = [f"/proc/{p}/ns/net" for p in os.listdir("/proc") if p.isdigit()]
    if os.path.isdir("/run/netns"):
        paths += [os.path.join("/run/netns", n) for n in os.listdir("/run/netns")]
    home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    moved = False
    try:
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue  # gone, or not ours to see
            try:
                info = os.fstat(fd)
                if (info.st_dev, info.st_ino) in seen:
                    continue
                seen.add((info.st_dev, info.st_ino))
                setns(fd, CLONE_NEWNET)
                moved = True
                yield fd
            finally:
                os.close(fd)
    finally:
        if moved:
            setns(home, CLONE_NEWNET)
        os.close(home)
