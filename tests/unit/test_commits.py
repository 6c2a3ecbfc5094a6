"""The commit message convention (tests/commits.py, `make lint` and the commit-msg hook)."""

from __future__ import annotations

import importlib.util

import pytest
from helpers.support import ROOT

pytestmark = pytest.mark.unit

spec = importlib.util.spec_from_file_location("commits", ROOT / "tests/commits.py")
assert spec is not None and spec.loader is not None
commits = importlib.util.module_from_spec(spec)
spec.loader.exec_module(commits)


def test_a_short_subject_a_blank_line_and_a_body() -> None:
    assert commits.problems("sets: grow a full set\n\nWhy, measured, tests.\n") == []
    assert commits.problems("sets: grow\n\nwhy\n# a comment git strips\n\n") == []
    long = "x" * 73
    assert commits.problems(f"{long}\n\nwhy\n") == ["subject of 73 characters (at most 72)"]
    assert commits.problems("a subject alone\n") == [
        "no blank line and body after the subject (say why)"
    ]
    assert commits.problems("subject\nbody glued on\n") == [
        "no blank line and body after the subject (say why)"
    ]
    assert commits.problems("\n\n") == ["no subject"]
