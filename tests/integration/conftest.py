"""Fixtures: ``network`` (three namespaced hosts) and ``services`` (stopped afterwards)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from hosts import Network, Service, make_network


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
