"""The package as installed, away from the checkout: the wheel carries the filters."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.support import ROOT

pytestmark = pytest.mark.release


def test_installed_wheel_finds_its_filters(bpf_root: None, tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    venv = tmp_path / "venv"
    subprocess.run(
        ["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], check=True
    )
    python = venv / "bin/python"
    wheel = next(wheels.glob("alfwrapper-*.whl"))
    # Without PYTHONPATH: a checkout on it (make mutate's) would look installed already.
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean,
    )
    assert install.returncode == 0, install.stderr
    # From elsewhere, with nothing of the checkout on the path.
    out = subprocess.run(
        [str(python), "-m", "alfwrapper", "check", "--allow", "192.0.2.0/24", "--print-filter"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    filters = venv / "lib/python3.11/site-packages/alfwrapper/filters"
    assert f'#line 1 "{filters}/subnets.c"' in out.stdout
    assert str(ROOT) not in out.stdout


def make(*args: str, stubs: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if stubs is not None:
        env["PATH"] = f"{stubs}:{env['PATH']}"
    return subprocess.run(
        ["make", "-s", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=600, env=env
    )


def user_stubs(tmp_path: Path) -> tuple[Path, Path]:
    """systemd-sysusers (which makes the system users) noting only how it was called."""
    stubs, calls = tmp_path / "stubs", tmp_path / "sysusers-calls"
    stubs.mkdir()
    (stubs / "systemd-sysusers").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    return stubs, calls


def test_make_install_runs_away_from_the_checkout_and_uninstalls(
    bpf_root: None, tmp_path: Path
) -> None:
    prefix = tmp_path / "prefix"
    stubs, sysusers = user_stubs(tmp_path)
    out = make("install", f"PREFIX={prefix}", stubs=stubs)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "systemctl daemon-reload" in out.stdout  # a real install says what to do next
    made = prefix / "lib/sysusers.d/alfwrapper.conf"  # the installed file, not the checkout's
    assert sysusers.read_text().split() == [str(made)]
    assert made.read_text() == (ROOT / "sysusers/alfwrapper.conf").read_text()
    sysusers.unlink()
    installed = [p for p in prefix.rglob("*") if p.is_file()]
    for path in installed:
        assert str(ROOT) not in path.read_text(errors="replace"), path
    completion = prefix / "share/bash-completion/completions/alfwrapper"
    assert "complete -o filenames -F _shtab_alfwrapper alfwrapper" in completion.read_text()
    units = prefix / "lib/systemd/system"
    echo = (units / "alfwrapper-echo.service").read_text()
    assert f"ExecStart={prefix}/bin/alfwrapper --no-capabilities --policy" in echo
    assert f"{prefix}/share/alfwrapper/echo_server.py" in echo and "/usr/bin/alfwrapper" not in echo
    env = {"PATH": "/usr/bin:/bin"}
    launcher = str(prefix / "bin/alfwrapper")
    version = subprocess.run(
        [launcher, "--version"], capture_output=True, text=True, cwd="/", env=env, timeout=60
    )
    assert version.stdout.strip() == "alfwrapper 0.1.0", version.stderr
    # PYTHONPATH cannot slip code into what a root service runs (the launcher runs
    # python3 -I): a sitecustomize.py there would run first.
    hijack = tmp_path / "hijack"
    hijack.mkdir()
    (hijack / "sitecustomize.py").write_text(f"open({str(tmp_path / 'hijacked')!r}, 'w')\n")
    check = subprocess.run(
        [launcher, "check", "--allow", "192.0.2.0/24", "--print-filter"],
        capture_output=True,
        text=True,
        cwd="/",
        env={**env, "PYTHONPATH": str(hijack)},
        timeout=120,
    )
    filters = prefix / "lib/alfwrapper/python/alfwrapper/filters"
    assert check.returncode == 0 and f'#line 1 "{filters}/subnets.c"' in check.stdout, check.stderr
    assert not (tmp_path / "hijacked").exists()
    out = make("uninstall", f"PREFIX={prefix}")
    assert out.returncode == 0, out.stderr
    assert [p for p in prefix.rglob("*") if not p.is_dir()] == []

    # Under DESTDIR: the files only, nothing done to this host, no advice meant for it.
    dest = tmp_path / "dest"
    out = make("install", f"DESTDIR={dest}", "PREFIX=/usr/local", stubs=stubs)
    assert out.returncode == 0, out.stderr
    assert not sysusers.exists()  # no user made
    assert "daemon-reload" not in out.stdout and f"installed under {dest}/usr/local" in out.stdout
    assert (dest / "usr/local/bin/alfwrapper").is_file()
    assert (
        "/usr/local/bin/alfwrapper --no-capabilities --policy"
        in (dest / "usr/local/lib/systemd/system/alfwrapper-echo.service").read_text()
    )
