"""What a start tells its service manager (host/progress.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from alfwrapper.host import progress

pytestmark = pytest.mark.unit


def test_status_is_one_line_whatever_a_name_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newline in a name from the policy (an interface, a filter's file) cannot add a
    notification of its own (READY=1, MAINPID=...): STATUS= stays one line."""
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(str(tmp_path / "notify"))
    manager.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    progress.tell_manager("guarded by interfaces eth0\nREADY=1\nMAINPID=1\x00")
    said = manager.recv(4096).decode()
    assert said == "STATUS=guarded by interfaces eth0 READY=1 MAINPID=1 ", repr(said)
    monkeypatch.delenv("NOTIFY_SOCKET")
    progress.tell_manager("nobody listens")  # no NOTIFY_SOCKET: nothing, no error


def test_seconds_running_is_this_process_age() -> None:
    assert 0 <= progress.seconds_running() < 24 * 3600
