"""The table cache (alfwrapper/bpf/table_cache.py): a start whose rule files are
unchanged writes the subnet table an earlier start built, reading no rule and
importing no numpy, and its kernel judges as the built table's does; a rule file
changed since (or within the last second) is read again and its new rules hold; an
entry that is damaged, misplaced, not the user's or open to others is never used;
a crash while keeping an entry leaves none."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.support import PROGRAMS

from alfwrapper.host import faults

pytestmark = pytest.mark.host

PROBE = PROGRAMS / "table_probe.py"
ALLOW = [f"192.0.2.{i}" for i in range(200)] + [f"2001:db8:{i:x}::/64" for i in range(1, 201)]
DENY = ["192.0.2.7", "2001:db8:5::/64"]
ADDED = "198.51.100.1"
SAME_SIZE = ("192.0.2.100\n", "203.0.113.9\n")  # a change only the file's times show
PROBES = [
    (4, int(ipaddress.IPv4Address(a)))
    for a in ("192.0.2.1", "192.0.2.7", "192.0.2.250", ADDED, "198.51.100.2", "203.0.113.9")
] + [
    (6, int(ipaddress.IPv6Address(a)))
    for a in ("2001:db8:1::1", "2001:db8:5::1", "2001:db8:c8::9", "2001:db8:fff::1")
]
# What the rules above say of PROBES (an allowed address passes unless denied).
EXPECTED = [True, False, False, False, False, False, True, False, True, False]


def settled() -> None:
    """A file changed less than a second ago is not trusted to stay what it is."""
    time.sleep(1.1)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path, Path]:
    allow, deny = tmp_path / "allow.rules", tmp_path / "deny.rules"
    allow.write_text("\n".join(ALLOW) + "\n")
    deny.write_text("\n".join(DENY) + "\n")
    settled()
    return allow, deny, tmp_path / "cache"


def start(allow: Path, deny: Path, folder: Path, crash: str = "") -> dict[str, Any]:
    env = {**os.environ, "ALFWRAPPER_CACHE": str(folder)}
    env.pop(faults.VARIABLE, None)
    if crash:
        env[faults.VARIABLE] = crash
    out = subprocess.run(
        [sys.executable, str(PROBE), str(allow), str(deny), json.dumps(PROBES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if crash:
        assert out.returncode == -9, (out.returncode, out.stderr[-2000:])
        return {}
    assert out.returncode == 0, out.stderr[-2000:]
    said: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["kernel"] == said["python"], said  # the kernel judges as the rules say
    return said


def tables(folder: Path) -> list[Path]:
    return sorted(folder.glob("table-*"))


def test_a_cached_table_judges_as_the_built_one_and_reads_no_rule(
    bpf_root: None, files: tuple[Path, Path, Path]
) -> None:
    cold = start(*files)
    assert not cold["cached"] and cold["numpy"] and cold["kernel"] == EXPECTED
    assert len(tables(files[2])) == 1
    warm = start(*files)
    assert warm["cached"], "the table was built again"
    assert not warm["numpy"], "a rule file was read and parsed"
    assert warm["kernel"] == EXPECTED


def test_a_changed_rule_file_is_read_again(bpf_root: None, files: tuple[Path, Path, Path]) -> None:
    allow, deny, folder = files
    start(*files)
    assert start(*files)["cached"]
    with allow.open("a") as f:
        f.write(f"{ADDED}\n")
    settled()
    changed = start(*files)
    assert not changed["cached"], "the table of the file before the change was used"
    assert changed["kernel"][3], f"{ADDED}, added to the file, does not pass"
    again = start(*files)
    assert again["cached"] and again["kernel"] == changed["kernel"]
    # Changed without a change of size: only the times tell.
    size = allow.stat().st_size
    allow.write_text(allow.read_text().replace(*SAME_SIZE))
    assert allow.stat().st_size == size
    settled()
    same_size = start(*files)
    assert not same_size["cached"] and same_size["kernel"][5], "203.0.113.9 does not pass"
    # Changed again, and started within the same second: nothing is trusted.
    with allow.open("a") as f:
        f.write("198.51.100.2\n")
    kept = tables(folder)
    racy = start(*files)  # not cached (its size changed), and not kept (the racy rule)
    assert not racy["cached"] and racy["kernel"][3:5] == [True, True]
    assert tables(folder) == kept, "a table was kept for a file changed within the second"
    settled()
    assert start(*files)["kernel"][3:5] == [True, True]


def test_allow_and_deny_files_swapped_are_other_rules(
    bpf_root: None, files: tuple[Path, Path, Path]
) -> None:
    allow, deny, folder = files
    start(*files)
    swapped = start(deny, allow, folder)  # the probe holds the kernel to these rules
    assert not swapped["cached"] and swapped["kernel"] != EXPECTED
    assert start(deny, allow, folder)["cached"] and start(*files)["cached"]


def _flip(entry: Path, _: Path) -> None:
    data = bytearray(entry.read_bytes())
    data[len(data) // 3] ^= 0x10  # in the table's bytes: the CRC-32 no longer holds
    entry.write_bytes(bytes(data))


def _other(entry: Path, folder: Path) -> None:
    """A sound entry of other rules, under this key."""
    other = folder.parent / "other.rules"
    other.write_text("\n".join(f"203.0.113.{i}" for i in range(100)) + "\n")
    settled()
    before = set(tables(folder))
    start(other, folder.parent / "deny.rules", folder)
    (new,) = set(tables(folder)) - before
    new.replace(entry)


DAMAGE = {
    "a byte changed": _flip,
    "truncated": lambda entry, _: entry.write_bytes(entry.read_bytes()[:1000]),
    "another table's entry": _other,
    "another user's": lambda entry, _: os.chown(entry, 65534, 65534),
    "writable by others": lambda entry, _: entry.chmod(0o666),
    "folder open to others": lambda _, folder: folder.chmod(0o755),
}


def test_an_entry_not_sound_and_ours_is_never_used(
    bpf_root: None, files: tuple[Path, Path, Path]
) -> None:
    """Each damage in turn, to the entry the start before kept (one compile for all)."""
    folder = files[2]
    start(*files)
    (entry,) = tables(folder)
    for damage, harm in DAMAGE.items():  # the folder's own damage last: nothing is kept after
        harm(entry, folder)
        again = start(*files)
        assert not again["cached"], f"{damage}: the entry was used"
        assert again["kernel"] == EXPECTED, damage
        if damage != "folder open to others":  # then nothing is written there either
            assert start(*files)["cached"], f"{damage}: the entry was not replaced"


def test_a_crash_while_keeping_a_table_leaves_no_entry(
    bpf_root: None, files: tuple[Path, Path, Path]
) -> None:
    """Killed between writing a table's entry and renaming it in (the program's entry
    is already there, so the table's is the only one written): no entry, and the
    next start builds and keeps it."""
    folder = files[2]
    start(*files)
    for entry in tables(folder):
        entry.unlink()
    start(*files, crash="cache-written")
    assert not tables(folder) and [p for p in folder.iterdir() if p.name.startswith(".new-")]
    after = start(*files)
    assert not after["cached"] and after["kernel"] == EXPECTED
    assert start(*files)["cached"]
