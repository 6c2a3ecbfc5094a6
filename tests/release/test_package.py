"""The Debian package, built by `make deb`, installed on this machine with apt-get, used
from /usr/bin/alfwrapper away from the checkout, and removed again without a trace.

It changes the host for its duration (the package is installed): everything it changes
is put back in `finally`."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.hosts import Network, Probe, Service, check_policy, wait_listening
from helpers.support import ROOT

pytestmark = pytest.mark.release

RELEASE = platform.release()
MODULES = Path("/lib/modules") / RELEASE
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def sh(*argv: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
        env={**CLEAN_ENV, "DEBIAN_FRONTEND": "noninteractive"},
    )
    assert not check or out.returncode == 0, f"{argv}: {out.stdout}{out.stderr}"
    return out


def installed() -> bool:
    out = sh("dpkg-query", "-W", "-f=${Status}", "alfwrapper", check=False)
    return out.stdout.endswith("installed") and "not-installed" not in out.stdout


@pytest.fixture
def package(deb: Path) -> Iterator[list[str]]:
    """The package installed; yields the files it installed."""
    assert not installed(), "alfwrapper is installed already: remove it before the tests"
    assert not (MODULES / "build").exists(), f"{MODULES}/build: this kernel has headers there"
    try:
        sh("apt-get", "install", "-y", "--no-install-recommends", str(deb))
        files = sh("dpkg-query", "-L", "alfwrapper").stdout.split("\n")
        yield [f for f in files if f and not Path(f).is_dir()]
    finally:
        if installed():
            sh("dpkg", "--purge", "alfwrapper", check=False)


@pytest.mark.alone  # the package changes the host for every other test while installed
def test_package_installs_works_and_leaves_nothing(network: Network, package: list[str]) -> None:
    # Where everything is.  BCC's headers are Debian's in /usr/src, found there by
    # alfwrapper (kernel_headers.py): nothing is linked under /lib/modules.
    for path in ("/usr/bin/alfwrapper", "/usr/lib/alfwrapper/policy/alfwrapper-echo.toml",
                 "/usr/lib/systemd/system/alfwrapper-loader.service",
                 "/usr/share/alfwrapper/units/alfwrapper-sshd@.service",
                 "/usr/lib/alfwrapper/policy/alfwrapper-sshd.toml",
                 "/usr/share/man/man1/alfwrapper.1.gz",
                 "/usr/share/man/man8/alfwrapper-loader.8.gz",
                 "/usr/lib/python3/dist-packages/alfwrapper/filters/subnets.c",
                 "/usr/share/bash-completion/completions/alfwrapper",
                 "/usr/share/doc/alfwrapper/README.md", "/usr/share/doc/alfwrapper/docs/daemons.md",
                 "/usr/share/doc/alfwrapper/examples/fail2ban/alfwrapper.conf",
                 "/usr/share/doc/alfwrapper/examples/filters/allowlist.c",
                 "/usr/share/doc/alfwrapper/examples/alfwrapper-instance.env"):  # fmt: skip
        assert path in package, path
    # Every path of ours that a shipped unit, example or guide names is there.
    named = set()
    for f in package:
        if f.startswith(
            (
                "/usr/lib/systemd/system/",
                "/usr/share/alfwrapper/units/",
                "/usr/share/doc/alfwrapper/",
            )
        ) and not f.endswith(".gz"):
            text = Path(f).read_text(errors="replace")
            named |= set(re.findall(r"/usr/(?:share|lib)/alfwrapper/[\w./@-]*\w", text))
    assert len(named) >= 5 and not {p for p in named if not os.path.exists(p)}, named
    # Completion as bash-completion loads it, in a real bash.
    completes = sh(
        "bash",
        "--norc",
        "-c",
        ". /usr/share/bash-completion/completions/alfwrapper && complete -p alfwrapper",
    ).stdout
    assert "_shtab_alfwrapper alfwrapper" in completes, completes
    assert not [f for f in package if f.startswith(("/etc", "/usr/local", str(ROOT)))]
    # No unit is enabled (no links under /etc/systemd/system) or started.
    assert not list(Path("/etc/systemd/system").rglob("alfwrapper*"))
    assert not (MODULES / "build").exists()
    version = sh("/usr/bin/alfwrapper", "--version").stdout
    assert version.strip() == "alfwrapper 0.1.0", version
    where = sh("/usr/bin/python3", "-c", "import alfwrapper; print(alfwrapper.__file__)").stdout
    assert where.startswith("/usr/lib/python3/dist-packages/"), where
    # The checkout's virtualenv still runs the checkout, not the package beside it (its
    # editable install is a path ahead of dist-packages: scripts/setup-host.sh).
    venv = sh(str(ROOT / ".venv/bin/python"), "-c", "import alfwrapper; print(alfwrapper.__file__)")
    assert venv.stdout.startswith(f"{ROOT}/alfwrapper/"), venv.stdout
    doctor = sh("/usr/bin/alfwrapper", "doctor", check=False)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert sh("man", "-w", "alfwrapper-loader").stdout.strip().endswith("alfwrapper-loader.8.gz")

    # Every unit as installed: verify passes, and every service's exposure is at most 3.0.
    units = sorted(f for f in package if f.startswith("/usr/lib/systemd/system/"))
    assert len(units) >= 10
    verify = sh("systemd-analyze", "verify", *units, check=False)
    assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr
    for unit in units:
        if unit.endswith(".service"):
            security = sh(
                "systemd-analyze", "security", "--offline=true", "--threshold=30", unit, check=False
            )
            assert security.returncode == 0, security.stdout.splitlines()[-1:]

    # A filtered service, from /usr/bin/alfwrapper and the packaged example.
    svc = Service(
        network.server,
        ["/usr/bin/alfwrapper", "--listen", ":8080", "--allow", "192.0.2.0/24",
         "--allow", "2001:db8:a::/48", "--", "/usr/bin/python3",
         "/usr/share/alfwrapper/echo_server.py"],
    )  # fmt: skip
    try:
        wait_listening(network.server, 8080)
        check_policy(
            svc,
            served=[Probe(network.allowed, "tcp", 4, 8080), Probe(network.allowed, "tcp", 6, 8080)],
            dropped=[Probe(network.denied, "tcp", 4, 8080), Probe(network.denied, "tcp", 6, 8080)],
        )
    finally:
        svc.stop()

    # Removed: none of its files is left.
    sh("apt-get", "remove", "-y", "alfwrapper")
    assert [f for f in package if os.path.lexists(f)] == []
    for folder in (
        "/usr/lib/alfwrapper",
        "/usr/share/alfwrapper",
        "/var/lib/alfwrapper",
        "/usr/lib/python3/dist-packages/alfwrapper",
    ):
        assert not os.path.lexists(folder), folder
    sh("dpkg", "--purge", "alfwrapper")  # nothing left to purge: it has no conffiles
    assert not installed()
