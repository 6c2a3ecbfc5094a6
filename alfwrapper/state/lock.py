"""The lock a start and a gc share on a service's folder: flock(2), which the kernel lets
go when its holder dies."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alfwrapper.errors import EX_TEMPFAIL, AlfError
from alfwrapper.state.trust import failure

LOCK_SECONDS = 10.0  # how long a start waits for a gc to let go of its service's folder


@contextmanager
def service_lock(folder: Path, exclusive: bool) -> Iterator[bool]:
    """flock(2) on a service's folder.  A start holds it shared while it makes a
    socket's state there (until its meta names its pid), waiting at most
    LOCK_SECONDS for a gc to let go; gc holds it exclusive to remove state without
    meta or the folder itself, and does not wait: it yields False when a start holds
    it.  False too when the folder was removed meanwhile.  The kernel lets go when
    the holder dies."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield False
        return
    except OSError as err:
        raise failure(f"{folder}", err) from None
    try:
        deadline = time.monotonic() + LOCK_SECONDS
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if exclusive:
                    yield False
                    return
                if time.monotonic() >= deadline:
                    raise AlfError(
                        f"{folder}",
                        f"a gc has held it for {LOCK_SECONDS:.0f} s (a stopped "
                        "`alfwrapper gc` or `status`?)",
                        "let it finish, or stop it, then start again",
                        EX_TEMPFAIL,
                    ) from None
                time.sleep(0.01)
            except OSError as err:
                raise failure(f"locking {folder}", err) from None
        try:
            now = os.stat(folder)
        except FileNotFoundError:
            yield False
            return
        mine = os.fstat(fd)
        yield (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)  # not removed meanwhile
    finally:
        os.close(fd)
