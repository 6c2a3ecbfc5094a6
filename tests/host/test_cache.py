"""The program cache (alfwrapper/bpf/cache.py): a program loaded from it needs neither
BCC nor LLVM and judges every packet as the compiled one does; an entry that is
damaged, misplaced, not the user's, open to others or refused by the verifier is
never used (the program is compiled again); a crash while storing leaves no entry;
the cache stays within its bounds."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.support import PROGRAMS

from alfwrapper.bpf import cache
from alfwrapper.host import faults

pytestmark = pytest.mark.host

PROBE = PROGRAMS / "cache_probe.py"
KINDS = ("subnets", "interfaces", "knock", "filter")


def probe(folder: Path, kind: str, *more: str, crash: str = "") -> dict[str, Any]:
    env = {**os.environ, "ALFWRAPPER_CACHE": str(folder)}
    env.pop(faults.VARIABLE, None)
    if crash:
        env[faults.VARIABLE] = crash
    out = subprocess.run(
        [sys.executable, str(PROBE), kind, *more],
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
    return said


@pytest.mark.parametrize("kind", KINDS)
def test_a_cached_program_loads_without_bcc_and_judges_as_compiled(
    bpf_root: None, tmp_path: Path, kind: str
) -> None:
    folder = tmp_path / "cache"
    cold = probe(folder, kind)
    assert cold["compiled"] and cold["llvm"], cold
    assert (folder / cold["key"]).is_file()
    warm = probe(folder, kind)
    assert not warm["compiled"] and not warm["llvm"], "a warm load imported BCC or mapped LLVM"
    assert warm["verdicts"] == cold["verdicts"]
    assert cold["name"] == warm["name"] == "probe_t1"  # named for the socket, either way
    if kind != "knock":  # nobody knocked: all dropped; the others pass some, drop some
        assert any(cold["verdicts"]) and not all(cold["verdicts"]), cold["verdicts"]


def _flip(entry: Path, folder: Path) -> None:
    """A change the kernel would not notice (a type description), the seal kept."""
    sealed = json.loads(entry.read_text())
    body = json.loads(sealed["body"])
    counters = next(m for m in body["maps"] if m["name"] == "alf_counters")
    counters["leaf_desc"] = "long long" if counters["leaf_desc"] != "long long" else "long"
    sealed["body"] = json.dumps(body, sort_keys=True, separators=(",", ":"))
    entry.write_text(json.dumps(sealed))


def _other_key(entry: Path, folder: Path) -> None:
    other = probe(folder, "knock")  # a sound entry, of another program
    shutil.copy(folder / other["key"], entry)


def _link(entry: Path, folder: Path) -> None:
    shutil.copy(entry, folder / "copy")
    entry.unlink()
    entry.symlink_to(folder / "copy")


DAMAGE: dict[str, Callable[[Path, Path], None]] = {
    "truncated": lambda entry, _: entry.write_bytes(entry.read_bytes()[:100]),
    "sealed content changed": _flip,
    "another program's entry": _other_key,
    "another user's": lambda entry, _: os.chown(entry, 65534, 65534),
    "writable by others": lambda entry, _: entry.chmod(0o666),
    "a symbolic link": _link,
    "too big": lambda entry, _: entry.write_bytes(b" " * (cache.MAX_ENTRY_BYTES + 1)),
    "folder open to others": lambda _, folder: folder.chmod(0o755),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_an_entry_not_sound_and_ours_is_never_used(
    bpf_root: None, tmp_path: Path, damage: str
) -> None:
    folder = tmp_path / "cache"
    cold = probe(folder, "subnets")
    DAMAGE[damage](folder / cold["key"], folder)
    again = probe(folder, "subnets")
    assert again["compiled"], f"{damage}: the entry was used"
    assert again["verdicts"] == cold["verdicts"]
    if damage != "folder open to others":  # then nothing is written there either
        assert not probe(folder, "subnets")["compiled"], "the entry was not replaced"


def test_a_program_the_verifier_refuses_is_compiled_again(bpf_root: None, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    cold = probe(folder, "subnets")
    poisoned = probe(folder, "subnets", "poison")  # a sound entry, a bad program
    assert poisoned["compiled"] and poisoned["verdicts"] == cold["verdicts"]
    assert not probe(folder, "subnets")["compiled"], "the refused entry was not replaced"


def test_a_crash_while_storing_leaves_no_entry(bpf_root: None, tmp_path: Path) -> None:
    """Killed between writing an entry and renaming it in: no entry under the key, the
    next load compiles and stores; the leftover goes once it is a minute old."""
    folder = tmp_path / "cache"
    probe(folder, "subnets", crash="cache-written")
    leftovers = list(folder.iterdir())
    assert [p.name[:5] for p in leftovers] == [".new-"], leftovers
    after = probe(folder, "subnets")
    assert after["compiled"] and not probe(folder, "subnets")["compiled"]
    assert cache.prune(folder) == 0  # a fresh leftover may be a store under way
    os.utime(leftovers[0], (time.time() - 120,) * 2)
    assert cache.prune(folder) == 1 and not leftovers[0].exists()
    assert (folder / after["key"]).is_file()


def test_the_cache_keeps_the_most_recently_used_within_its_bounds(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    now = time.time()
    for i in range(6):
        entry = folder / f"{i:064x}"
        entry.write_bytes(b"x" * 1000)
        os.utime(entry, (now - 100 + i,) * 2)
    assert cache.prune(folder, keep=4) == 2
    assert sorted(p.name[-1] for p in folder.iterdir()) == ["2", "3", "4", "5"]
    assert cache.prune(folder, size=2500) == 2
    assert sorted(p.name[-1] for p in folder.iterdir()) == ["4", "5"]


def test_gc_removes_entries_not_used_for_a_month(bpf_root: None, tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    old, recent = folder / ("a" * 64), folder / ("b" * 64)
    for entry, days in ((old, 31), (recent, 29)):
        entry.write_bytes(b"{}")
        os.utime(entry, (time.time() - days * 86400,) * 2)
    out = subprocess.run(
        [sys.executable, "-m", "alfwrapper", "gc"],
        capture_output=True,
        text=True,
        env={**os.environ, "ALFWRAPPER_CACHE": str(folder)},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert f"gc: 1 program cache entry removed, in {folder}" in out.stdout
    assert not old.exists() and recent.exists()


def test_where_the_cache_is(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ALFWRAPPER_CACHE", "off")
    assert cache.directory() is None
    monkeypatch.setenv("ALFWRAPPER_CACHE", str(tmp_path))
    assert cache.directory() == tmp_path
    monkeypatch.delenv("ALFWRAPPER_CACHE")
    monkeypatch.setenv("CACHE_DIRECTORY", "/var/cache/app:/var/cache/alfwrapper-web")
    assert cache.directory() == Path("/var/cache/alfwrapper-web/programs")
    monkeypatch.setenv("CACHE_DIRECTORY", "/var/cache/app")  # the application's own: not used
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert cache.directory() == cache.SYSTEM_DIR
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cache.directory() is None


# What a start from the cache does not use, and must not import: BCC and numpy (one
# rule), OpenSSL's hashlib (cachedir.sha256), and what only a compile, an error hint
# or a drop log needs.
NOT_FOR_A_WARM_START = ("bcc", "numpy", "_hashlib", "tempfile", "subprocess",
                        "alfwrapper.lifecycle.droplog")  # fmt: skip


def test_a_warm_start_imports_only_what_it_uses(bpf_root: None, tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.write_text("192.0.2.1\n2001:db8::/64\n")
    env = {**os.environ, "ALFWRAPPER_CACHE": str(tmp_path / "cache")}
    imported: list[str] = []
    for _ in range(2):  # the first fills the cache
        with socket.socket() as probe_port:
            probe_port.bind(("127.0.0.1", 0))
            port = probe_port.getsockname()[1]
        out = subprocess.run([sys.executable, "-X", "importtime", "-m", "alfwrapper", "--listen",
                              f"127.0.0.1:{port}", "--allow-file", str(rules), "--", "true"],
                             capture_output=True, text=True, env=env, cwd=tmp_path,
                             timeout=120)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        imported = [
            line.split("|")[-1].strip()
            for line in out.stderr.splitlines()
            if line.startswith("import time:")
        ]
    assert "alfwrapper.lifecycle.kept" in imported  # a start that filters, seen
    assert not [name for name in imported if name in NOT_FOR_A_WARM_START], imported
