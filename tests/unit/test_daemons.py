"""doctor --for (daemons.py): how a command takes its sockets, what it would lose."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from alfwrapper.errors import EX_NOINPUT, AlfError
from alfwrapper.observe import daemons

pytestmark = pytest.mark.unit


def texts(argv: list[str], inetd: bool = False, no_caps: bool = False) -> list[str]:
    return [
        f"{'ok' if f.ok else 'problem'}: {f.text}" for f in daemons.examine(argv, inetd, no_caps)
    ]


@pytest.mark.parametrize(
    ("argv", "sockets"),
    [
        (["/usr/sbin/sshd", "-i"], daemons.INETD),
        (["sshd", "-D", "-i", "-f", "/etc/ssh/sshd_config"], daemons.INETD),
        (["/usr/sbin/sshd", "-D"], daemons.OWN),
        (["/usr/sbin/sshd", "-D", "-oPermitRootLogin=no"], daemons.OWN),
        (["/usr/sbin/sshd", "-f", "/etc/ssh/sshd_config_i"], daemons.OWN),
        (["/usr/sbin/sshd", "-Di"], daemons.INETD),
        (["in.tftpd", "-s", "/srv/tftp"], daemons.INETD),
        (["in.tftpd", "--listen"], daemons.OWN),
        (["git", "daemon", "--inetd", "/srv/git"], daemons.INETD),
        (["git", "daemon", "/srv/git"], daemons.OWN),
        (["rsync", "--daemon"], daemons.INETD),
        (["lighttpd", "-D"], daemons.LISTEN_FDS),
    ],
)
def test_known_daemons(argv: list[str], sockets: str) -> None:
    found = daemons.known(argv)
    assert found is not None and found.sockets == sockets


def script(tmp_path: Path, body: str, mode: int = 0o755) -> str:
    path = tmp_path / "daemon"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(mode)
    return str(path)


def test_an_unknown_command_is_read_for_sd_listen_fds(tmp_path: Path) -> None:
    takes = script(tmp_path, 'test -n "$LISTEN_FDS" && exec ./serve')
    assert texts([takes]) == [f"ok: {takes} takes sockets from LISTEN_FDS (sd_listen_fds)"]
    problem = texts([takes], inetd=True)[0]
    assert problem.startswith(f"problem: {takes} expects sockets from LISTEN_FDS")
    assert problem.endswith("(leave out --inetd)")
    other = script(tmp_path, "exec ./serve")
    assert texts([other])[0].startswith(f"ok: {other} does not name sd_listen_fds")


def test_file_capabilities_and_set_user_id(tmp_path: Path) -> None:
    # VFS_CAP_REVISION_2: magic_etc, then (permitted, inheritable) for each word.
    raw = struct.pack("<5I", 0x02000000, 1 << 10, 0, 1 << (39 - 32), 0)
    assert daemons.permitted_of(raw) == 1 << 10 | 1 << 39
    assert daemons.names(daemons.permitted_of(raw)) == "CAP_NET_BIND_SERVICE, CAP_BPF"
    setuid = script(tmp_path, "exec ./serve", 0o4755)
    assert texts([setuid])[-1].startswith(f"problem: {setuid} is set-user-ID")


def test_a_command_that_is_not_there() -> None:
    with pytest.raises(AlfError) as err:
        daemons.examine(["/nonexistent/daemon"], False, False)
    assert err.value.exit_code == EX_NOINPUT


def test_a_daemon_that_binds_its_own_is_intercepted(tmp_path: Path) -> None:
    """nginx and its kind bind their own sockets: alfwrapper intercepts them, unless
    the command is started inetd style or is a 32-bit executable."""
    assert daemons.known(["/usr/sbin/nginx", "-g", "daemon off;"]).sockets == daemons.OWN  # type: ignore[union-attr]
    own = script(tmp_path, "exec ./serve")
    found = daemons.own_sockets("nginx", own, inetd=False)
    assert found.ok and "intercepts its binds" in found.text
    assert not daemons.own_sockets("nginx", own, inetd=True).ok
    elf32 = tmp_path / "elf32"
    elf32.write_bytes(b"\x7fELF\x01" + bytes(60))
    elf32.chmod(0o755)
    found = daemons.own_sockets("old", str(elf32), inetd=False)
    assert not found.ok and "32-bit" in found.text


def test_nginx_and_haproxy_take_given_sockets_their_own_way() -> None:
    """Given sockets, nginx takes them from NGINX and HAProxy by fd@N (tested in
    tests/netns/test_intercept.py): doctor --for says so beside interception."""
    for argv, how in ((["/usr/sbin/nginx"], "NGINX variable"), (["haproxy"], "fd@3")):
        daemon = daemons.known(argv)
        assert daemon is not None and how in daemon.native
        found = daemons.own_sockets(argv[0], "/nonexistent", inetd=False, native=daemon.native)
        assert found.ok and "intercepts its binds" in found.text and how in found.text
    assert daemons.known(["/usr/sbin/apache2"]).native == ""  # type: ignore[union-attr]
