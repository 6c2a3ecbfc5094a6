"""The drop log's events as written: lifecycle/droplog.py's decoding and its line."""

from __future__ import annotations

import pytest

from alfwrapper.bpf import parts
from alfwrapper.lifecycle import droplog

pytestmark = pytest.mark.unit


def event(ifindex: int) -> bytes:
    addr = bytes([198, 51, 100, 7]) + bytes(12)
    return parts.EVENT.pack(10**9, ifindex, 0, 40000, 8080, 2, 4, 6, 0, addr)


def test_a_packet_judged_from_the_queue_says_so_not_interface_0() -> None:
    """A packet that reached the socket before its filter is judged by a test run, with
    no interface recorded (ifindex 0): the line says it was queued, never `via #0`."""
    queued = droplog.decode("web", "web", event(0))
    assert queued.line().endswith("198.51.100.7 tcp port 8080 queued before the filter")
    assert queued.fields()["interface"] is None
    arrived = droplog.decode("web", "web", event(3), lambda index: f"eth{index}")
    assert arrived.line().endswith("tcp port 8080 via eth3") and arrived.interface == "eth3"
    assert droplog.decode("web", "web", event(3)).line().endswith("via #3")
