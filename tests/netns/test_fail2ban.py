"""The shipped fail2ban actions, driven by fail2ban's own server and client: a ban denies
live, an unban revokes; through the service's runtime rules, or a named set."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.hosts import Network, Probe, Service, check_policy
from helpers.support import ECHO_SERVER, ROOT, WRAPPER

pytestmark = pytest.mark.netns


@pytest.mark.parametrize("mode", ["runtime", "set"])
def test_fail2ban_bans_and_unbans_through_alfwrapper(
    network: Network, services: list[Service], tmp_path: Path, mode: str
) -> None:
    if shutil.which("fail2ban-server") is None:
        pytest.fail("fail2ban is missing: `make setup` installs it")
    a, b = network.allowed, network.denied
    service, named = f"f2b-{mode}", f"f2b{os.getpid()}"
    action, options, banned = "alfwrapper", [], lambda: "deny 198.51.100.2/32" in run_show(service)
    if mode == "set":
        action, options = "alfwrapper-set", ["--deny-set", named]
        banned = lambda: "198.51.100.2/32" in run([*WRAPPER, "set", "list", named])  # noqa: E731
        run([*WRAPPER, "set", "create", named])
    svc_argv = [*WRAPPER, "--service", service, "--listen", "[::]:8080", "--deny",
                "203.0.113.0/24", *options, "--", *ECHO_SERVER]  # fmt: skip
    svc = Service(network.server, svc_argv)
    services.append(svc)
    svc.wait_for(r"^ready ")
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080), Probe(b, "tcp", 4, 8080)], dropped=[])
    conf = tmp_path / "fail2ban"
    (conf / "action.d").mkdir(parents=True)
    (conf / "filter.d").mkdir()
    shutil.copy(ROOT / f"examples/fail2ban/{action}.conf", conf / f"action.d/{action}.conf")
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
        + (
            f"action = alfwrapper[service={service}]\n"
            if mode == "runtime"
            else f"action = alfwrapper-set[set={named}]\n"
        )
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
        while not banned():
            assert time.monotonic() < deadline, (tmp_path / "fail2ban.log").read_text()
            time.sleep(0.2)
        check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(b, "tcp", 4, 8080)])
        # A reload of the service (fail2ban knows nothing of it) keeps the ban, and so
        # does a restart (new sockets, and a gc while it is down).
        reloaded = subprocess.run(
            [*WRAPPER, "reload", service], capture_output=True, text=True, timeout=120
        )
        assert reloaded.returncode == 0, reloaded.stderr
        check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(b, "tcp", 4, 8080)])
        svc.stop()
        services.remove(svc)
        run([*WRAPPER, "gc"])
        svc = Service(network.server, svc_argv)
        services.append(svc)
        svc.wait_for(r"^ready ")
        check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(b, "tcp", 4, 8080)])
        out = subprocess.run(
            [*client, "set", "app", "unbanip", "198.51.100.2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        deadline = time.monotonic() + 30
        while banned():
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
        if mode == "set":
            run([*WRAPPER, "set", "destroy", named])


def run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout


def run_show(service: str) -> str:
    return run([*WRAPPER, "show", service])
