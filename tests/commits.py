#!/usr/bin/env python3
"""`make lint`: every commit since the convention began has a readable message.

    tests/commits.py                 the commits after CONVENTION_SINCE, up to HEAD
    tests/commits.py --message FILE  one message (the commit-msg hook, scripts/commit-msg)

The convention (git's, bcc's, cilium's): a subject of at most 72 characters
("area: what changed"), a blank line, then a body that says why, what was measured,
the tests and the mutations.  In a shallow clone only the commits it has are read.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONVENTION_SINCE = "85d30ea"  # the last commit before the check: later ones follow it
SUBJECT_MOST = 72


def problems(message: str) -> list[str]:
    lines = [line for line in message.splitlines() if not line.startswith("#")]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines or not lines[0].strip():
        return ["no subject"]
    found = []
    if len(lines[0]) > SUBJECT_MOST:
        found.append(f"subject of {len(lines[0])} characters (at most {SUBJECT_MOST})")
    if len(lines) < 3 or lines[1].strip():
        found.append("no blank line and body after the subject (say why)")
    return found


def git(*argv: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), *argv], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout


def main(argv: list[str]) -> int:
    if argv[:1] == ["--message"]:
        found = problems(Path(argv[1]).read_text())
        for problem in found:
            print(f"commit message: {problem}", file=sys.stderr)
        return 1 if found else 0
    shallow = git("rev-parse", "--is-shallow-repository").strip() == "true"
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", CONVENTION_SINCE],
                           capture_output=True, check=False).returncode == 0  # fmt: skip
    if not known and not shallow:
        print(f"commits: {CONVENTION_SINCE} is not in this history", file=sys.stderr)
        return 1
    span = f"{CONVENTION_SINCE}..HEAD" if known else "HEAD"
    bad = 0
    for commit in git("rev-list", span).split():
        for problem in problems(git("log", "-1", "--format=%B", commit)):
            print(f"commit {commit[:12]}: {problem}", file=sys.stderr)
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
