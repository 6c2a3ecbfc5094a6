"""The shipped fail2ban action, driven by fail2ban's own server and client: a ban denies
live, an unban revokes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hosts import Network, Probe, Service, check_policy
from support import ECHO_SERVER, ROOT, WRAPPER


def test_fail2ban_bans_and_unbans_through_alfwrapper(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    if shutil.which("fail2ban-server") is None:
        pytest.fail("fail2ban is missing: `make setup` installs it")
    a, b = network.allowed, network.denied
    svc = Service(
        network.server,
        [*WRAPPER, "--service", "f2b", "--listen", "[::]:8080", "--deny", "203.0.113.0/24",
         "--", *ECHO_SERVER],
    )  # fmt: skip
    services.append(svc)
    svc.wait_for(r"^ready ")
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080), Probe(b, "tcp", 4, 8080)], dropped=[])
    conf = tmp_path / "fail2ban"
    (conf / "action.d").mkdir(parents=True)
    (conf / "filter.d").mkdir()
    shutil.copy(ROOT / "examples/fail2ban/alfwrapper.conf", conf / "action.d/alfwrapper.conf")
    app_log = tmp_path / "app.log"
    app_log.write_text("")
    (conf / "fail2ban.conf").write_text(
        f"[Definition]\nloglevel = INFO\nlogtarget = {tmp_path}/fail2ban.log\n"
        f"socket = {tmp_path}/f2b.sock\npidfile = {tmp_path}/f2b.pid\ndbfile = :memory:\n"
    )
    (conf / "filter.d/app.conf").write_text(
        "[Definition]\nfailregex = ^bad login from <HOST>$\ndatepattern = {NONE}\n"
    )
    (conf / "jail.conf").write_text(
        "[DEFAULT]\nbackend = polling\n\n[app]\nenabled = true\nfilter = app\n"
        f"logpath = {app_log}\nmaxretry = 2\nfindtime = 600\nbantime = 600\n"
        "action = alfwrapper[service=f2b]\n"
    )
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    server = subprocess.Popen(
        ["fail2ban-server", "-f", "-x", "-c", str(conf)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = ["fail2ban-client", "-c", str(conf)]
    try:
        deadline = time.monotonic() + 30
        while subprocess.run([*client, "ping"], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "fail2ban-server did not come up"
            time.sleep(0.2)
        with app_log.open("a") as log:
            log.write("bad login from 198.51.100.2\nbad login from 198.51.100.2\n")
        deadline = time.monotonic() + 30
        while "deny 198.51.100.2/32" not in run_show():
            assert time.monotonic() < deadline, (tmp_path / "fail2ban.log").read_text()
            time.sleep(0.2)
        check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(b, "tcp", 4, 8080)])
        out = subprocess.run([*client, "set", "app", "unbanip", "198.51.100.2"], env=env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert out.returncode == 0, out.stderr
        deadline = time.monotonic() + 30
        while "deny 198.51.100.2/32" in run_show():
            assert time.monotonic() < deadline, (tmp_path / "fail2ban.log").read_text()
            time.sleep(0.2)
        check_policy(svc, served=[Probe(b, "tcp", 4, 8080)], dropped=[])
    finally:
        subprocess.run([*client, "stop"], capture_output=True, timeout=60)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def run_show() -> str:
    return subprocess.run(
        [*WRAPPER, "show", "f2b"], capture_output=True, text=True, timeout=60
    ).stdout
