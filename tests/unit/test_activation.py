"""The sd_listen_fds environment protocol (the pure half)."""

from __future__ import annotations

import pytest

from alfwrapper.errors import EX_CONFIG, AlfError
from alfwrapper.host.activation import child_environment, parse_listen_env


def test_nothing_inherited() -> None:
    assert parse_listen_env({}, 42).count == 0


def test_inherited_with_names() -> None:
    env = {"LISTEN_FDS": "2", "LISTEN_PID": "42", "LISTEN_FDNAMES": "web:dns"}
    listen = parse_listen_env(env, 42)
    assert (listen.count, listen.names) == (2, ("web", "dns"))


def test_missing_names_are_unknown() -> None:
    listen = parse_listen_env({"LISTEN_FDS": "2", "LISTEN_PID": "42"}, 42)
    assert listen.names == ("unknown", "unknown")
    listen = parse_listen_env({"LISTEN_FDS": "2", "LISTEN_PID": "42", "LISTEN_FDNAMES": "a"}, 42)
    assert listen.names == ("a", "unknown")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LISTEN_FDS": "1", "LISTEN_PID": "41"}, "is not this process"),
        ({"LISTEN_FDS": "1"}, "LISTEN_PID is not"),
        ({"LISTEN_FDS": "x", "LISTEN_PID": "42"}, "not a number"),
        ({"LISTEN_FDS": "-1", "LISTEN_PID": "42"}, "not a number"),
        ({"LISTEN_FDS": "1", "LISTEN_PID": "42", "LISTEN_FDNAMES": "a:b"}, "2 names for 1 fds"),
    ],
)
def test_refuses_what_sd_listen_fds_would_ignore(env: dict[str, str], message: str) -> None:
    with pytest.raises(AlfError, match=message) as info:
        parse_listen_env(env, 42)
    assert info.value.exit_code == EX_CONFIG


def test_child_environment_replaces_listen_vars() -> None:
    env = {"PATH": "/bin", "LISTEN_FDS": "1", "LISTEN_PID": "1", "LISTEN_FDNAMES": "old"}
    assert child_environment(env, ["web", "dns"], 99) == {
        "PATH": "/bin",
        "LISTEN_FDS": "2",
        "LISTEN_PID": "99",
        "LISTEN_FDNAMES": "web:dns",
    }


def test_child_environment_without_sockets_has_no_listen_vars() -> None:
    assert child_environment({"LISTEN_FDS": "1", "HOME": "/"}, [], 99) == {"HOME": "/"}
