"""Fixtures for every test: ``bpf_root`` skips (or, under CI=true, fails) without root and BPF."""

from __future__ import annotations

import pytest
from support import bpf_problem, require


@pytest.fixture
def bpf_root() -> None:
    problem = bpf_problem()
    require(not problem, problem)
