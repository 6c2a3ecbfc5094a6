"""A thousand starts, each in a process of its own: what they leave pinned."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

pytestmark = pytest.mark.thorough

STATE = Path("/sys/fs/bpf/alfwrapper")


@pytest.mark.alone  # it counts stale pins a gc by another test would take
def test_a_thousand_starts_leave_no_stale_pins(bpf_root: None) -> None:
    """What each start does to the pins, a thousand times, each in a process of its own
    as a start is: collect what closed sockets left (state.gc, as the wrapper does first
    thing), then pin a new socket's state, then end."""
    from alfwrapper import state  # noqa: PLC0415

    state.live_cookies()  # its modules loaded once, for every child
    for _ in range(1000):
        child = os.fork()
        if child == 0:
            try:
                with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
                    state.store_in_use().gc()
                    state.store_in_use().create("thousand", sock, "thousand_t0")
                os._exit(0)
            except BaseException:  # noqa: BLE001  (a forked child never returns into pytest)
                os._exit(1)
        assert os.waitpid(child, 0)[1] == 0
    # The last one's: nothing has collected it yet.
    assert len(list((STATE / "thousand").glob("sock-*"))) == 1
    state.store_in_use().gc()
    assert not (STATE / "thousand").exists()
