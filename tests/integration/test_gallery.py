"""Debian's own daemons behind alfwrapper, from the example units in examples/units/,
under a real systemd manager, with real clients on an allowed and a denied host:
OpenSSH's `sshd -i` and `git daemon --inetd` (inetd style, Accept=yes) and
tftpd-hpa's in.tftpd (a datagram socket on stdin).  lighttpd and
systemd-socket-proxyd have theirs in test_real_apps.py and test_systemd.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hosts import Host, Network, Service
from managers import UnitLog, UserManager, installed_unit, wait_until
from support import ROOT, WRAPPER

GALLERY = ROOT / "examples/units"
HOST_KEY = Path("/etc/ssh/ssh_host_ed25519_key.pub")


def start(manager: UserManager, socket: str, service: str, edit: str = "") -> UnitLog:
    """Install a gallery unit pair (the service's ExecStart= with ``edit`` added before
    --policy), start the socket; the service's stderr, read from its file."""
    for unit in (socket, service):
        text = installed_unit((GALLERY / unit).read_text())
        if edit:
            text = text.replace(" --policy", f" {edit} --policy")
        (manager.units / unit).write_text(text)
    log = errors_to_file(manager, service)
    manager.run("daemon-reload")
    manager.run("start", socket)
    return log


def wait_denied(log: UnitLog, command: str, count: int) -> None:
    """Until the wrapper has said ``count`` times that it reset a denied peer."""
    line = f"denied and reset; {command} not started"
    wait_until(lambda: log.errors().count(line) == count, log.errors)


def errors_to_file(manager: UserManager, unit: str) -> UnitLog:
    """The unit's stderr to a file (no journal here); its stdout stays the socket."""
    path = manager.logs / f"{unit}.err"
    path.touch()
    dropin = manager.units / f"{unit}.d"
    dropin.mkdir(exist_ok=True)
    (dropin / "log.conf").write_text(f"[Service]\nStandardError=append:{path}\n")
    return UnitLog(path)


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


def test_sshd_inetd_style_under_systemd(
    network: Network, manager: UserManager, sshd_ready: None
) -> None:
    log = start(manager, "alfwrapper-sshd.socket", "alfwrapper-sshd@.service")
    check_ssh(network)
    wait_denied(log, "/usr/sbin/sshd", 2)


def test_sshd_needs_the_capabilities_its_unit_gives(
    network: Network, manager: UserManager, sshd_ready: None
) -> None:
    """With --no-capabilities (alfwrapper's old way) sshd's privilege separation fails:
    the banner comes, the key exchange does not."""
    start(manager, "alfwrapper-sshd.socket", "alfwrapper-sshd@.service", "--no-capabilities")
    out = keyscan(network.allowed, network.allowed.server_v4)
    assert "SSH-2.0-OpenSSH" in out.stderr, out.stderr
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


def test_denied_ssh_clients_racing_allowed_ones_get_nothing(
    network: Network, manager: UserManager, sshd_ready: None
) -> None:
    """Denied peers that talk first (their own banner, then junk) and reset, mixed with
    allowed ones: every allowed one completes the key exchange, no denied one hears a
    byte from sshd."""
    log = start(manager, "alfwrapper-sshd.socket", "alfwrapper-sshd@.service")
    a, b = network.allowed, network.denied
    talker = (
        "import socket, sys\n"
        "s = socket.create_connection((sys.argv[1], 22), timeout=20)\n"
        "s.sendall(b'SSH-2.0-evil\\r\\n' + b'A' * 4000)\n"
        "got = b''\n"
        "try:\n"
        "    while chunk := s.recv(4096):\n"
        "        got += chunk\n"
        "except OSError as err:\n"
        "    print('closed', type(err).__name__)\n"
        "print('received', len(got), got[:40])\n"
    )

    def denied(i: int) -> str:
        address = b.server_v4 if i % 2 else b.server_v6
        return subprocess.run(
            b.command([shutil.which("python3") or "python3", "-c", talker, address]),
            capture_output=True, text=True, timeout=30,
        ).stdout  # fmt: skip

    def allowed(i: int) -> str:
        # Every connection starts a wrapper that compiles its filter: with seven at
        # once on two cores, a key exchange may wait well past keyscan's usual 5 s.
        return keyscan(a, a.server_v4 if i % 2 else a.server_v6, wait=30).stdout

    with ThreadPoolExecutor(7) as pool:
        bad = [pool.submit(denied, i) for i in range(4)]
        good = [pool.submit(allowed, i) for i in range(3)]
        for future in bad:
            out = future.result()
            assert "received 0 b''" in out, out
        for future in good:
            assert host_key() in future.result()
    wait_denied(log, "/usr/sbin/sshd", 4)


@pytest.fixture
def git_repo() -> Iterator[str]:
    """A bare repository with one commit under /srv/git, exported; its name."""
    base = Path("/srv/git")
    made = not base.exists()
    base.mkdir(exist_ok=True)
    name = f"alf-{uuid.uuid4().hex[:8]}.git"
    work = base / f"{name}.work"
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}  # fmt: skip
    for argv in (["git", "init", "-q", str(work)],
                 ["git", "-C", str(work), "commit", "-q", "--allow-empty", "-m", "gallery"],
                 ["git", "clone", "-q", "--bare", str(work), str(base / name)]):  # fmt: skip
        subprocess.run(argv, check=True, env=env, timeout=60)
    (base / name / "git-daemon-export-ok").touch()
    head = subprocess.run(["git", "-C", str(work), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True, timeout=60).stdout.strip()  # fmt: skip
    try:
        yield f"{name} {head}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(base / name, ignore_errors=True)
        if made:
            shutil.rmtree(base, ignore_errors=True)


def url(scheme: str, address: str, path: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}/{path}"


def client(host: Host, *argv: str) -> subprocess.CompletedProcess[str]:
    """A client command on host, bounded in time."""
    return subprocess.run(
        host.command(["timeout", "10", *argv]), capture_output=True, text=True, timeout=30
    )


def ls_remote(host: Host, address: str, repo: str) -> subprocess.CompletedProcess[str]:
    return client(host, "git", "ls-remote", url("git", address, repo))


def test_git_daemon_inetd_style_under_systemd(
    network: Network, manager: UserManager, git_repo: str
) -> None:
    repo, head = git_repo.split()
    log = start(manager, "alfwrapper-git.socket", "alfwrapper-git@.service")
    a, b = network.allowed, network.denied
    for address in (a.server_v4, a.server_v6):
        out = ls_remote(a, address, repo)
        assert f"{head}\tHEAD" in out.stdout, (out, log.output())
    for address in (b.server_v4, b.server_v6):
        out = ls_remote(b, address, repo)
        assert out.returncode != 0 and head not in out.stdout, out
    wait_denied(log, "/usr/bin/git", 2)


@pytest.fixture
def tftp_file() -> Iterator[tuple[str, str]]:
    """A file in /srv/tftp (tftpd-hpa's folder): its name and content."""
    folder = Path("/srv/tftp")
    assert folder.is_dir(), "no /srv/tftp: `make setup` installs tftpd-hpa"
    name, content = f"alf-{uuid.uuid4().hex[:8]}.txt", f"served {uuid.uuid4().hex}\n"
    (folder / name).write_text(content)
    try:
        yield name, content
    finally:
        (folder / name).unlink()


def fetch(host: Host, address: str, name: str, wait: int = 4) -> str:
    """What curl gets over TFTP in ``wait`` seconds (a denied client gets nothing)."""
    return client(host, "curl", "-s", "--max-time", str(wait), url("tftp", address, name)).stdout


def test_tftpd_datagram_socket_on_stdin_under_systemd(
    network: Network, manager: UserManager, tftp_file: tuple[str, str]
) -> None:
    name, content = tftp_file
    log = start(manager, "alfwrapper-tftp.socket", "alfwrapper-tftp.service")
    a, b = network.allowed, network.denied
    # The denied host's request starts the service; it is dropped before in.tftpd reads.
    assert fetch(b, b.server_v4, name, wait=2) == ""
    wait_until(lambda: "removed 1 from denied sources" in log.output(), log.output)
    for address in (a.server_v4, a.server_v6):
        assert fetch(a, address, name) == content, log.output()
    for address in (b.server_v4, b.server_v6):
        assert fetch(b, address, name, wait=2) == ""
