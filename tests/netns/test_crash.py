"""A start killed anywhere leaves no socket unfiltered: the wrapper is killed with SIGKILL
at each crash point in turn (faults.py), and at seeded random moments, under a
supervisor that holds the sockets and starts it again (activate.py --supervise, as a
socket unit with Restart=always would); the denied host has queued connections and
datagrams before the first start, and with real traffic afterwards the allowed host
is served, the denied one dropped, and nothing of the denied host's reached the
application.  Also as an ordinary user, through the loader."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.attacks import attack, seen_from, wait_line
from helpers.hosts import Network, Probe, Service, check_policy
from helpers.support import ECHO_SERVER, ROOT, WRAPPER

from alfwrapper.host import faults

pytestmark = pytest.mark.netns

ACTIVATE = ROOT / "tests/programs/activate.py"
RULES = ["--allow", "192.0.2.0/24", "--allow", "2001:db8:a::/48"]
# The points a start meets (the rest are reload's, live rules' and gc's).
START_POINTS = ("pinned", "attached", "loaded", "installed", "judged", "described")
SEED = 20261123
SYSTEM_PYTHON = "/usr/bin/python3"  # with BCC; the users run the readable copy with it
LOADER_LOG: list[Path] = []
RANDOM_KILLS = 50


def trial(
    network: Network, services: list[Service], tmp: Path, proto: str, crash: str = "",
    kill: float = -1, wrapper: tuple[str, ...] = tuple(WRAPPER), env: dict[str, str] | None = None,
    app: tuple[str, ...] = tuple(ECHO_SERVER),
) -> Service:  # fmt: skip
    """One supervised service whose first start is killed; the denied host queues its
    attacks before that start.  Returns the service once a later start serves."""
    a, b = network.allowed, network.denied
    go = tmp / f"go-{proto}-{crash or kill}"
    port = "8080"
    argv = [sys.executable, str(ACTIVATE), "--go", str(go), "--supervise", "--generations", "5",
            *(["--crash", crash] if crash else []),
            *(["--kill-after", f"{kill:.3f}"] if kill >= 0 else []),
            f"{proto}:[::]:{port}:echo", "--", *wrapper, "--service", f"crash-{proto}",
            *RULES, "--", *app]  # fmt: skip
    svc = Service(network.server, argv, env)
    services.append(svc)
    svc.wait_for(r"^listening$")
    if proto == "tcp":
        attacks = [
            attack(b, "tcp", "rst", b.server_v4, port, "EVIL-RST-4"),
            attack(b, "tcp", "open", b.server_v6, port, "EVIL-OPEN-6", "8"),
            attack(a, "tcp", "open", a.server_v4, port, "GOOD-4", "8"),
        ]
    else:
        attacks = [
            attack(b, "raw", "4", b.v4, b.server_v4, "udp", port, "EVIL-UDP-4"),
            attack(b, "raw", "6", b.v6, b.server_v6, "udp", port, "EVIL-UDP-6"),
        ]
    for proc in attacks:
        assert wait_line(proc) in ("sent", "connected")
    go.touch()
    svc.wait_for(r"^generation 1 exited", timeout=60)
    svc.wait_for(r"^ready ", timeout=60)
    return svc


def check(network: Network, svc: Service, proto: str) -> None:
    a, b = network.allowed, network.denied
    check_policy(
        svc,
        served=[Probe(a, proto, 4, 8080), Probe(a, proto, 6, 8080)],
        dropped=[Probe(b, proto, 4, 8080), Probe(b, proto, 6, 8080)],
    )
    assert not seen_from(svc, b.v4, b.v6), svc.output()
    assert "EVIL" not in svc.output(), svc.output()


@pytest.mark.parametrize("proto", ["tcp", "udp"])
@pytest.mark.parametrize("point", START_POINTS)
def test_a_kill_at_every_point_leaves_the_socket_filtered(
    network: Network, services: list[Service], tmp_path: Path, point: str, proto: str
) -> None:
    svc = trial(network, services, tmp_path, proto, crash=point)
    assert "generation 1 exited 9" in svc.output(), "the first start did not die there"
    check(network, svc, proto)


def start_seconds() -> float:
    """How long a start with RULES takes here, to the exec of its command (the slowest
    of three): with the program cache warm, as every start after the first is."""
    times = []
    for _ in range(3):
        with socket.socket() as probe:  # a free port
            probe.bind(("127.0.0.1", 0))
            listen = f"127.0.0.1:{probe.getsockname()[1]}"
        begin = time.monotonic()
        subprocess.run(
            [*WRAPPER, "--listen", listen, *RULES, "--", "true"],
            check=True,
            timeout=120,
            capture_output=True,
        )
        times.append(time.monotonic() - begin)
    return max(times)


def test_seeded_random_kills_leave_the_socket_filtered(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """RANDOM_KILLS starts killed at a random moment between their beginning and a
    quarter past the measured length of a start (so that most kills fall inside it,
    whatever this machine's speed and the cache), each followed by a full start: a TCP
    and a UDP service at a time, side by side (two services, as on a host)."""
    rng = random.Random(SEED)
    span = 1.25 * start_seconds()
    kills = [rng.uniform(0.0, span) for _ in range(RANDOM_KILLS)]

    def one(i: int) -> None:
        proto = ("tcp", "udp")[i % 2]
        svc = trial(network, services, tmp_path, proto, kill=kills[i])
        check(network, svc, proto)
        svc.stop()
        services.remove(svc)

    with ThreadPoolExecutor(2) as pool:
        for first in range(0, RANDOM_KILLS, 2):
            list(pool.map(one, range(first, min(first + 2, RANDOM_KILLS))))


def test_every_crash_point_is_met() -> None:
    """The points the tests kill at are the ones the code has, and every one is met on
    some path: a point nobody reaches tests nothing."""
    code = "".join(p.read_text() for p in (ROOT / "alfwrapper").rglob("*.py"))
    for point in faults.POINTS:
        assert f'crash_point("{point}")' in code, point
    assert set(START_POINTS) <= set(faults.POINTS)


@pytest.fixture
def loader_for(readable_copy: Path) -> Iterator[dict[str, str]]:
    """The loader, run as it runs in its unit (the user alfwrapper-loader with CAP_BPF
    alone, the users' tree bound where it can reach it) but by a plain supervisor: the
    loader's code under test, not its unit (the boot tier has the unit).  Its socket
    is one any user may connect to, as the unit's is (SocketMode=0666)."""
    folder = Path(tempfile.mkdtemp(prefix="alf-loader-", dir="/run"))
    folder.chmod(0o755)
    path = folder / "loader.sock"
    script = (
        "set -e; mkdir -p /run/alfwrapper-loader; "  # its RuntimeDirectory=, its own
        "mount -t tmpfs -o mode=0700,uid=$(id -u alfwrapper-loader),"
        "gid=$(id -g alfwrapper-loader) tmpfs /run/alfwrapper-loader; "
        "mkdir /run/alfwrapper-loader/pins; "
        "mount --bind /sys/fs/bpf/alfwrapper-users /run/alfwrapper-loader/pins; "
        f"exec systemd-socket-activate -E PYTHONPATH -l {path} setpriv --reuid=alfwrapper-loader "
        "--regid=alfwrapper-loader --init-groups --inh-caps=-all,+bpf --ambient-caps=+bpf "
        f"--bounding-set=-all,+bpf {SYSTEM_PYTHON} -m alfwrapper loader "
        "--pins /run/alfwrapper-loader/pins"
    )
    subprocess.run([*WRAPPER, "loader", "--prepare"], check=True, timeout=60)
    log = folder / "loader.log"
    with log.open("w") as errors:
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            env={**os.environ, "PYTHONPATH": str(readable_copy)},
            stderr=errors,
        )
    try:
        deadline = time.monotonic() + 30
        while "Listening" not in log.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.05)
        path.chmod(0o666)  # systemd-socket-activate makes it 0644 whatever the umask
        LOADER_LOG[:] = [log]
        yield {"ALFWRAPPER_LOADER": str(path), "PYTHONPATH": str(readable_copy)}
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("point", ["attached", "installed", "judged"])
def test_through_the_loader_too(
    network: Network,
    services: list[Service],
    tmp_path: Path,
    loader_for: dict[str, str],
    point: str,
) -> None:
    """An ordinary user's wrapper (no capability: its state is the loader's) killed at
    the points of a start that change state: the next start still filters.  The loader
    takes a socket in one request (pins, attaches, locks: Store.take), so the wrapper
    has no moment between "pinned" and "attached"; it dies right after the answer."""
    user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", SYSTEM_PYTHON, "-m", "alfwrapper"]  # fmt: skip
    try:
        svc = trial(network, services, tmp_path, "tcp", crash=point, wrapper=tuple(user),
                    env=loader_for,
                    app=(SYSTEM_PYTHON, f"{loader_for['PYTHONPATH']}/echo_server.py"))  # fmt: skip
    except AssertionError as err:
        raise AssertionError(
            f"{err}\nthe loader said: {LOADER_LOG[0].read_text()[-2000:]}"
        ) from None
    assert "generation 1 exited 9" in svc.output(), svc.errors()
    check(network, svc, "tcp")


def killed(argv: list[str], point: str) -> subprocess.CompletedProcess[str]:
    """An alfwrapper command killed at the crash point (it must die there)."""
    out = subprocess.run([*WRAPPER, *argv], capture_output=True, text=True, timeout=120,
                         env={**os.environ, faults.VARIABLE: point}, cwd=ROOT)  # fmt: skip
    assert out.returncode == -9, f"{argv} did not die at {point}: {out.stderr}"
    return out


@pytest.mark.parametrize("point", ["reload-loaded", "reload-installed"])
def test_a_reload_killed_midway_leaves_old_or_new_rules(
    network: Network, services: list[Service], point: str
) -> None:
    """Either program is a whole policy: killed between loading and filling the slots, or
    after the first, the socket is filtered by one of them, and a reload after works."""
    a, b = network.allowed, network.denied
    svc = Service(network.server, [*WRAPPER, "--service", "reloaded", "--listen", "[::]:8080",
                                   "--listen-datagram", "[::]:8081", *RULES, "--",
                                   *ECHO_SERVER])  # fmt: skip
    services.append(svc)
    svc.wait_for(r"^ready ")
    killed(["reload", "reloaded", "--deny", "2001:db8:a::/48", *RULES], point)
    for port, proto in ((8080, "tcp"), (8081, "udp")):
        check_policy(svc, served=[Probe(a, proto, 4, port)], dropped=[Probe(b, proto, 4, port)])
    assert subprocess.run([*WRAPPER, "reload", "reloaded"], timeout=120, cwd=ROOT).returncode == 0
    check_policy(svc, served=[Probe(a, "tcp", 6, 8080)], dropped=[Probe(b, "tcp", 6, 8080)])


def test_a_live_deny_killed_midway_is_in_force_or_absent(
    network: Network, services: list[Service]
) -> None:
    """Killed between the two map updates of a live deny, the rule is either in force
    or not there at all: never listed by status while the filter ignores it."""
    a = network.allowed
    svc = Service(
        network.server,
        [*WRAPPER, "--service", "denied-live", "--listen", "[::]:8080", *RULES, "--", *ECHO_SERVER],
    )
    services.append(svc)
    svc.wait_for(r"^ready ")
    killed(["deny", "denied-live", a.v4], "rule-flagged")
    listed = a.v4 in subprocess.run([*WRAPPER, "show", "denied-live"], capture_output=True,
                                    text=True, timeout=60, cwd=ROOT).stdout  # fmt: skip
    answer = a.probe("tcp", 4, 8080, "after-deny", timeout=2)
    assert answer == ("timeout" if listed else "echo"), (listed, answer)


@pytest.mark.alone  # a gc by another test would finish the one it killed
def test_gc_killed_midway_leaves_nothing_a_start_takes(
    network: Network, services: list[Service]
) -> None:
    """A gone socket's state, half removed (the dispatcher's pin goes first): no start
    takes it for complete, and the next gc removes the rest."""
    svc = Service(
        network.server,
        [*WRAPPER, "--service", "gone", "--listen", "[::]:8080", *RULES, "--", *ECHO_SERVER],
    )
    services.append(svc)
    svc.wait_for(r"^ready ")
    from alfwrapper import state  # noqa: PLC0415

    (where,) = state.store_in_use().sockets_of("gone")
    svc.stop()
    services.remove(svc)
    killed(["gc"], "removing")
    assert where.dir.exists() and not (where.dir / "dispatch").exists()
    assert (
        subprocess.run([*WRAPPER, "gc"], capture_output=True, timeout=120, cwd=ROOT).returncode == 0
    )
    assert not where.dir.exists()


def test_a_restart_killed_while_it_inherits_runtime_rules_loses_none(
    network: Network, services: list[Service]
) -> None:
    """Killed after a new socket got the first of the earlier sockets' two runtime rules,
    a restart leaves both with the gone sockets: the next start drops both hosts, and
    once it holds them, no gone socket's state is left."""
    a, b = network.allowed, network.denied
    argv = [*WRAPPER, "--service", "inheriting", "--listen", "[::]:8080", "--deny",
            "203.0.113.0/24", "--", *ECHO_SERVER]  # fmt: skip
    svc = Service(network.server, argv)
    services.append(svc)
    svc.wait_for(r"^ready ")
    assert subprocess.run([*WRAPPER, "deny", "inheriting", a.v4, a.v6], timeout=60).returncode == 0
    svc.stop()
    services.remove(svc)
    dead = subprocess.run(
        network.server.command(argv),
        capture_output=True,
        timeout=120,
        env={**os.environ, faults.VARIABLE: "rule-inherited"},
    )
    assert dead.returncode == -9, dead.stderr
    svc = Service(network.server, argv)
    services.append(svc)
    svc.wait_for(r"^ready ")
    check_policy(svc, served=[], dropped=[Probe(a, "tcp", 4, 8080), Probe(a, "tcp", 6, 8080)])
    check_policy(svc, served=[Probe(b, "tcp", 4, 8080)], dropped=[])
    assert subprocess.run([*WRAPPER, "gc"], capture_output=True, timeout=60).returncode == 0
    from alfwrapper import state  # noqa: PLC0415

    assert len(state.store_in_use().sockets_of("inheriting")) == 1
    assert subprocess.run([*WRAPPER, "revoke", "inheriting", "--all"], capture_output=True,
                          timeout=60).returncode == 0  # fmt: skip
