"""The processes a start or a reload leaves beside the application: the interface
watcher (watcher.py) and the drop log's journal forwarder (droplog.py)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from alfwrapper import state
from alfwrapper.host import companion, interfaces

if TYPE_CHECKING:
    from alfwrapper.bpf.compiler import LoadedFilter


def start_watcher(loaded: Sequence[LoadedFilter], service: str, app_pid: int = 0) -> int:
    """The interface watcher of the programs with interface rules; its pid, or 0."""
    following = [lf for lf in loaded if lf.plan.rules.interfaces]
    if not following:
        return 0
    return interfaces.start_watcher(
        [
            interfaces.WatchedMap(
                lf.tables[b"iface_allowed"].map_fd,
                lf.plan.rules.interfaces,
                lf.tables[b"iface_alive"].map_fd,
                lf.tables[b"iface_lease"].map_fd,
            )
            for lf in following
        ],
        service,
        app_pid,
    )


def start_forwarder(
    logging: Sequence[tuple[str, state.SocketState]], service: str, app_pid: int = 0
) -> int:
    """The journal forwarder of the drop log of these sockets (name, state), if any and
    journald runs; its pid, or 0 (events then wait in the ring buffers for
    `alfwrapper log`)."""
    if not logging:
        return 0
    from alfwrapper.lifecycle import droplog  # noqa: PLC0415  (3 ms: only with a drop log)

    if not droplog.journald_present():
        return 0
    fds = [state.open_pin(where, "events") for _, where in logging]
    try:
        args = [service] + [f"{name}:{fd}" for (name, _), fd in zip(logging, fds, strict=True)]
        return companion.spawn(
            "alfwrapper.lifecycle.droplog", "drop log forwarder", args, fds, app_pid
        )
    finally:
        for fd in fds:
            os.close(fd)
