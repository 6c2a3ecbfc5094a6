"""A rule file read again, unchanged (policy/prefix_list.read_rule_file): deferred, of
the length the first read noted in the cache folder, read only when looked into,
and then the same prefixes; refused if it changed meanwhile; never deferred on a
note that is damaged, or for a file changed within the last second."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from alfwrapper.errors import EX_SOFTWARE, EX_TEMPFAIL, AlfError
from alfwrapper.host import cachedir
from alfwrapper.policy.prefix_list import PrefixList, read_rule_file
from alfwrapper.policy.prefixes import parse_prefix

pytestmark = pytest.mark.unit

LINES = [f"198.51.100.{i}" for i in range(100)] + [f"2001:db8:{i:x}::/48" for i in range(1, 60)]


@pytest.fixture
def rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ALFWRAPPER_CACHE", str(tmp_path / "cache"))
    # Files are trusted as soon as written (not a second after): the racy test says why not.
    monkeypatch.setattr(cachedir, "RACY_NS", 0)
    path = tmp_path / "allow.rules"
    path.write_text("# a comment\n" + "\n".join(LINES) + "\n")
    return path


def notes(path: Path) -> list[Path]:
    return sorted((path.parent / "cache").glob("rules-*"))


def test_a_file_read_again_is_deferred_until_looked_into(rules: Path) -> None:
    first = read_rule_file(str(rules))
    assert first._deferred is None and len(notes(rules)) == 1
    again = read_rule_file(str(rules))
    assert again._deferred is not None, "read again although unchanged"
    assert len(again) == len(first) == len(LINES) and again.recipe() == first.recipe()
    inline = PrefixList.of([parse_prefix("192.0.2.1")])
    joined = PrefixList.concat([inline, again])
    assert joined._deferred is not None and len(joined) == len(LINES) + 1
    assert joined.recipe() == PrefixList.concat([inline, first]).recipe()
    assert again == first  # the same file, unchanged: equal without reading it
    assert again._deferred is not None
    assert list(again) == list(first) and again._deferred is None  # read when looked into
    assert list(joined) == [*inline, *first]
    assert len(joined.covering(4, 0xC6336405)) == 1


def test_a_file_changed_after_it_was_deferred_is_refused(rules: Path) -> None:
    read_rule_file(str(rules))
    deferred = read_rule_file(str(rules))
    rules.write_text("\n".join(LINES[:50]) + "\n")
    with pytest.raises(AlfError) as caught:
        list(deferred)
    assert caught.value.exit_code == EX_TEMPFAIL and caught.value.why.startswith("changed while")


def test_a_changed_file_is_read_again(rules: Path) -> None:
    read_rule_file(str(rules))
    rules.write_text("\n".join(LINES[:80]) + "\n")
    changed = read_rule_file(str(rules))
    assert changed._deferred is None and len(changed) == 80
    assert len(notes(rules)) == 2


def test_a_file_changed_within_the_second_is_not_noted(
    rules: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_rule_file(str(rules))
    monkeypatch.setattr(cachedir, "RACY_NS", 1_000_000_000)
    os.utime(rules)  # its times now: it may change again unseen within their granularity
    assert read_rule_file(str(rules)).recipe() is None
    assert read_rule_file(str(rules))._deferred is None
    assert len(notes(rules)) == 1  # the first read's, of the identity before
    time.sleep(1.1)
    read_rule_file(str(rules))
    assert read_rule_file(str(rules))._deferred is not None and len(notes(rules)) == 2


@pytest.mark.parametrize("offset", [0, 40, -1])
def test_a_damaged_note_is_not_trusted(rules: Path, offset: int) -> None:
    read_rule_file(str(rules))
    (note,) = notes(rules)
    data = bytearray(note.read_bytes())
    data[offset] ^= 1
    note.write_bytes(bytes(data))
    assert read_rule_file(str(rules))._deferred is None


def test_a_note_of_too_few_rules_is_not_trusted(rules: Path) -> None:
    """A deferred list's length decides whether it is empty: a note of 0 (sealed anew by
    someone) must not make a file's rules vanish."""
    read_rule_file(str(rules))
    (note,) = notes(rules)
    body = note.read_bytes()[32:].split(b" ", 2)
    forged = b" ".join([body[0], b"0", body[2]])
    note.write_bytes(cachedir.sha256(forged).digest() + forged)
    assert read_rule_file(str(rules))._deferred is None


def test_a_note_of_another_count_fails_the_start_when_read(rules: Path) -> None:
    read_rule_file(str(rules))
    (note,) = notes(rules)
    body = note.read_bytes()[32:].split(b" ", 2)
    forged = b" ".join([body[0], b"%d" % (len(LINES) - 9), body[2]])
    note.write_bytes(cachedir.sha256(forged).digest() + forged)
    lying = read_rule_file(str(rules))
    assert lying._deferred is not None and len(lying) == len(LINES) - 9
    with pytest.raises(AlfError) as caught:
        list(lying)
    assert caught.value.exit_code == EX_SOFTWARE and "the cache noted" in caught.value.why
    assert not notes(rules), "the wrong note is still there: every start would fail on it"
    assert read_rule_file(str(rules))._deferred is None


def test_a_change_of_the_same_size_is_seen(rules: Path) -> None:
    """Only the times tell this change: the size, device and inode stay."""
    read_rule_file(str(rules))
    text = rules.read_text()
    rules.write_text(text.replace("198.51.100.99\n", "203.0.113.199\n"))
    assert rules.stat().st_size == len(text)
    again = read_rule_file(str(rules))
    assert again._deferred is None and parse_prefix("203.0.113.199") in again


def test_a_deferred_file_is_read_from_where_it_was_named(
    rules: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reload builds the policy in the service's working directory and plans outside it."""
    monkeypatch.chdir(rules.parent)
    read_rule_file(rules.name)
    deferred = read_rule_file(rules.name)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert deferred._deferred is not None and len(list(deferred)) == len(LINES)


def test_settled_times() -> None:
    now = 1_800_000_000 * 10**9
    fine, whole = now - 2 * 10**9 + 12345, now - 2 * 10**9
    assert cachedir.settled((1, 2, 3, fine, fine), now)
    assert not cachedir.settled((1, 2, 3, fine, now - 10**8), now)  # changed 0.1 s ago
    # Whole seconds: a coarse file system (FAT: 2 s) may change within them unseen.
    assert not cachedir.settled((1, 2, 3, whole, fine), now)
    assert cachedir.settled((1, 2, 3, now - 6 * 10**9, now - 6 * 10**9 + 12345), now)


def test_a_join_is_named_by_its_parts_whenever_it_is_asked(rules: Path) -> None:
    """The recipe of a join does not depend on how the joins nest, nor on whether its
    parts were asked for theirs first (a cache hit must not depend on what ran before)."""
    inline = [PrefixList.of([parse_prefix(f"192.0.2.{i}")]) for i in range(3)]
    first = read_rule_file(str(rules))
    flat = PrefixList.concat([*inline, first])
    nested = PrefixList.concat(
        [PrefixList.concat(inline[:2]), PrefixList.concat([inline[2], first])]
    )
    asked = PrefixList.concat(inline[:2])
    asked.recipe()
    later = PrefixList.concat([asked, PrefixList.concat([inline[2], first])])
    assert flat.recipe() == nested.recipe() == later.recipe() is not None
    assert flat.recipe() != PrefixList.concat([first, *inline]).recipe()  # order matters
    deferred = PrefixList.concat([*inline, read_rule_file(str(rules))])
    assert deferred._deferred is not None and deferred.recipe() == flat.recipe()
