"""What the application is confined by (privileges.py): the pure parts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.support import ROOT

from alfwrapper.host.capabilities import REACHES_FILTER
from alfwrapper.host.privileges import writable_outside

pytestmark = pytest.mark.unit


def test_writable_outside_leaves_out_the_way_to_each_excluded_folder(tmp_path: Path) -> None:
    for folder in ("etc", "sys/fs/bpf/x", "sys/fs/cgroup", "sys/kernel", "run/pins", "var"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "vmlinuz").write_text("")
    (tmp_path / "lib").symlink_to("var")
    top = str(tmp_path)
    found = writable_outside([f"{top}/sys/fs/bpf", f"{top}/run/pins"], top)
    assert found == [f"{top}/{f}" for f in ("etc", "sys/fs/cgroup", "sys/kernel", "var")]


def test_the_guide_lists_what_reaches_the_filter() -> None:
    readme = (ROOT / "docs/daemons.md").read_text()
    table = readme[readme.index("| Removed | Why |") :].split("\n\n")[0]
    rows = re.findall(r"^\| `(CAP_\w+)` \| (.+) \|$", table, re.M)
    assert rows == list(REACHES_FILTER.values())
