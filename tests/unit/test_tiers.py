"""A test's folder is its tier, and its module says so (tests/conftest.py)."""

from __future__ import annotations

import pytest
from helpers.tiers import TIERS, tier_problem

pytestmark = pytest.mark.unit


def test_every_tier_has_its_folder() -> None:
    from helpers.support import ROOT  # noqa: PLC0415  (this test alone)

    assert {p.parent.name for p in (ROOT / "tests").glob("*/test_*.py")} == set(TIERS)


@pytest.mark.parametrize(
    ("nodeid", "marked", "fixtures", "refused"),
    [
        ("tests/unit/test_x.py::test_y", {"unit", "parametrize"}, {"tmp_path"}, None),
        ("tests/netns/test_x.py::test_y", {"netns", "alone"}, {"network"}, None),
        ("tests/netns/test_x.py::test_y", set(), {"network"}, "with no tier"),
        ("tests/netns/test_x.py::test_y", {"netns", "thorough"}, set(), "'thorough'"),
        ("tests/host/test_x.py::test_y", {"unit"}, set(), "pytest.mark.host"),
        ("tests/integration/test_x.py::test_y", {"netns"}, set(), "no tier's folder"),
        ("tests/unit/test_x.py::test_y", {"unit"}, {"bpf_root"}, "uses ['bpf_root']"),
        ("tests/unit/test_x.py::test_y[a]", {"unit"}, {"network", "services"}, "move it"),
    ],
)
def test_a_test_in_the_wrong_tier_is_refused(
    nodeid: str, marked: set[str], fixtures: set[str], refused: str | None
) -> None:
    problem = tier_problem(nodeid, marked, fixtures)
    assert problem is None if refused is None else refused in (problem or ""), problem
