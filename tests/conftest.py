"""Fixtures for every test: ``bpf_root`` skips (or, under CI=true, fails) without root and
BPF; ``network`` (three namespaced hosts) and ``services`` (stopped afterwards)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest
from hosts import Network, Service, make_network
from support import WRAPPER, bpf_problem, require


@pytest.fixture
def bpf_root() -> None:
    problem = bpf_problem()
    require(not problem, problem)


@pytest.fixture
def network(bpf_root: None) -> Iterator[Network]:
    net = make_network()
    try:
        yield net
    finally:
        # Whatever still runs in them goes first; then alfwrapper forgets the state of
        # their sockets (it can tell only while the namespaces exist); then they go.
        deadline = time.monotonic() + 10
        for name in net.names:
            while time.monotonic() < deadline:
                pids = subprocess.run(
                    ["ip", "netns", "pids", name], capture_output=True, text=True
                ).stdout.split()
                if not pids:
                    break
                subprocess.run(["kill", "-9", *pids], capture_output=True)
                time.sleep(0.05)
        subprocess.run([*WRAPPER, "gc"], capture_output=True, timeout=60)
        for name in net.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture
def services() -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for svc in started:
        svc.stop()
