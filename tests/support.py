"""Shared by all tests: where things are, and the skip rule for root/BPF tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
IN_CI = os.environ.get("CI") == "true"
WRAPPER = [sys.executable, "-m", "alfwrapper"]
# Runs a command as root but with no capability left in any set.
NO_CAPS = ("setpriv", "--bounding-set=-all", "--inh-caps=-all")
ECHO_SERVER = [sys.executable, str(EXAMPLES / "echo_server.py")]


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
            from alfwrapper.bpf import compiler
            from alfwrapper.errors import AlfError
            from alfwrapper.policy.prefixes import parse_prefix
            from alfwrapper.policy.rules import SocketRules, SubnetRules

            try:
                compiler.load_rules(SocketRules(SubnetRules(allow=(parse_prefix("::/0"),))))
                _bpf_problem.append("")
            except AlfError as err:
                _bpf_problem.append(f"needs BPF: {err.line()}")
    return _bpf_problem[0]
