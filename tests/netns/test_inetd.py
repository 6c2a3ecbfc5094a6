"""inetd style (a socket on fd 0, no LISTEN_FDS), as systemd-socket-activate --inetd
hands it over: what a peer receives, what starts, what fd 0 may be."""

from __future__ import annotations

import hashlib
import marshal
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers.hosts import Host, Network, Service
from helpers.managers import wait_until
from helpers.support import WRAPPER

from alfwrapper.lifecycle import verdicts
from alfwrapper.policy.prefixes import Prefix

pytestmark = pytest.mark.netns

APP = "import sys; sys.stderr.write('app stderr\\n'); sys.stderr.flush(); print('app stdout')"


def activate(network: Network, services: list[Service], port: int, *argv: str) -> Service:
    svc = Service(
        network.server, ["systemd-socket-activate", "--inetd", "-a", "-l", str(port), *argv]
    )
    services.append(svc)
    wait_until(lambda: "Listening on" in svc.errors(), svc.errors)
    return svc


def receive(host_command: list[str], address: str, port: int) -> str:
    code = (
        "import socket, sys\n"
        "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)\n"
        "got = b''\n"
        "try:\n"
        "    while chunk := s.recv(4096):\n"
        "        got += chunk\n"
        "except OSError as err:\n"
        "    got += f'<{type(err).__name__}>'.encode()\n"
        "print(repr(got.decode()))\n"
    )
    out = subprocess.run(
        [*host_command, sys.executable, "-c", code, address, str(port)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout.strip()


@pytest.mark.parametrize("case", ["served", "bad option", "help", "exec fails", "library output"])
def test_the_wrappers_messages_never_reach_the_peer(
    network: Network, services: list[Service], tmp_path: Path, case: str
) -> None:
    """With stdout and stderr the connection (a unit that leaves StandardError= to
    inherit), alfwrapper's own lines (the note that the socket has no rules, a usage
    error, its help on stdout, a command that cannot be executed) and what a library
    prints (BCC writes "Unable to find kernel headers" to stdout) stay off it; the
    application's stdout and stderr are the connection again, as the unit asked."""
    a = network.allowed
    broken = tmp_path / "broken"
    broken.write_text("#!/nonexistent/interpreter\n")
    broken.chmod(0o755)
    head: list[str] = []
    tail = ["--allow", "192.0.2.0/24", "--"]
    if case == "served":
        tail = ["--", sys.executable, "-c", APP]
    elif case == "bad option":
        tail = ["--no-such-option", "--", "true"]
    elif case == "help":  # on stdout, the one thing the wrapper itself prints there
        tail = ["--help"]
    elif case == "exec fails":
        tail = ["--", str(broken)]
    else:  # BCC finds no headers there, says so on stdout, and the wrapper fails.  (The
        # connection itself is judged without BCC: a created socket makes it compile.)
        head = ["env", f"BCC_KERNEL_SOURCE={tmp_path}"]
        tail = ["--listen", "127.0.0.1:7190", *tail, "true"]
    activate(
        network, services, 7100, "/bin/sh", "-c", 'exec "$@" 2>&1', "sh", *head, *WRAPPER, *tail
    )
    got = receive(a.command([]), a.server_v4, 7100)
    assert got == repr("app stderr\napp stdout\n" if case == "served" else ""), got


def test_a_peer_gone_before_the_filter_starts_nothing(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """A denied and an allowed peer each connect, send and reset at once, before the
    wrapper looks: neither can be judged, so the command never starts."""
    marker = tmp_path / "started"
    svc = activate(
        network, services, 7101,
        *WRAPPER, "--allow", "192.0.2.0/24", "--", sys.executable, "-c",
        f"open({str(marker)!r}, 'a').write('started\\n')",
    )  # fmt: skip
    resetter = (
        "import socket, struct, sys\n"
        "s = socket.create_connection((sys.argv[1], 7101), timeout=5)\n"
        "s.sendall(b'EVIL')\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))\n"
        "s.close()\n"
    )
    for host in (network.denied, network.allowed):
        subprocess.run(
            host.command([sys.executable, "-c", resetter, host.server_v4]), check=True, timeout=30
        )
    wait_until(
        lambda: svc.errors().count("a peer that has already reset it denied and reset") == 2,
        svc.errors,
        timeout=30,
    )
    time.sleep(0.5)
    assert not marker.exists()


# What a denied Accept=yes peer's wrapper must not import (lifecycle/wrapper.py).
# Nor what only a start that goes on, or another command, needs: shutil (which
# argparse would import for the width of help), ctypes (privileges), json.
HEAVY = ("bcc", "numpy", "pyroute2", "tomllib", "alfwrapper.bpf", "alfwrapper.state",
         "alfwrapper.loader", "alfwrapper.observe", "alfwrapper.lifecycle.launch",
         "alfwrapper.lifecycle.programs", "alfwrapper.host.privileges", "shutil",
         "ctypes", "json")  # fmt: skip


def imports(errors: str) -> list[str]:
    """The modules that -X importtime says were imported."""
    return [
        line.rsplit("|", 1)[-1].strip()
        for line in errors.splitlines()
        if line.startswith("import time:")
    ]


def test_a_connection_is_judged_without_bcc(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """Accept=yes: every packet of the connection comes from its one peer, and only subnet
    rules apply, so the wrapper judges the peer by its rules and compiles nothing: a
    denied peer costs no compile (neither BCC nor numpy is imported), and the verdict is the
    kernel's (explain's) for the same addresses.  The allowed peer is served; the
    denied one's connection is reset, and the command never starts for it."""
    marker = tmp_path / "started"
    rules = ["--allow", "192.0.2.0/24", "--allow", "2001:db8:a::/48", "--deny", "192.0.2.7"]
    svc = activate(
        network, services, 7102, "env", "ALFWRAPPER_CACHE=off",  # judged in full, every time
        sys.executable, "-X", "importtime", "-m", "alfwrapper", *rules, "--", sys.executable,
        "-c", f"import sys; open({str(marker)!r}, 'a').write('started\\n'); print('served')",
    )  # fmt: skip
    a, b = network.allowed, network.denied
    assert receive(b.command([]), b.server_v4, 7102) in (repr(""), repr("<ConnectionResetError>"))
    assert receive(b.command([]), b.server_v6, 7102) in (repr(""), repr("<ConnectionResetError>"))
    wait_until(lambda: svc.errors().count("denied and reset") == 2, svc.errors, timeout=30)
    assert not marker.exists()
    # IPv4 written as IPv4 (for grep and fail2ban), not IPv4-mapped.
    assert f"connection from {b.v4} denied" in svc.errors()
    assert "note: connection from ::ffff:" not in svc.errors()
    # A denied peer is reset before the state, the programs, the loader or BCC's side
    # are imported: a flood of them costs the imports of judging and no more.
    denied = imports(svc.errors())
    assert "alfwrapper.lifecycle.backlog" in denied, svc.errors()[-2000:]
    assert not [m for m in denied if m.startswith(HEAVY)], denied
    assert receive(a.command([]), a.server_v4, 7102) == repr("served\n")
    assert receive(a.command([]), a.server_v6, 7102) == repr("served\n")
    imported = imports(svc.errors())
    assert "alfwrapper.lifecycle.launch" in imported  # the allowed peers' starts go on
    # ... with no state, program, loader or BCC's side: a connection needs no filter.
    kept = ("alfwrapper.bpf", "alfwrapper.state", "alfwrapper.loader", "alfwrapper.lifecycle.kept",
            "alfwrapper.lifecycle.programs", "pyroute2")  # fmt: skip
    assert not [m for m in imported if m.startswith(kept)], imported
    assert "alfwrapper.cli" in imported, svc.errors()[-2000:]  # what -X importtime shows
    assert not [m for m in imported if m == "bcc" or m.startswith("bcc.")], imported
    # Nor numpy: a few rules judge a peer as the Prefix objects they were parsed into.
    assert not [m for m in imported if m == "numpy" or m.startswith("numpy.")], imported
    # The same addresses through `alfwrapper explain`: the kernel's verdicts.
    for source, verdict in (
        (a.v4, "passed"),
        (a.v6, "passed"),
        (b.v4, "dropped"),
        (b.v6, "dropped"),
        ("192.0.2.7", "dropped"),
    ):
        out = subprocess.run(
            [*WRAPPER, "explain", *rules, "--from", source],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.stdout.startswith(verdict), (source, out.stdout, out.stderr)


def test_a_kept_verdict_resets_a_denied_peer_and_follows_every_file(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """The first denied peer is judged by the full start, which keeps its verdict
    (lifecycle/verdicts.py); the next denied peer is reset before the command line is
    parsed.  Allowed peers are served.  Every file the policy read or looked for is
    followed: a drop-in added, a rule file rewritten in place at the same size, the
    entry tampered with: each time the next peer is judged in full again."""
    cache = tmp_path / "cache"
    marker = tmp_path / "started"
    policy = tmp_path / "web.toml"
    blocked = tmp_path / "blocked.list"
    a, b = network.allowed, network.denied
    policy.write_text(
        f'allow = ["192.0.2.0/24", "198.51.100.0/24", "2001:db8::/32"]\n'
        f"deny-file = [{str(blocked)!r}]\n"
    )
    blocked.write_text(f"{b.v4}/32\n{b.v6}/128\n")
    # Its times as a file changed within the file system's granularity would look:
    # newer than a second ago, so not to be trusted yet (cachedir.RACY_NS).
    os.utime(blocked, (time.time() + 3600,) * 2)
    svc = activate(
        network, services, 7103,
        "env", f"ALFWRAPPER_CACHE={cache}", sys.executable, "-X", "importtime", "-m",
        "alfwrapper", "--policy", str(policy), "--", sys.executable,
        "-c", f"import sys; open({str(marker)!r}, 'a').write('started\\n'); print('served')",
    )  # fmt: skip
    seen = 0

    def denied(host_address: str) -> list[str]:
        """A denied peer's connection: reset, the command not started; the modules its
        wrapper imported."""
        nonlocal seen
        before = len(svc.errors())
        got = receive(b.command([]), host_address, 7103)
        assert got in (repr(""), repr("<ConnectionResetError>")), got
        seen += 1
        wait_until(lambda: svc.errors().count("denied and reset") == seen, svc.errors)
        assert not marker.exists()
        return imports(svc.errors()[before:])

    def served(host: Host, address: str) -> None:
        assert receive(host.command([]), address, 7103) == repr("served\n")

    assert "alfwrapper.cli" in denied(b.server_v4)  # judged in full, nothing kept
    assert not list(cache.glob("verdict-*"))
    os.utime(blocked, (time.time() - 60,) * 2)
    time.sleep(1.1)  # and its change time, which that set, is a second old
    assert "alfwrapper.cli" in denied(b.server_v4)  # judged in full, and kept
    assert [p.name[:8] for p in cache.glob("verdict-*")] == ["verdict-"]
    for address in (b.server_v4, b.server_v6):  # the kept verdict: nothing else imported
        kept = denied(address)
        assert "alfwrapper.lifecycle.verdicts" in kept, kept
        assert not [
            m
            for m in kept
            if m.startswith(
                ("alfwrapper.cli", "alfwrapper.policy", "argparse", "alfwrapper.lifecycle.backlog")
            )
        ], kept
    served(a, a.server_v4)
    served(a, a.server_v6)
    assert svc.errors().count("connection from") == 4  # the same note, each time
    assert svc.errors().count(f"connection from {b.v4} denied") == 3  # IPv4 as IPv4
    # A drop-in that lifts the deny file: the next peer is judged in full, and served.
    dropins = tmp_path / "web.toml.d"
    dropins.mkdir()
    (dropins / "open.toml").write_text("deny-file = []\n")
    served(b, b.server_v4)
    marker.unlink()
    (dropins / "open.toml").unlink()
    time.sleep(1.1)  # changed a second ago: kept by the next start
    assert "alfwrapper.cli" in denied(b.server_v4)  # the folder changed again: in full
    assert "alfwrapper.cli" not in denied(b.server_v4)
    # The rule file rewritten in place, at the same size: b's address no longer in it.
    other4 = b.v4.rsplit(".", 1)[0] + (".9" if not b.v4.endswith(".9") else ".8")
    text = blocked.read_text()
    fresh = text.replace(f"{b.v4}/32", f"{other4}/32")
    assert len(fresh) == len(text)
    with blocked.open("r+") as f:
        f.write(fresh)
    served(b, b.server_v4)
    marker.unlink()
    # Back to denying it, kept.  Then an entry whose table denies everyone: sealed, it
    # is used (whoever can write the cache folder decides); unsealed, never.
    blocked.write_text(text)
    time.sleep(1.1)
    denied(b.server_v4)
    assert "alfwrapper.cli" not in denied(b.server_v4)
    entry = next(cache.glob("verdict-*"))
    body = marshal.loads(entry.read_bytes()[32:])
    body["table"] = verdicts.table_of([], [Prefix(4, 0, 0), Prefix(6, 0, 0)])
    forged = marshal.dumps(body)
    entry.write_bytes(bytes(32) + forged)
    served(a, a.server_v4)
    marker.unlink()
    entry.write_bytes(hashlib.sha256(forged).digest() + forged)
    before = len(svc.errors())
    assert receive(a.command([]), a.server_v4, 7103) in (repr(""), repr("<ConnectionResetError>"))
    wait_until(lambda: "denied and reset" in svc.errors()[before:], svc.errors)
    assert not marker.exists()


def test_a_kept_verdict_follows_a_release_switched_by_symlink(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """Releases in folders behind a `current` link, the next one made as hard links
    (`cp -al`) with a new rule file beside its policy (which names it relatively): once
    the link is switched, the policy file is the very same file, and the kept verdict
    is not used: the peer the new release denies is reset, not served."""
    cache, a, b = tmp_path / "cache", network.allowed, network.denied
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "web.toml").write_text('allow-file = ["allow.txt"]\n')
    (v1 / "allow.txt").write_text("192.0.2.0/24\n198.51.100.0/24\n2001:db8::/32\n")
    shutil.copytree(v1, tmp_path / "v2", copy_function=os.link)
    (tmp_path / "v2" / "allow.txt").unlink()
    (tmp_path / "v2" / "allow.txt").write_text("192.0.2.0/24\n2001:db8:a::/48\n")
    (tmp_path / "current").symlink_to("v1")
    time.sleep(1.1)  # every file a second old: a verdict is kept
    svc = activate(
        network, services, 7104,
        "env", f"ALFWRAPPER_CACHE={cache}", sys.executable, "-X", "importtime", "-m",
        "alfwrapper", "--policy", str(tmp_path / "current" / "web.toml"), "--",
        sys.executable, "-c", "print('served')",
    )  # fmt: skip
    for _ in range(3):  # judged in full and kept, then from the kept verdict
        assert receive(b.command([]), b.server_v4, 7104) == repr("served\n")
    assert [p.name[:8] for p in cache.glob("verdict-*")] == ["verdict-"]
    kept_run = imports(svc.errors())
    assert "alfwrapper.lifecycle.verdicts" in kept_run
    switched = tmp_path / "current.new"
    switched.symlink_to("v2")
    switched.rename(tmp_path / "current")  # ln -sfn v2 current, atomically
    for _ in range(3):
        before = len(svc.errors())
        got = receive(b.command([]), b.server_v4, 7104)
        assert got in (repr(""), repr("<ConnectionResetError>")), got
        wait_until(lambda before=before: "denied and reset" in svc.errors()[before:], svc.errors)
    assert receive(a.command([]), a.server_v4, 7104) == repr("served\n")


# What the application is, as it reports it: its capabilities, no_new_privs, whether
# bpf(2) fails with EPERM (privileges.deny_bpf_syscall), and its LISTEN_* variables.
REPORT = (
    "import ctypes, os\n"
    "status = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall(321, 0, 0, 0)\n"  # bpf(BPF_MAP_CREATE, NULL, 0) on x86-64
    "print(status['CapEff'].strip(), status['CapBnd'].strip(), status['NoNewPrivs'].strip(),\n"
    "      os.strerror(ctypes.get_errno()), sorted(k for k in os.environ if k.startswith"
    "('LISTEN')), flush=True)\n"
)


@pytest.mark.parametrize("capabilities", [[], ["--no-capabilities"]], ids=["kept", "none"])
def test_a_kept_verdict_starts_an_allowed_peers_command_as_the_full_start_does(
    network: Network, services: list[Service], tmp_path: Path, capabilities: list[str]
) -> None:
    """An allowed peer whose verdict an earlier start kept gets COMMAND from
    lifecycle/verdicts.py, before the command line is parsed: confined exactly as the
    full start confines it (capabilities, no_new_privs, bpf(2) denied), with the same
    environment.  A socket with no rules is never started that way (its note would be
    lost), and a COMMAND gone since fails at exec: nothing reaches the peer."""
    cache = tmp_path / "cache"
    program = tmp_path / "app"
    program.write_text(f"#!{sys.executable}\n{REPORT}")
    program.chmod(0o755)
    a, b = network.allowed, network.denied
    svc = activate(
        network, services, 7105,
        "env", f"ALFWRAPPER_CACHE={cache}", sys.executable, "-X", "importtime", "-m",
        "alfwrapper", *capabilities, "--allow", "192.0.2.0/24", "--allow", "2001:db8::/32",
        "--", str(program),
    )  # fmt: skip

    def served(address: str) -> tuple[str, list[str]]:
        before = len(svc.errors())
        got = receive(a.command([]), address, 7105)
        return got, imports(svc.errors()[before:])

    def from_kept(address: str) -> str:
        got, imported = served(address)
        assert "alfwrapper.lifecycle.handover" in imported, imported
        assert not [
            m
            for m in imported
            if m.startswith(
                ("alfwrapper.cli", "alfwrapper.policy", "argparse", "alfwrapper.lifecycle.launch")
            )
        ], imported
        return got

    # A denied peer's full start keeps the verdict; the next allowed peer is started
    # from it.  A denied peer is reset from the same entry.
    for n in (1, 2):
        got = receive(b.command([]), b.server_v4, 7105)
        assert got in (repr(""), repr("<ConnectionResetError>")), got
        wait_until(lambda n=n: svc.errors().count("denied and reset") == n, svc.errors)
        assert [p.name[:8] for p in cache.glob("verdict-*")] == ["verdict-"]
    kept = from_kept(a.server_v4)
    # The full start's, for the same peer (the entry gone: judged in full, kept again).
    for entry in cache.glob("verdict-*"):
        entry.unlink()
    full, imported = served(a.server_v4)
    assert "alfwrapper.cli" in imported, svc.errors()[-2000:]
    assert "Operation not permitted" in full and " 1 " in full, full  # bpf(2), no_new_privs
    assert ("'0000000000000000 " in full) == bool(capabilities), full
    assert kept == full, (kept, full)
    assert from_kept(a.server_v6) == full
    # An entry (sealed) naming another COMMAND, or the capabilities --no-capabilities
    # took away: what runs, and with what, comes from the command line, never from
    # the entry; the peer is judged in full and gets the same as before.
    entry = next(cache.glob("verdict-*"))
    sound = entry.read_bytes()
    for forged in (
        {"command": ["/bin/sh", "-c", "echo forged"], "capabilities": True},
        {"command": [str(program)], "capabilities": True},
    ):
        body = marshal.loads(sound[32:])
        if body["exec"] == forged:
            continue  # the capabilities the unit gave are kept anyway: nothing forged
        body["exec"] = forged
        raw = marshal.dumps(body)
        entry.write_bytes(hashlib.sha256(raw).digest() + raw)
        got, imported = served(a.server_v4)
        assert got == full, (forged, got, full)
        assert "alfwrapper.cli" in imported, imported
        entry.write_bytes(sound)
    # COMMAND gone: exec fails, the peer gets nothing, the error says what to do.
    program.unlink()
    got, imported = served(a.server_v4)
    assert got in (repr(""), repr("<ConnectionResetError>")), got
    wait_until(lambda: "check COMMAND" in svc.errors(), svc.errors)
    assert "alfwrapper.cli" not in imported


def test_an_unruled_socket_is_started_by_the_full_start_every_time(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """With no rules the full start says so on every connection; a kept verdict never
    starts COMMAND in its place (it would say nothing)."""
    cache = tmp_path / "cache"
    a = network.allowed
    svc = activate(
        network, services, 7106, "env", f"ALFWRAPPER_CACHE={cache}", *WRAPPER, "--",
        sys.executable, "-c", "print('served')",
    )  # fmt: skip
    for n in range(3):
        assert receive(a.command([]), a.server_v4, 7106) == repr("served\n")
        wait_until(lambda n=n: svc.errors().count("has no rules") == n + 1, svc.errors)


def test_a_kept_denial_writes_nothing_to_the_peer(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """Where stderr is the connection (a unit that leaves StandardError= to inherit
    StandardOutput=socket), a kept verdict's note would reach the peer: such a start
    is judged in full, whose note goes to the journal.  The peer gets nothing but the
    reset, every time."""
    cache = tmp_path / "cache"
    b = network.denied
    svc = activate(
        network, services, 7104, "/bin/sh", "-c", 'exec "$@" 2>&1', "sh",
        "env", f"ALFWRAPPER_CACHE={cache}", *WRAPPER, "--allow", "192.0.2.0/24", "--", "true",
    )  # fmt: skip
    for n in range(3):
        got = receive(b.command([]), b.server_v4, 7104)
        assert got in (repr(""), repr("<ConnectionResetError>")), (n, got)
        assert list(cache.glob("verdict-*")), svc.errors()  # kept by the first: met after


def run_with_stdin(stdin: socket.socket, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WRAPPER, "--service", f"inetd-{uuid.uuid4().hex[:6]}", *argv],
        stdin=stdin.fileno(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_what_fd_0_may_be() -> None:
    """A Unix socket on fd 0 (a supervisor's pipe) is not the wrapper's to take; a UDP
    socket is, and gets the filter like any other socket, and stays on fd 0."""
    one, _two = socket.socketpair()
    out = run_with_stdin(one, "--allow", "192.0.2.0/24", "--", "true")
    assert out.returncode == 64, out.stderr
    assert "none inherited (LISTEN_FDS unset, and fd 0 is no TCP or UDP socket)" in out.stderr
    udp = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    udp.bind(("::1", 0))
    # Named stdin, rules may be scoped to it.
    out = run_with_stdin(udp, "--allow", "stdin=192.0.2.0/24", "--", sys.executable, "-c",
                         "import os; print(os.environ.get('LISTEN_FDS'))")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == "None\n"
    # The filter is on the socket: a datagram from ::1 (not allowed) never arrives.
    sender = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sender.sendto(b"denied", udp.getsockname())
    udp.settimeout(0.5)
    try:
        data = udp.recv(100)
    except TimeoutError:
        data = b""
    assert data == b""


def test_a_socket_passed_both_ways_is_one_socket(tmp_path: Path) -> None:
    """The same UDP socket on fd 0 and, through LISTEN_FDS, on fd 3 is one socket,
    known by its LISTEN_FDNAMES name (not as stdin); the application gets it at fd 3
    with LISTEN_FDS, as it was passed."""
    launcher = (
        "import os, socket, sys\n"
        "s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
        "s.bind(('::1', 0))\n"
        "os.dup2(s.fileno(), 0)\n"
        "os.dup2(s.fileno(), 3)\n"
        "os.set_inheritable(3, True)\n"
        "os.environ.update(LISTEN_FDS='1', LISTEN_PID=str(os.getpid()))\n"
        "os.execv(sys.argv[1], sys.argv[1:])\n"
    )
    app = "import os; print(os.environ['LISTEN_FDS'], os.environ['LISTEN_FDNAMES'])"

    def run(rule: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", launcher, sys.executable, "-m", "alfwrapper",
             "--service", f"inetd-{uuid.uuid4().hex[:6]}", "--allow", rule, "--",
             sys.executable, "-c", app],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    out = run("unknown=192.0.2.0/24")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "1 unknown\n"
    out = run("stdin=192.0.2.0/24")
    assert out.returncode == 64, out.stderr
    assert "rules for stdin: no socket has that name" in out.stderr
