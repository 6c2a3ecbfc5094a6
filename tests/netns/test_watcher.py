"""The interface watcher against its own application: it cannot be signalled by it (not
even by a root one that keeps CAP_KILL and CAP_SETUID), and if it dies anyway the
socket's interface rules fail closed."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from helpers.hosts import Network, Probe, Service, check_policy
from helpers.support import ECHO_SERVER, WRAPPER

pytestmark = pytest.mark.netns

# Run as the application (uid 0, with the capabilities root's unit gives, CAP_KILL and
# CAP_SETUID among them): find the watcher by the name ps shows (alfwrapper-watch
# SERVICE), try to stop it, then again as the watcher's own user, say what happened,
# then become the echo service.
APP = """
import os, signal, sys
name = sys.argv[1]
pids = [p for p in os.listdir('/proc') if p.isdigit()]
def cmdline(p):
    try:
        return open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')
    except OSError:
        return [b'']
watcher = [int(p) for p in pids if cmdline(p)[0].startswith(b'alfwrapper-watch ' + name.encode())]
results = []
for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):
    try:
        os.kill(watcher[0], sig)
        results.append(f'{sig.name}:sent')
    except OSError as err:
        results.append(f'{sig.name}:{err.errno}')
child = os.fork()
if child == 0:
    uid = os.stat(f'/proc/{watcher[0]}').st_uid
    try:
        os.setresuid(uid, uid, uid)
        os.kill(watcher[0], signal.SIGSTOP)
        os._exit(0)
    except OSError as err:
        os._exit(err.errno)
results.append(f'as-its-user:{os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])}')
print('watcher', watcher[0], ' '.join(results), flush=True)
os.execv(sys.argv[2], sys.argv[2:])
"""


def status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def test_application_cannot_stop_the_watcher_and_its_death_closes_the_socket(
    network: Network, services: list[Service]
) -> None:
    a, b = network.allowed, network.denied
    name = a.server_if
    svc = Service(
        network.server,
        [
            *WRAPPER,
            "--service",
            "guarded",
            "--listen",
            "[::]:8080",
            "--interface",
            name,
            "--",
            sys.executable,
            "-c",
            APP,
            "guarded",  # the watcher is `alfwrapper-watch guarded` in ps
            *ECHO_SERVER,
        ],
    )
    services.append(svc)
    match = svc.wait_for(r"^watcher (\d+) (.*)$")
    svc.wait_for(r"^ready ")
    watcher = int(match.group(1))
    # EPERM (1) for every signal, even as the watcher's own user: Landlock lets the
    # application signal only what it started.
    assert match.group(2) == "SIGKILL:1 SIGSTOP:1 SIGTERM:1 as-its-user:1", svc.output()
    info = status(watcher)
    assert info["State"].split()[0] in ("S", "R"), info["State"]
    assert info["Uid"].split()[0] != "0", info["Uid"]
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[Probe(b, "tcp", 4, 8080)])
    # Killed anyway (here by root): no interface passes any more, not the old ones.
    os.kill(watcher, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{watcher}").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.2)  # the kernel empties the program array from a work queue
    check_policy(svc, served=[], dropped=[Probe(a, "tcp", 4, 8080), Probe(a, "tcp", 6, 8080)])
    assert svc.proc.poll() is None, "the application itself is untouched"


def test_a_stopped_watcher_closes_the_socket(
    network: Network, services: list[Service], readable_copy: Path
) -> None:
    """As a DynamicUser= unit runs it (an unprivileged user with CAP_BPF alone), the
    watcher runs as the application's own user, which may signal it.  Stopped
    (SIGSTOP), it stops renewing its lease, and within the lease every packet is
    dropped; continued, it renews, and the allowed interface is served again."""
    a = network.allowed
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
              "--inh-caps=-all,+bpf", "--ambient-caps=+bpf"]  # fmt: skip
    svc = Service(
        network.server,
        [*nobody, "/usr/bin/python3", "-m", "alfwrapper", "--service", "stoppable", "--listen",
         "[::]:8080", "--interface", a.server_if, "--", "/usr/bin/python3",
         str(readable_copy / "echo_server.py")],
        env={"PYTHONPATH": str(readable_copy)},
    )  # fmt: skip
    services.append(svc)
    svc.wait_for(r"^ready ")
    check_policy(svc, served=[Probe(a, "tcp", 4, 8080)], dropped=[])
    (watcher,) = [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit() and cmdline(p) == b"alfwrapper-watch stoppable"
    ]
    assert status(watcher)["Uid"].split()[0] == "65534"  # the application's own user
    os.kill(watcher, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 15
        while a.probe("tcp", 4, 8080, "stopped", timeout=1.0) == "echo":
            assert time.monotonic() < deadline, "a stopped watcher left the socket open"
    finally:
        os.kill(watcher, signal.SIGCONT)
    deadline = time.monotonic() + 15
    while a.probe("tcp", 4, 8080, "again", timeout=1.0) != "echo":
        assert time.monotonic() < deadline, "the watcher, continued, did not open it again"


def cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return b""
