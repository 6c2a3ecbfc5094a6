"""A kept verdict against the file system, model-based: a release laid out as folders
behind a `current` link, a verdict kept from a full start's reading of its policy, then
random sequences of what operators do to such files (write, rename over, switch the
link, hard-link copies as `cp -al` makes, `touch -r` and `touch -d`, drop-ins added and
removed, chmod, a folder replaced, a linked rule file re-pointed).  After each
sequence, whenever the kept verdict would still be used (verdicts.still_found), a full
start reading the files then must build the very table it holds."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.support import ROOT

from alfwrapper.cli.wrapper import parse_policy
from alfwrapper.errors import AlfError
from alfwrapper.host import cachedir
from alfwrapper.lifecycle import verdicts
from alfwrapper.policy import inputs

pytestmark = pytest.mark.unit

SANDBOXES = 2000
RULES = ["192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32", "192.0.2.9"]
POLICY = 'allow-file = ["allow.txt", "{root}/extra.txt"]\n'


def rule_text(rng: random.Random) -> str:
    return "".join(f"{r}\n" for r in rng.sample(RULES, rng.randint(1, 3)))


def dropin_text(rng: random.Random) -> str:
    return f'deny = ["{rng.choice(RULES)}"]\n'


def lay_out(root: Path, rng: random.Random) -> None:
    """v1 (policy, its rule file, perhaps a drop-in folder), `current` -> v1, perhaps v2
    made ahead, and extra.txt, a link to one of two shared rule files."""
    v1 = root / "v1"
    v1.mkdir(parents=True)
    (v1 / "policy.toml").write_text(POLICY.format(root=root))
    (v1 / "allow.txt").write_text(rule_text(rng))
    if rng.random() < 0.5:
        (v1 / "policy.toml.d").mkdir()
        (v1 / "policy.toml.d" / "10-deny.toml").write_text(dropin_text(rng))
    (root / "shared").mkdir()
    for name in ("a.txt", "b.txt"):
        (root / "shared" / name).write_text(rule_text(rng))
    (root / "current").symlink_to("v1")
    (root / "extra.txt").symlink_to("shared/a.txt")
    if rng.random() < 0.5:  # the next release made ahead: a hard-link copy, one file new
        copy(root, v1, rng)


def copy(root: Path, source: Path, rng: random.Random) -> None:
    """A new release folder as `cp -al` makes it, most often with one file changed (a
    new file, not the shared one written in place)."""
    made = root / f"v{len(versions(root)) + 1}"
    shutil.copytree(source, made, copy_function=os.link)
    if rng.random() < 0.8:
        changed = rng.choice([p for p in made.rglob("*") if p.is_file()])
        changed.unlink()
        changed.write_text(rule_text(rng) if changed.suffix == ".txt" else dropin_text(rng))


def full_start(root: Path) -> object:
    """The table a full start builds now, or the error it stops at."""
    try:
        policy = parse_policy(["--policy", str(root / "current" / "policy.toml")])
    except AlfError as err:
        return f"error: {err.why}"
    subnets = policy.rules_for("").subnets
    return verdicts.table_of(subnets.allow, subnets.deny)


def versions(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("v*") if p.is_dir() and not p.is_symlink())


def files_in(root: Path) -> list[Path]:
    found = [p for v in versions(root) for p in v.rglob("*") if p.is_file()]
    return found + sorted((root / "shared").glob("*"))


def act(root: Path, rng: random.Random) -> str:  # noqa: C901
    """One operator's step on the sandbox; returns its name."""
    files = files_in(root)
    target = rng.choice(files)
    step = rng.choice(("write", "rename", "switch", "switch", "copy", "touch-r", "touch-d",
                       "dropin", "chmod", "replace-folder", "repoint"))  # fmt: skip
    text = dropin_text(rng) if target.suffix == ".toml" else rule_text(rng)
    if "policy" in target.name and target.suffix == ".toml":
        text = POLICY.format(root=root) + rng.choice(("", dropin_text(rng)))
    if step == "write":
        before = target.stat()
        target.write_text(text)
        if rng.random() < 0.5:  # as if the times were put back (cp -p, rsync -t)
            os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    elif step == "rename":
        spare = target.with_name(target.name + ".new")
        spare.write_text(text)
        spare.rename(target)
    elif step == "switch":
        spare = root / "current.new"
        spare.symlink_to(rng.choice(versions(root)).name)
        spare.rename(root / "current")
    elif step == "copy":
        copy(root, rng.choice(versions(root)), rng)
    elif step in ("touch-r", "touch-d"):
        other = rng.choice(files).stat()
        when = other.st_mtime_ns if step == "touch-r" else 946684800 * 10**9
        os.utime(target, ns=(when, when))
    elif step == "dropin":
        folder = rng.choice(versions(root)) / "policy.toml.d"
        present = sorted(folder.glob("*.toml")) if folder.is_dir() else []
        if present and rng.random() < 0.5:
            rng.choice(present).unlink()
        else:
            folder.mkdir(exist_ok=True)
            (folder / f"{rng.randint(20, 99)}-more.toml").write_text(dropin_text(rng))
    elif step == "chmod":
        target.chmod(0o600 if target.stat().st_mode & 0o044 else 0o644)
    elif step == "replace-folder":
        old = rng.choice(versions(root))
        fresh = root / "fresh"
        shutil.copytree(old, fresh)  # new files, same contents, same names
        if rng.random() < 0.5:
            (fresh / "allow.txt").write_text(rule_text(rng))
        old.rename(root / f"gone-{time.monotonic_ns()}")
        fresh.rename(old)
    else:  # repoint
        spare = root / "extra.new"
        spare.symlink_to(f"shared/{rng.choice(('a.txt', 'b.txt'))}")
        spare.rename(root / "extra.txt")
    return step


def test_a_kept_verdict_is_used_only_where_a_full_start_builds_the_same_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALFWRAPPER_CACHE", "off")  # every full start reads every file
    monkeypatch.delenv("ALFWRAPPER_POLICY_PATH", raising=False)
    rng = random.Random(49)
    roots = [tmp_path / f"s{i}" for i in range(SANDBOXES)]
    for root in roots:
        lay_out(root, rng)
    # A verdict is kept only from files that settled (cachedir.RACY_NS): a change made
    # after that shows in their times, as it would for a real keep.
    time.sleep(cachedir.RACY_NS / 1e9 + 0.1)
    used = {True: 0, False: 0}
    for root in roots:
        inputs.CONSULTED.clear()
        kept = full_start(root)
        assert isinstance(kept, dict), kept
        consulted = list(inputs.CONSULTED)
        now = time.time_ns()
        assert all(cachedir.settled(ident, now) and real for _, ident, real in consulted)
        steps = [act(root, rng) for _ in range(rng.randint(1, 5))]
        still = verdicts.still_found(consulted)
        used[still] += 1
        if still:
            assert full_start(root) == kept, (root, steps)
    # Both outcomes are common: the test judges sequences that keep the verdict.
    assert used[True] > SANDBOXES // 20 and used[False] > SANDBOXES // 2, used


def test_sha256_needs_no_openssl() -> None:
    """cachedir.sha256 takes CPython's own module (_sha256 up to 3.11, _sha2 from 3.12:
    Debian 13's 3.13), never hashlib's OpenSSL, which costs every start 5 ms."""
    code = (
        "import sys; from alfwrapper.host.cachedir import sha256; "
        "print(sha256(b'abc').hexdigest(), 'hashlib' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    digest = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert out.stdout.split() == [digest, "False"], out.stdout + out.stderr
