"""The shipped unit files as text (tests/host/test_units_offline.py verifies them with
systemd-analyze; the boot tier, tests/boot, runs them under a booted systemd)."""

from __future__ import annotations

import re

import pytest
from helpers.support import ROOT

pytestmark = pytest.mark.unit

UNITS = ROOT / "units"


def test_the_metrics_service_cannot_stay_activating() -> None:
    """A oneshot's TimeoutStartSec= is infinity by default: one run that hangs (a FIFO
    planted at the bouncer's metrics file did it) held alfwrapper-metrics.service
    activating for ever, and the timer with it.  As shipped, it is bounded."""
    text = (UNITS / "alfwrapper-metrics.service").read_text()
    values = re.findall(r"^TimeoutStartSec=(\S+)$", text, re.MULTILINE)
    assert values and values[-1].isdigit() and 0 < int(values[-1]) <= 300, values
