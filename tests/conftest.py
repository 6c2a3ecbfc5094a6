"""Fixtures for every test: ``bpf_root`` skips (or, under CI=true, fails) without root and
BPF; ``network`` (three namespaced hosts) and ``services`` (stopped afterwards)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from hosts import Network, Service, make_network
from support import bpf_problem, require


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
        for name in net.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture
def services() -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for svc in started:
        svc.stop()
