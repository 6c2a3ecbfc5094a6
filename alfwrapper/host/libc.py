"""glibc through ctypes: the one loaded C library, errno-checked calls, and the small calls
Python lacks (statfs(2), flushing C stdio, malloc_trim(3)).

ctypes is used only under host/ (make lint checks it): here, and for libbpf, the ring
buffer, namespaces, capabilities and Landlock beside it."""

from __future__ import annotations

import ctypes
import os

# The process's own symbols (glibc, and whatever LD_PRELOAD puts first, as the kernel
# tier's bpf(2) recorder does), not a second handle to libc.so.6: no ldconfig run
# (find_library's cost at every start), and syscall(3) stays interposable.
LIBC = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def statfs_type(path: str) -> int:
    """statfs(2)'s f_type (a file system's magic number), which os.statvfs lacks."""
    buf = ctypes.create_string_buffer(120)  # struct statfs; f_type is its first word
    if LIBC.statfs(path.encode(), buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int.from_bytes(buf.raw[:8], "little") & 0xFFFFFFFF


def flush_c_stdio() -> None:
    """fflush(NULL): C stdio's buffers (libbcc's std::cout goes through them)."""
    try:
        LIBC.fflush(None)
    except AttributeError:
        pass


def malloc_trim() -> None:
    """Give freed heap back to the system (glibc's malloc_trim(3)); no library wraps it."""
    try:
        LIBC.malloc_trim(0)
    except AttributeError:  # not glibc: nothing to give back this way
        pass
