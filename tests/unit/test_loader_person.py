"""Fairness by person: a uid in another user's subordinate range (/etc/subuid) is that
user for the loader's workers, waiting connections and quota; the file is read bounded
and its junk skipped; and the loader's unit bounds everyone's total."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alfwrapper.loader import person, server
from alfwrapper.loader.person import SubuidFile, person_of

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
NAMES = {"alice": 1001, "bob": 1002, "carol": 1003}.get
DEBIAN = "alice:100000:65536\nbob:165536:65536\n"


def test_a_subordinate_uid_is_its_owners_person() -> None:
    assert person_of(100000, DEBIAN, NAMES) == 1001
    assert person_of(165535, DEBIAN, NAMES) == 1001
    assert person_of(165536, DEBIAN, NAMES) == 1002
    assert person_of(231071, DEBIAN, NAMES) == 1002
    assert person_of(231072, DEBIAN, NAMES) == 231072  # past every range: its own
    assert person_of(99999, DEBIAN, NAMES) == 99999
    assert person_of(1001, DEBIAN, NAMES) == 1001  # the owner themself
    assert person_of(1004, "", NAMES) == 1004  # no file, no ranges


def test_owners_by_number_and_junk_lines() -> None:
    text = (
        "# a comment\n\n1002:5000:10\nbob:notanumber:5\nnobody-known:6000:10\n"
        "carol:7000:0\nalice:4294967290:100\nbob:8000:10:extra\n  alice:9000:10  \n"
        "\x00\xff:1:1\nalice:99999999999:1\n"
    )
    assert person_of(5009, text, NAMES) == 1002  # an owner written as a uid
    assert person_of(6000, text, NAMES) == 6000  # an unknown owner: skipped
    assert person_of(7000, text, NAMES) == 7000  # an empty range
    assert person_of(4294967290, text, NAMES) == 4294967290  # past 2**32: skipped
    assert person_of(8000, text, NAMES) == 8000  # four fields
    assert person_of(9005, text, NAMES) == 1001  # spaces around a line are fine


def test_a_uid_in_two_ranges_is_the_first_owners() -> None:
    text = "bob:100000:10\nalice:100000:65536\n"
    assert person_of(100005, text, NAMES) == 1002
    assert person_of(100010, text, NAMES) == 1001


def test_an_owners_owner_is_followed_and_loops_end() -> None:
    # carol (1003) is a uid inside bob's range; bob's uid inside alice's.
    text = "alice:1002:1\nbob:1003:1\ncarol:50000:10\n"
    assert person_of(50001, text, NAMES) == 1001
    loop = "alice:1002:1\nbob:1001:1\n"
    assert person_of(1001, loop, NAMES) in (1001, 1002)
    assert person_of(1002, loop, NAMES) in (1001, 1002)
    self_range = "alice:1000:10\n"  # a range holding its owner: the owner is themself
    assert person_of(1001, self_range, NAMES) == 1001


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400), st.integers(min_value=0, max_value=2**32 - 1))
def test_any_text_gives_a_person_never_a_traceback(text: str, uid: int) -> None:
    found = person_of(uid, text, lambda name: 1001 if name == "alice" else None)
    assert 0 <= found < 2**32


def test_the_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "subuid"
    people = SubuidFile(path)
    assert people.person(100000) == 100000  # no file yet
    path.write_text("1001:100000:65536\n")
    assert people.person(100000) == 1001
    assert people.ranges() is people.ranges()  # unchanged: not parsed again
    path.write_text("1002:100000:65536\n")
    os.utime(path, ns=(1, 1))  # a new mtime, as an edit gives
    assert people.person(100000) == 1002
    path.unlink()
    assert people.person(100000) == 100000


def test_the_file_is_read_bounded(tmp_path: Path) -> None:
    path = tmp_path / "subuid"
    line = "1001:100000:65536\n"
    junk = "x" * 40 + "\n"
    path.write_text(line + junk * (person.SUBUID_BYTES // len(junk)) + "1002:300000:10\n")
    people = SubuidFile(path)
    assert people.person(100001) == 1001
    assert people.person(300001) == 300001  # past the bound: not read
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert SubuidFile(fifo).person(100001) == 100001  # never blocks on a FIFO


def _unit_setting(name: str) -> str:
    text = (ROOT / "units" / "alfwrapper-loader.service").read_text()
    values = re.findall(rf"^{name}=(\S+)$", text, re.MULTILINE)
    assert values, f"alfwrapper-loader.service sets no {name}="
    return values[-1]


def test_the_loader_as_a_whole_is_bounded_above_its_own_limits() -> None:
    """Users' quotas cannot add up past the unit's bounds, and the bounds leave room
    for what the server itself allows at once (else they, not fairness, would decide
    who waits)."""
    memory = _unit_setting("MemoryMax")
    assert memory.endswith("%") and 0 < int(memory[:-1]) <= 75, memory
    tasks = int(_unit_setting("TasksMax"))
    assert 1 + 2 * server.WORKERS < tasks <= 256, tasks  # loader, workers, compiles
    files = int(_unit_setting("LimitNOFILE"))
    assert server.PENDING + 64 < files <= 65536, files
    assert server.WORKERS_PER_USER < server.WORKERS and server.PENDING_PER_USER < server.PENDING
