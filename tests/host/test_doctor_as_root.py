"""doctor on this host as it is: as root (its last check loads a filter), without
capabilities, and on Debian's sshd as `make setup` installs it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.support import NO_CAPS, ROOT, WRAPPER, require

from alfwrapper.observe import daemons

pytestmark = pytest.mark.host


def texts(argv: list[str], inetd: bool = False, no_caps: bool = False) -> list[str]:
    return [
        f"{'ok' if f.ok else 'problem'}: {f.text}" for f in daemons.examine(argv, inetd, no_caps)
    ]


def test_doctor_passes_as_root() -> None:
    require(os.geteuid() == 0, "needs root (the last check loads a filter)")
    out = subprocess.run([*WRAPPER, "doctor"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout
    assert all(line.startswith("ok: ") for line in out.stdout.splitlines()), out.stdout
    assert "compiles, loads" in out.stdout


def test_doctor_says_which_path_and_what_is_missing(tmp_path: Path) -> None:
    require(os.geteuid() == 0, "needs root to drop its capabilities")
    # A loader's socket where none listens: another lane's loader test may be serving
    # at the usual path meanwhile.
    env = {**os.environ, "ALFWRAPPER_LOADER": str(tmp_path / "loader.sock")}
    out = subprocess.run(
        [
            *NO_CAPS,
            *WRAPPER,
            "doctor",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 69
    problems = [line for line in out.stdout.splitlines() if line.startswith("problem: ")]
    # Without CAP_BPF, filters come from the loader; none runs here, and doctor says
    # which unit to start.
    assert len(problems) == 1, out.stdout
    assert "CAP_BPF" in problems[0] and "unprivileged_bpf_disabled" in problems[0]
    assert "loader" in problems[0] and "alfwrapper-loader.socket" in problems[0]
    assert "Traceback" not in out.stderr


def test_capabilities_that_would_be_removed() -> None:
    sshd = "/usr/sbin/sshd"
    require(os.path.exists(sshd), "openssh-server is not installed (make setup installs it)")
    assert texts([sshd, "-i"], inetd=True)[1] == (
        f"ok: {sshd} keeps what it needs: CAP_SETGID, CAP_SETUID, CAP_SYS_CHROOT"
    )
    assert texts([sshd, "-i"], inetd=True, no_caps=True)[1] == (
        f"problem: {sshd} needs CAP_SETGID, CAP_SETUID, CAP_SYS_CHROOT (privilege "
        "separation), which --no-capabilities removes"
    )


def test_the_guides_example_is_what_it_prints() -> None:
    require(
        shutil.which("/usr/sbin/sshd") is not None,
        "openssh-server is not installed (make setup installs it)",
    )
    readme = (ROOT / "docs/daemons.md").read_text()
    block = re.search(
        r"\$ alfwrapper doctor --inetd --for (/usr/sbin/sshd -i)\n(.*?)```", readme, re.S
    )
    assert block is not None
    assert texts(block.group(1).split(), inetd=True) == block.group(2).strip().splitlines()
