"""alfwrapper in front of socket-activated servers nobody here wrote."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.hosts import Host, Network, Service, wait_listening
from helpers.support import ECHO_SERVER, ROOT, WRAPPER
from helpers.wrapping import start

pytestmark = pytest.mark.netns

PROXYD = "/lib/systemd/systemd-socket-proxyd"


def http_get(host: Host, family: int, port: int, path: str, timeout: float) -> str:
    """The body of GET path, "timeout", or "error: ...", fetched from inside host."""
    target = host.server_v4 if family == 4 else f"[{host.server_v6}]"
    code = (
        "import sys, urllib.request\n"
        f"try: print(urllib.request.urlopen('http://{target}:{port}{path}', "
        f"timeout={timeout}).read().decode().strip())\n"
        "except Exception as e: print('timeout' if 'timed out' in str(e) else f'error: {e}')\n"
    )
    out = subprocess.run(
        host.command([sys.executable, "-c", code]),
        capture_output=True,
        text=True,
        timeout=timeout + 30,
    )
    return out.stdout.strip()


def test_systemd_socket_proxyd(network: Network, services: list[Service]) -> None:
    a, b = network.allowed, network.denied
    assert os.path.exists(PROXYD), "systemd-socket-proxyd is part of Debian's systemd"
    # The backend: the echo service on the server's loopback only, unfiltered.
    backend = start(network, services, [*WRAPPER, "--listen", "127.0.0.1:9000", "--", *ECHO_SERVER])
    start(
        network,
        services,
        [
            *WRAPPER,
            "--listen",
            "[::]:8085",
            "--allow",
            "192.0.2.0/24",
            "--allow",
            "2001:db8:a::/48",
            "--",
            PROXYD,
            "127.0.0.1:9000",
        ],
        ready=False,
    )
    wait_listening(network.server, 8085)
    for family in (4, 6):
        assert a.probe("tcp", family, 8085, f"via-proxy-{family}", timeout=15) == "echo"
        assert b.probe("tcp", family, 8085, f"denied-{family}", timeout=1.5) == "timeout"
    # The backend saw the allowed host's lines (from the proxy), never the denied host's.
    assert backend.received("tcp", "127.0.0.1", "via-proxy-4")
    assert backend.received("tcp", "127.0.0.1", "via-proxy-6")
    assert "denied-" not in backend.output()


def test_lighttpd(network: Network, services: list[Service], tmp_path: Path) -> None:
    a, b = network.allowed, network.denied
    lighttpd = shutil.which("lighttpd") or "/usr/sbin/lighttpd"
    assert os.path.exists(lighttpd), "lighttpd is missing: `make setup` installs it"
    shutil.copytree(ROOT / "examples/lighttpd/www", tmp_path / "www")
    conf = ROOT / "examples/lighttpd/lighttpd.conf"
    svc = Service(
        network.server,
        [
            *WRAPPER,
            "--listen",
            "[::]:8088",
            "--policy",  # the shipped policy, as its unit uses it
            str(ROOT / "policies/alfwrapper-lighttpd.toml"),
            "--",
            lighttpd,
            "-D",
            "-f",
            str(conf),
        ],
        env={"LIGHTTPD_ROOT": str(tmp_path)},
    )
    services.append(svc)
    expected = "hello from lighttpd behind alfwrapper"
    wait_listening(network.server, 8088)
    for family in (4, 6):
        assert http_get(a, family, 8088, f"/?from-allowed-{family}", 15) == expected, svc.errors()
        assert http_get(b, family, 8088, f"/?from-denied-{family}", 1.5) == "timeout"
    log = (tmp_path / "access.log").read_text()
    assert a.v4 in log and a.v6 in log and "from-allowed-4" in log
    assert b.v4 not in log and b.v6 not in log and "from-denied" not in log
