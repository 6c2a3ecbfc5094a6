"""The journal's native protocol (host/journal.py) and what a reset is counted under
(lifecycle/resets.py).  The entry as journald stores it, with `status` counting it:
tests/boot/test_lifecycle.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import ROOT

from alfwrapper.host import journal
from alfwrapper.lifecycle.resets import counted_service

pytestmark = pytest.mark.unit


def test_fields_are_lines_and_a_newline_makes_a_sized_value() -> None:
    data = journal.encode(
        {"MESSAGE": "connection from 192.0.2.1", "ALF_PORT": "22", "ALF_NOTE": "two\nlines"}
    )
    assert data == (
        b"MESSAGE=connection from 192.0.2.1\nALF_PORT=22\n"
        b"ALF_NOTE\n" + (9).to_bytes(8, "little") + b"two\nlines\n"
    )


def test_an_entry_reaches_the_socket_as_one_datagram(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        monkeypatch.setattr(journal, "SOCKET", path)
        assert journal.send({"MESSAGE": "hello", "ALF_SRC": "192.0.2.1"})
        assert server.recv(4096) == b"MESSAGE=hello\nALF_SRC=192.0.2.1\n"
    monkeypatch.setattr(journal, "SOCKET", str(tmp_path / "none"))
    assert not journal.send({"MESSAGE": "hello"})  # no journal: the caller prints


def test_stderr_is_the_journal_only_where_journal_stream_names_it(tmp_path: Path) -> None:
    code = "from alfwrapper.host import journal; print(journal.stderr_is_journal())"
    log = tmp_path / "stderr"
    with log.open("w") as err:
        info = os.fstat(err.fileno())
        here = f"{info.st_dev}:{info.st_ino}"
        other = f"{info.st_dev}:{info.st_ino + 1}"
        for stream, said in ((here, "True"), (other, "False"), ("", "False")):
            out = subprocess.run([sys.executable, "-c", code], stderr=err, cwd=ROOT, text=True,
                                 env={**os.environ, "JOURNAL_STREAM": stream},
                                 stdout=subprocess.PIPE, check=True)  # fmt: skip
            assert out.stdout.strip() == said, stream


def test_an_accept_yes_instance_counts_under_its_template() -> None:
    assert counted_service("alfwrapper-sshd@3-192.0.2.2:22-198.51.100.1:41234") == (
        "alfwrapper-sshd"
    )
    assert counted_service("echo") == "echo"
