"""The sd_listen_fds environment protocol (the pure half)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.support import ROOT

from alfwrapper.errors import EX_CONFIG, AlfError
from alfwrapper.host.activation import child_environment, parse_listen_env

pytestmark = pytest.mark.unit


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
    assert child_environment({**env, "NGINX": "7;"}, ["web", "dns"], 99) == {
        "PATH": "/bin",
        "LISTEN_FDS": "2",
        "LISTEN_PID": "99",
        "LISTEN_FDNAMES": "web:dns",
        "NGINX": "3;4;",  # nginx's inherited sockets: the same fds
    }


def test_child_environment_without_sockets_has_no_listen_vars() -> None:
    env = {"LISTEN_FDS": "1", "HOME": "/", "NGINX": "3;"}
    assert child_environment(env, [], 99) == {"HOME": "/"}


THREADS_AFTER_NUMPY = r"""
import os, sys
from alfwrapper.host import activation
if sys.argv[1] == "own":
    activation.own_environment(os.environ)
import numpy
env = activation.child_environment(os.environ, [], 1)
threads = [l for l in open("/proc/self/status") if l.startswith("Threads:")][0].split()[1]
openblas = "openblas" in open("/proc/self/maps").read()
print(threads, env.get("OPENBLAS_NUM_THREADS", "-"), "openblas" if openblas else "other")
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: OpenBLAS starts no thread")
def test_numpy_loads_without_a_thread_per_core_and_the_application_never_knows() -> None:
    """The wrapper's own settings (own_environment) keep numpy's OpenBLAS to one thread,
    and the application's environment is as the wrapper's was given: without it,
    or with the value the wrapper was given."""

    def run(mode: str, **extra: str) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | extra
        argv = [sys.executable, "-c", THREADS_AFTER_NUMPY, mode]
        out = subprocess.run(
            argv, env=env, cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
        )
        return out.stdout.split()

    threads, given, blas = run("own")
    assert (threads, given) == ("1", "-")
    # What numpy does unasked, on this many cores, where its BLAS is OpenBLAS (Debian's
    # python3-numpy takes whichever libblas.so.3 is installed: the reference BLAS, as
    # in a minimal Debian 13, starts no thread).
    assert int(run("plain")[0]) > 1 if blas == "openblas" else run("plain")[0] == "1"
    assert run("own", OPENBLAS_NUM_THREADS="2")[:2] == ["2" if blas == "openblas" else "1", "2"]
