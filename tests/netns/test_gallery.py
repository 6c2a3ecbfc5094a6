"""OpenSSH's `sshd -i` behind alfwrapper, inetd style, from systemd-socket-activate
--inetd, with real clients on an allowed and a denied host.  The gallery's units
(examples/units/: sshd, git daemon, in.tftpd) run under a booted systemd in the boot
tier (tests/boot/test_units.py, test_lifecycle.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers.hosts import Host, Network, Service
from helpers.managers import wait_until
from helpers.support import ROOT, WRAPPER

pytestmark = pytest.mark.netns

HOST_KEY = Path("/etc/ssh/ssh_host_ed25519_key.pub")


def wait_denied(log: Service, command: str, count: int) -> None:
    """Until the wrapper has said ``count`` times that it reset a denied peer."""
    line = f"denied and reset; {command} not started"
    wait_until(lambda: log.errors().count(line) == count, log.errors)


def keyscan(
    host: Host, address: str, port: int = 22, wait: int = 5
) -> subprocess.CompletedProcess[str]:
    """ssh-keyscan: the server's banner (stderr) and, after a key exchange, its host key."""
    return subprocess.run(
        host.command(["ssh-keyscan", "-T", str(wait), "-t", "ed25519", "-p", str(port), address]),
        capture_output=True,
        text=True,
        timeout=wait + 30,
    )


def host_key() -> str:
    return HOST_KEY.read_text().split()[1]


@pytest.fixture
def sshd_ready() -> None:
    """What Debian's ssh.service prepares (RuntimeDirectory=sshd; under a user manager
    that would be in its own runtime folder) and the host keys its package made."""
    assert HOST_KEY.exists(), "no SSH host key: `make setup` installs openssh-server"
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)


def check_ssh(network: Network, port: int = 22) -> None:
    a, b = network.allowed, network.denied
    for address in (a.server_v4, a.server_v6):
        out = keyscan(a, address, port)
        assert "SSH-2.0-OpenSSH" in out.stderr, out.stderr
        assert host_key() in out.stdout, (out.stdout, out.stderr)  # the key exchange done
    for address in (b.server_v4, b.server_v6):
        out = keyscan(b, address, port)
        assert "SSH-2.0" not in out.stderr + out.stdout, out
        assert host_key() not in out.stdout


def test_sshd_from_systemd_socket_activate_inetd(
    network: Network, services: list[Service], sshd_ready: None
) -> None:
    svc = Service(
        network.server,
        ["systemd-socket-activate", "--inetd", "-a", "-l", "2222",
         "-E", f"ALFWRAPPER_POLICY_PATH={ROOT / 'policies'}",
         *WRAPPER, "--policy", "alfwrapper-sshd", "--", "/usr/sbin/sshd", "-i"],
    )  # fmt: skip
    services.append(svc)
    wait_until(lambda: "Listening on" in svc.errors(), svc.errors)
    check_ssh(network, 2222)
    wait_denied(svc, "/usr/sbin/sshd", 2)
