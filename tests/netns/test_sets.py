"""Named sets: one list of prefixes on the host, named by any number of services
(allow-set, deny-set) and changed while they run (alfwrapper set), with real traffic
from namespace hosts; and what the application received."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.hosts import Network, Probe, Service, all_probes, check_policy, start_echo
from helpers.support import ECHO_SERVER, WRAPPER, WRITES_INTO_A_SET

from alfwrapper import sets
from alfwrapper.bpf.parts import SET_ROLES
from alfwrapper.host import bpf_calls
from alfwrapper.sets import tree

pytestmark = pytest.mark.netns

SETS = Path("/sys/fs/bpf/alfwrapper-sets")
LISTS = Path("/etc/alfwrapper/sets")


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WRAPPER, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env} if env else None,
    )


def ok(*argv: str) -> str:
    out = cli(*argv)
    assert out.returncode == 0, (argv, out.stderr)
    return out.stdout


@pytest.fixture
def set_name(bpf_root: None) -> Iterator[str]:
    """A set's name of this test's own (workers share the host's sets), gone after."""
    name = f"t{os.getpid()}-{time.monotonic_ns() % 10**9}"
    yield name
    cli("set", "destroy", name)
    (LISTS / f"{name}.list").unlink(missing_ok=True)


def start(
    network: Network, services: list[Service], service: str, port: int, *options: str
) -> Service:
    return start_echo(network, services, service, *options, port=port)


def test_two_services_share_one_deny_set(
    network: Network, services: list[Service], set_name: str
) -> None:
    a, b = network.allowed, network.denied
    ok("set", "create", set_name)
    one = start(network, services, f"{set_name}-one", 8080, "--deny-set", set_name)
    two = start(network, services, f"{set_name}-two", 9090, "--deny-set", set_name)
    pids = (one.proc.pid, two.proc.pid)
    for svc, port in ((one, 8080), (two, 9090)):
        check_policy(svc, served=all_probes(a, port, port + 1) + all_probes(b, port), dropped=[])
    # One add, both services, from the next packet: a host and a range of each family.
    ok("set", "add", set_name, a.v4, "2001:db8:a::/48")
    for svc, port in ((one, 8080), (two, 9090)):
        check_policy(svc, served=all_probes(b, port), dropped=all_probes(a, port, port + 1))
    listed = ok("set", "list", set_name).split()
    assert f"{a.v4}/32" in listed and "2001:db8:a::/48" in listed, listed
    ok("set", "del", set_name, a.v4, "2001:db8:a::/48")
    for svc, port in ((one, 8080), (two, 9090)):
        check_policy(svc, served=all_probes(a, port, port + 1), dropped=[])
    # A flush empties it for both as well.
    ok("set", "add", set_name, "192.0.2.0/24", a.v6)
    check_policy(one, served=[], dropped=all_probes(a, 8080))
    assert "2 removed" in ok("set", "flush", set_name)
    check_policy(two, served=all_probes(a, 9090), dropped=[])
    assert (one.proc.pid, two.proc.pid) == pids and None is one.proc.poll() is two.proc.poll()


def test_an_entry_with_a_timeout_lapses(
    network: Network, services: list[Service], set_name: str
) -> None:
    a = network.allowed
    ok("set", "create", set_name)
    svc = start(network, services, f"{set_name}-t", 8080, "--deny-set", set_name)
    ok("set", "add", set_name, a.v4, "--timeout", "2")
    ok("set", "add", set_name, "2001:db8:a::/64", "--timeout", "2")
    added = time.monotonic()
    check_policy(svc, served=[], dropped=all_probes(a, 8080))
    assert time.monotonic() - added < 1.9, "the probes took too long to see the entries stand"
    time.sleep(max(0.0, added + 2.3 - time.monotonic()))
    check_policy(svc, served=all_probes(a, 8080, 8081), dropped=[])
    assert ok("set", "list", set_name).strip() == ""  # lapsed entries are gone


def test_allow_sets(network: Network, services: list[Service], set_name: str) -> None:
    a, b = network.allowed, network.denied
    # A set of its own list file, made at the first start that names it.
    (LISTS / f"{set_name}.list").parent.mkdir(parents=True, exist_ok=True)
    (LISTS / f"{set_name}.list").write_text(f"# the office\n{b.v4}\n")
    # check, which changes nothing, judges the policy as the start will make it.
    out = cli("check", "--allow-set", set_name)
    assert out.returncode == 0 and not sets.exists(set_name), out.stderr
    # Allow sets alone: only their entries pass; a deny rule still wins over them.
    only = start(network, services, f"{set_name}-only", 8080, "--allow-set", set_name,
                 "--deny", "2001:db8:b::/48")  # fmt: skip
    check_policy(
        only,
        served=[Probe(b, "tcp", 4, 8080), Probe(b, "udp", 4, 8081)],
        dropped=all_probes(a, 8080, 8081) + [Probe(b, "tcp", 6, 8080)],
    )
    ok("set", "add", set_name, a.v6, "2001:db8:b::/48")
    check_policy(
        only,
        served=[Probe(a, "tcp", 6, 8080)],
        dropped=[Probe(a, "tcp", 4, 8080), Probe(b, "tcp", 6, 8080)],
    )
    # Beside allow rules: either lets a source in.
    both = start(network, services, f"{set_name}-both", 9090, "--allow-set", set_name,
                 "--allow", "192.0.2.0/24")  # fmt: skip
    check_policy(
        both,
        served=[Probe(a, "tcp", 4, 9090), Probe(b, "tcp", 4, 9090), Probe(a, "tcp", 6, 9090)],
        dropped=[],
    )
    ok("set", "del", set_name, b.v4)
    check_policy(both, served=[Probe(a, "tcp", 4, 9090)], dropped=[Probe(b, "tcp", 4, 9090)])


def test_a_deny_set_wins_over_a_runtime_allow(
    network: Network, services: list[Service], set_name: str
) -> None:
    a = network.allowed
    ok("set", "create", set_name)
    svc = start(
        network, services, f"{set_name}-rt", 8080, "--deny-set", set_name, "--allow", "192.0.2.0/24"
    )
    ok("allow", f"{set_name}-rt", "2001:db8:a::/48")
    ok("set", "add", set_name, a.v4, a.v6)
    check_policy(svc, served=[], dropped=all_probes(a, 8080))


def test_set_errors(network: Network, services: list[Service], set_name: str) -> None:
    # A start naming a set that does not exist: one line, exit 78, no application.
    svc = Service(
        network.server,
        [*WRAPPER, "--listen", "[::]:8080", "--deny-set", set_name, "--", *ECHO_SERVER],
    )
    services.append(svc)
    assert svc.proc.wait(60) == 78, svc.errors()
    assert svc.errors().count("\n") == 1 and f"named set {set_name}: does not exist" in (
        svc.errors()
    ), svc.errors()
    assert "ready" not in svc.output()
    for argv, code, needle in (
        (["set", "add", set_name, "192.0.2.1"], 78, "does not exist"),
        (["set", "create", "bad.name"], 64, "is not a set name"),
        (["set", "add", "x"], 64, "no CIDR given"),
        (["set", "add", "x", "192.0.2.1/33"], 64, "longer than 32"),
        (["set", "add", "x", "192.0.2.1", "--timeout", "nan"], 64, "--timeout"),
        (["--deny-set", "a.b", "--", "true"], 64, "is not a set name"),
        (["check", "--deny-set", set_name], 78, "does not exist"),
        (
            ["check", "--allow-set", "x", "--allow", "192.0.2.0/24", "--deny", "192.0.2.1"],
            64,
            "not both",
        ),
    ):
        out = cli(*argv)
        assert out.returncode == code, (argv, out.stderr)
        assert needle in out.stderr and len(out.stderr.splitlines()) == 1, (argv, out.stderr)


@pytest.mark.parametrize("point", ["set-ranges-pinned", "set-made"])
def test_a_crash_while_a_set_is_made_leaves_no_half_set(
    network: Network, services: list[Service], set_name: str, tmp_path: Path, point: str
) -> None:
    """Killed with two of its three maps pinned, or with all three but before the
    rename that puts the set in place: no set, neither listed nor one to add to; the
    next create makes it whole, and a gc removes what the killed one left."""
    listed = tmp_path / "list"
    listed.write_text("192.0.2.2\n2001:db8:a::/48\n")
    out = cli("set", "create", set_name, str(listed), env={"ALFWRAPPER_CRASH_AT": point})
    assert out.returncode == -9, out
    assert not (SETS / set_name).exists() and tree.making(set_name).exists()
    assert set_name not in ok("set", "list").split()
    added = cli("set", "add", set_name, "192.0.2.9")
    assert added.returncode == 78 and "does not exist" in added.stderr, added.stderr
    # Nothing starts on it, rather than on half of it.
    assert cli("check", "--deny-set", set_name).returncode == 78
    if point == "set-made":  # a gc removes what was left; else the next create does
        # This gc, or another test's running meanwhile (`make test` runs three
        # workers, and every gc visits every set): either way it is gone.
        said = ok("gc")
        assert f"{set_name}~making" in said or not tree.making(set_name).exists(), said
        assert not tree.making(set_name).exists()
    assert "created from" in ok("set", "create", set_name, str(listed))
    assert not tree.making(set_name).exists() and set_name in ok("set", "list").split()
    svc = start(network, services, f"{set_name}-c", 8080, "--deny-set", set_name)
    check_policy(
        svc, served=all_probes(network.denied, 8080), dropped=all_probes(network.allowed, 8080)
    )


def test_a_failed_create_leaves_no_set(set_name: str, tmp_path: Path) -> None:
    """A create that fails (the kernel refuses memory for its last map) leaves nothing:
    no set that `set list` shows and `set add` says does not exist, no maps pinned."""
    listed = tmp_path / "list"
    listed.write_text("192.0.2.1\n192.0.2.2\n192.0.2.3\n")
    out = cli("set", "create", set_name, str(listed), "--size", "2",
              env={"ALFWRAPPER_FAIL_AT": "set-hosts_at-pinned"})  # fmt: skip
    assert out.returncode == 71 and "failed on purpose" in out.stderr, out.stderr
    assert set_name not in ok("set", "list").split()
    assert not (SETS / set_name).exists() and not tree.making(set_name).exists()
    assert "created from" in ok("set", "create", set_name, str(listed), "--size", "3")
    assert ok("set", "list", set_name).split() == ["192.0.2.1/32", "192.0.2.2/32", "192.0.2.3/32"]


def room(name: str) -> int:
    """How many whole addresses the set's hosts map in force has room for."""
    fd = bpf_calls.obj_get(str(SETS / name / "hosts"))
    try:
        return bpf_calls.map_shape(fd)[3]
    finally:
        os.close(fd)


def test_a_set_is_made_once_takes_lapsed_room_and_then_grows(set_name: str) -> None:
    assert "created" in ok("set", "create", set_name, "--size", "2")
    assert "exists already" in ok("set", "create", set_name, "--size", "9")
    ok("set", "add", set_name, "192.0.2.1", "2001:db8::1", "--timeout", "1")
    time.sleep(1.2)  # both lapse: the next add takes their room
    ok("set", "add", set_name, "192.0.2.2", "2001:db8::2")
    assert ok("set", "list", set_name).split() == ["192.0.2.2/32", "2001:db8::2/128"]
    assert room(set_name) == 2
    ok("set", "add", set_name, "192.0.2.3", "192.0.2.4", "2001:db8::3")  # full: it grows
    assert room(set_name) >= 5
    listed = ok("set", "list", set_name).split()
    assert listed == [
        "192.0.2.2/32",
        "192.0.2.3/32",
        "192.0.2.4/32",
        "2001:db8::2/128",
        "2001:db8::3/128",
    ], listed
    assert not (SETS / set_name / tree.GROWN).exists()


def test_a_set_grows_while_a_service_uses_it(
    network: Network, services: list[Service], set_name: str, tmp_path: Path
) -> None:
    """A deny set made for 4 entries takes 5,000 while a service runs on it, in adds
    of 1,000 (each grows it): the denied hosts are dropped from the add that named them
    on, the others served throughout, and no restart or reload was needed.  Then the
    same through the bouncer's way (a resync of the whole list, sets.assign)."""
    a, b = network.allowed, network.denied
    ok("set", "create", set_name, "--size", "4")
    svc = start(network, services, f"{set_name}-grow", 8080, "--deny-set", set_name)
    pid = svc.proc.pid
    filler = [f"2001:db8:f:{i:x}::1" for i in range(5000)]
    for chunk in range(5):
        ok("set", "add", set_name, *filler[chunk * 1000 : (chunk + 1) * 1000])
        if chunk == 2:
            ok("set", "add", set_name, b.v4, b.v6)
        denied = all_probes(b, 8080, 8081) if chunk >= 2 else []
        check_policy(svc, served=all_probes(a, 8080, 8081), dropped=denied)
    assert room(set_name) >= 5002 and len(ok("set", "list", set_name).split()) == 5002
    listed = tmp_path / "more"
    listed.write_text("".join(f"2001:db8:e:{i:x}::1\n" for i in range(20000)) + f"{a.v6}\n")
    sets.assign(set_name, {p: 0 for p in sets.read_list(str(listed))})
    assert room(set_name) >= 20001
    check_policy(
        svc,
        served=[*all_probes(b, 8080, 8081), Probe(a, "tcp", 4, 8080)],
        dropped=[Probe(a, "tcp", 6, 8080), Probe(a, "udp", 6, 8081)],
    )
    assert svc.proc.pid == pid and svc.proc.poll() is None


@pytest.mark.parametrize("point", ["set-grown-pinned", "set-grown-switched"])
def test_a_kill_while_a_set_grows_loses_no_entry(
    network: Network, services: list[Service], set_name: str, point: str
) -> None:
    """Killed after its larger copy is pinned, or after it is in force but before it
    takes the hosts pin's name: the service drops what the set held throughout, and
    the next change finishes or undoes the growth (no entry lost, none written where
    no program reads it)."""
    a, b = network.allowed, network.denied
    ok("set", "create", set_name, "--size", "2")
    ok("set", "add", set_name, b.v4, b.v6)
    svc = start(network, services, f"{set_name}-kill", 8080, "--deny-set", set_name)
    out = cli("set", "add", set_name, "2001:db8:f::1", env={"ALFWRAPPER_CRASH_AT": point})
    assert out.returncode == -9, out
    assert (SETS / set_name / tree.GROWN).exists()
    check_policy(svc, served=all_probes(a, 8080, 8081), dropped=all_probes(b, 8080, 8081))
    # A change that needs no room (a removal) mends the set first: what it removes is
    # gone from the map the programs read, and the grown pin is gone.
    ok("set", "del", set_name, b.v6)
    assert not (SETS / set_name / tree.GROWN).exists()
    check_policy(
        svc,
        served=[*all_probes(a, 8080, 8081), Probe(b, "tcp", 6, 8080)],
        dropped=[Probe(b, "tcp", 4, 8080), Probe(b, "udp", 4, 8081)],
    )
    ok("set", "add", set_name, a.v4)
    check_policy(
        svc,
        served=[Probe(a, "tcp", 6, 8080)],
        dropped=[Probe(b, "tcp", 4, 8080), Probe(a, "tcp", 4, 8080)],
    )
    listed = ok("set", "list", set_name).split()
    assert listed == [f"{a.v4}/32", f"{b.v4}/32"], listed


def test_explain_names_the_set_and_entry(set_name: str) -> None:
    ok("set", "create", set_name)
    ok("set", "add", set_name, "198.51.100.0/24", "--timeout", "600")
    out = ok("explain", "--deny-set", set_name, "--from", "198.51.100.7", "--from", "192.0.2.1")
    assert out.splitlines() == [
        f"dropped by subnets: 198.51.100.7 matches deny-set entry 198.51.100.0/24 in set "
        f"{set_name}, lapsing in {out.split('lapsing in ')[1].split()[0]} s",
        "passed: 192.0.2.1 matches no deny rule",
    ], out
    assert 590 <= int(out.split("lapsing in ")[1].split()[0]) <= 600
    out = ok("explain", "--allow-set", set_name, "--from", "192.0.2.1")
    assert out.strip() == f"dropped by subnets: 192.0.2.1 is in none of the allow sets ({set_name})"


def test_a_list_into_a_closed_pipe_ends_quietly(set_name: str, tmp_path: Path) -> None:
    """`set list NAME | head -1`: head leaves after one line, long before the list (far
    more than a pipe holds) is written; alfwrapper ends as ls would, with no word."""
    listed = tmp_path / "list"
    listed.write_text("".join(f"2001:db8:{i:x}::1\n" for i in range(20000)))
    ok("set", "create", set_name, str(listed), "--size", "20000")
    lister = subprocess.Popen(
        [*WRAPPER, "set", "list", set_name], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert lister.stdout is not None and lister.stderr is not None
    head = subprocess.run(["head", "-1"], stdin=lister.stdout, capture_output=True, timeout=120)
    lister.stdout.close()
    err = lister.stderr.read().decode()
    assert lister.wait(timeout=120) == 141, err  # 128 + SIGPIPE, as a shell says of ls
    assert err == "", err
    assert head.stdout.decode().splitlines() == ["2001:db8::1/128"], head.stdout[:200]


def test_a_destroyed_set_stays_with_its_services_until_they_reload(
    network: Network, services: list[Service], set_name: str
) -> None:
    a = network.allowed
    ok("set", "create", set_name)
    ok("set", "add", set_name, a.v4)
    svc = start(network, services, f"{set_name}-d", 8080, "--deny-set", set_name)
    ok("set", "destroy", set_name)
    check_policy(svc, served=[Probe(a, "tcp", 6, 8080)], dropped=[Probe(a, "tcp", 4, 8080)])
    out = cli("reload", f"{set_name}-d")
    assert out.returncode == 78 and "does not exist" in out.stderr, out.stderr
    check_policy(svc, served=[Probe(a, "tcp", 6, 8080)], dropped=[Probe(a, "tcp", 4, 8080)])


def test_an_accepted_connection_with_a_set_never_starts_its_command(
    network: Network, services: list[Service], set_name: str, tmp_path: Path
) -> None:
    """inetd style (Accept=yes): only a program reads a set, and an accepted connection
    has none: refused, every time, and nothing runs."""
    ok("set", "create", set_name)
    marker = tmp_path / "started"
    svc = Service(
        network.server,
        ["systemd-socket-activate", "--inetd", "-a", "-l", "7300", *WRAPPER, "--deny-set",
         set_name, "--", sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"],
    )  # fmt: skip
    services.append(svc)
    deadline = time.monotonic() + 30
    while "Listening on" not in svc.errors() and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(2):
        got = network.allowed.probe("tcp", 4, 7300, "hello", timeout=5)
        assert got != "echo" and "hello" not in got, got  # nothing answered
    deadline = time.monotonic() + 30
    while svc.errors().count(f"the named set {set_name}") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert svc.errors().count(f"the named set {set_name} cannot check a connection") == 2, (
        svc.errors()
    )
    assert not marker.exists()


def test_a_lapsed_range_does_not_hide_the_range_it_is_nested_in(
    network: Network, services: list[Service], set_name: str
) -> None:
    """An LPM trie gives the longest match alone: past a lapsed one the filter looks one
    bit shorter (4 deep at most; deeper, the source is unreadable, which an allow set
    does not pass until the lapsed ranges are swept)."""
    a = network.allowed  # 192.0.2.2
    ok("set", "create", set_name)
    deny = start(network, services, f"{set_name}-n", 8080, "--deny-set", set_name)
    allow = start(network, services, f"{set_name}-m", 9090, "--allow-set", set_name)
    ok("set", "add", set_name, "192.0.2.0/24")
    ok("set", "add", set_name, "192.0.2.0/28", "--timeout", "1")
    time.sleep(1.2)
    check_policy(deny, served=[], dropped=[Probe(a, "tcp", 4, 8080)])
    check_policy(allow, served=[Probe(a, "tcp", 4, 9090)], dropped=[Probe(a, "tcp", 6, 9090)])
    # Five lapsed ranges deep: unreadable, and an allow set does not pass it...
    ok("set", "add", set_name, *[f"192.0.2.0/{n}" for n in range(25, 30)], "--timeout", "1")
    time.sleep(1.2)
    check_policy(deny, served=[], dropped=[Probe(a, "tcp", 4, 8080)])
    check_policy(allow, served=[], dropped=[Probe(a, "tcp", 4, 9090)])
    # ...until the lapsed ones are swept (set list does).
    assert ok("set", "list", set_name).split() == ["192.0.2.0/24"]
    check_policy(allow, served=[Probe(a, "tcp", 4, 9090)], dropped=[])


def test_a_change_to_a_set_waits_for_its_lock(set_name: str) -> None:
    """Every change (and a sweep, which reads an entry as lapsed, then deletes it) holds
    the set's lock: a sweep never deletes what another process just wrote."""
    import fcntl  # noqa: PLC0415

    ok("set", "create", set_name)
    fd = os.open(SETS / set_name, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        adding = subprocess.Popen(
            [*WRAPPER, "set", "add", set_name, "192.0.2.9"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(1.5)
        assert adding.poll() is None, "the add did not wait for the set's lock"
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert adding.wait(30) == 0
    finally:
        os.close(fd)
    assert ok("set", "list", set_name).split() == ["192.0.2.9/32"]


def test_no_filter_may_write_into_a_set(set_name: str, tmp_path: Path) -> None:
    """A set's maps are read-only to every program (BPF_F_RDONLY_PROG): a filter that
    would delete from one is refused by the verifier, even as root, and the set keeps
    its entries.  Its group may pass through its folders and read its pins (0710 and
    0640): the loader reads them so, for a user's service (test_loader.py)."""
    ok("set", "create", set_name)
    ok("set", "add", set_name, "192.0.2.1")
    evil = tmp_path / "evil.c"
    evil.write_text(WRITES_INTO_A_SET)
    out = cli("check", "--deny-set", set_name, "--filter", str(evil))
    assert out.returncode != 0 and "write into map forbidden" in out.stderr, out.stderr
    assert ok("set", "list", set_name).split() == ["192.0.2.1/32"]
    import grp  # noqa: PLC0415

    group = grp.getgrnam("alfwrapper-sets").gr_gid
    for path, mode in (
        (SETS, 0o710),
        (SETS / set_name, 0o710),
        (SETS / set_name / "hosts", 0o640),
        (SETS / set_name / "ranges", 0o640),
    ):
        info = path.stat()
        assert (info.st_mode & 0o777, info.st_gid) == (mode, group), (path, oct(info.st_mode))


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.parametrize("point", ["folder-made", "set-ranges-pinned"])
def test_the_trees_owner_cannot_turn_roots_make_elsewhere(
    set_name: str, tmp_path: Path, point: str
) -> None:
    """The sets' tree belongs to the bouncer's user, which may rename and link in it:
    stopped right after root made the folder it makes the set in (tree.making), or
    pinned into it (ALFWRAPPER_PAUSE_AT), the folder is moved away and a link to a
    folder of root's put in its name.  Root's make never follows it: the folder the link names keeps
    its owner, its mode and its file."""
    from alfwrapper.host import faults  # noqa: PLC0415

    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / "hosts").write_text("root's\n")
    moved = SETS / f"{set_name}-moved"
    made = subprocess.Popen(
        [*WRAPPER, "set", "create", set_name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, faults.PAUSE_VARIABLE: point},
    )
    try:
        deadline = time.monotonic() + 60
        while not _stopped(made.pid):
            assert made.poll() is None and time.monotonic() < deadline, made.communicate()
            time.sleep(0.01)
        os.rename(tree.making(set_name), moved)
        os.symlink(victim, tree.making(set_name))
        os.kill(made.pid, signal.SIGCONT)
        out, err = made.communicate(timeout=60)
        info = victim.stat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (0, 0, 0o700), (out, err)
        assert [p.name for p in victim.iterdir()] == ["hosts"], (out, err)
        assert (victim / "hosts").read_text() == "root's\n" and (
            victim / "hosts"
        ).stat().st_uid == 0
        if point == "folder-made":  # the folder it made is gone: refused, nothing made
            assert made.returncode == 71 and "Not a directory" in err, err  # O_NOFOLLOW
        else:  # it finished in the folder it made, wherever that went
            assert made.returncode == 0, err
            assert sorted(p.name for p in moved.iterdir()) == sorted(SET_ROLES)
    finally:
        if made.poll() is None:
            made.kill()
        (SETS / set_name).unlink(missing_ok=True)
        tree.making(set_name).unlink(missing_ok=True)
        for pin in moved.iterdir() if moved.exists() else ():
            pin.unlink()
        if moved.exists():
            moved.rmdir()
