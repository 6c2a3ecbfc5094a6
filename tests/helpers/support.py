"""Shared by all tests: where things are, and the skip rule for root/BPF tests."""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "programs"  # what tests run as processes of their own
EXAMPLES = ROOT / "examples"
IN_CI = os.environ.get("CI") == "true"
WRAPPER = [sys.executable, "-m", "alfwrapper"]
# Runs a command as root but with no capability left in any set.
NO_CAPS = ("setpriv", "--bounding-set=-all", "--inh-caps=-all")
ECHO_SERVER = [sys.executable, str(EXAMPLES / "echo_server.py")]
# Under pytest-xdist the echo server runs as python-gw0, python-gw1 ...: a service with
# no --service is named after its command, and two workers' tests must not share one
# service's pinned state, knock state and counters.  (It needs nothing but the stdlib.)
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if WORKER and os.geteuid() == 0:
    _named = Path("/run/alfwrapper-tests") / f"python-{WORKER}"
    _named.parent.mkdir(mode=0o755, exist_ok=True)
    if not _named.is_symlink():
        _named.symlink_to(os.path.realpath(sys.executable))
    ECHO_SERVER[0] = str(_named)


def require(condition: bool, reason: str) -> None:
    """Skip with the reason; under CI=true a missing requirement is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI=true, so this cannot be skipped: {reason}")
    pytest.skip(reason)


_bpf_problem: list[str] = []


def bpf_problem() -> str:
    """Why this process cannot load filters, or '' (checked once, with the real code)."""
    if not _bpf_problem:
        if os.geteuid() != 0:
            _bpf_problem.append("needs root (namespaces, veth, loading BPF)")
        else:
            from alfwrapper.bpf import compiler  # noqa: PLC0415
            from alfwrapper.errors import AlfError  # noqa: PLC0415
            from alfwrapper.policy.prefixes import parse_prefix  # noqa: PLC0415
            from alfwrapper.policy.rules import SocketRules, SubnetRules  # noqa: PLC0415

            try:
                compiler.load_rules(SocketRules(subnets=SubnetRules(allow=(parse_prefix("::/0"),))))
                _bpf_problem.append("")
            except AlfError as err:
                _bpf_problem.append(f"needs BPF: {err.line()}")
    return _bpf_problem[0]


# Tests run in several processes (make test: pytest-xdist); this keeps the ones marked
# `alone` apart from every other (conftest.host_share).  flock(2) prefers no one: a
# test waiting for the host alone would wait until every other worker happened to be
# between tests at once.  So every test first passes the gate, which one waiting to be
# alone holds: no test starts behind it, and it waits only for those running.
HOST_LOCK = Path("/run/alfwrapper-tests/lock")
HOST_GATE = HOST_LOCK.with_name("gate")


@contextmanager
def host_hold(exclusive: bool) -> Iterator[None]:
    if os.geteuid() != 0:  # changes nothing another test would see
        yield
        return
    HOST_LOCK.parent.mkdir(mode=0o755, exist_ok=True)
    gate = os.open(HOST_GATE, os.O_RDWR | os.O_CREAT, 0o600)
    fd = os.open(HOST_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            os.close(gate)
            gate = -1
        yield
    finally:
        os.close(fd)
        if gate >= 0:
            os.close(gate)


def loader_arguments() -> str:
    """The loader's arguments in the shipped alfwrapper-loader.service's ExecStart=,
    for a test's drop-in that adds to them."""
    text = (ROOT / "units" / "alfwrapper-loader.service").read_text()
    line = next(x for x in text.splitlines() if x.startswith("ExecStart=/usr/bin/alfwrapper "))
    return line.split(" loader ", 1)[1]


# A developer's filter that would change a set it names: it deletes an entry through
# the hosts map in force of the first set the program names (sets.c's alf_set_hosts_of,
# through the set's hosts_at bound as alf_set_hosts_0).
WRITES_INTO_A_SET = """#include "common.h"
int filter(struct __sk_buff *skb) {
    u32 slot = 0;
    void *hosts = alf_set_hosts_0.lookup(&slot);
    if (hosts) {
        struct alf_set_host key = {};
        bpf_map_delete_elem(hosts, &key);
    }
    return 1;
}
"""
