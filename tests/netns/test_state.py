"""Pinned state that is damaged, cut short or not alfwrapper's is refused, with one line,
and the rules in force stay: by reload (a meta of garbage, a meta without the options,
a foreign map in the slot) and by a restart (a slot that is not the dispatcher's, a
folder someone else could have made).  And what is checked before anything changes."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.hosts import Network, Probe, Service, check_policy
from helpers.support import ECHO_SERVER, ROOT, WRAPPER

from alfwrapper import state
from alfwrapper.errors import AlfError
from alfwrapper.host import bpf_calls
from alfwrapper.state import collection, lock, trust

pytestmark = pytest.mark.netns

ACTIVATE = ROOT / "tests/programs/activate.py"
ALLOW_A = ["--allow", "192.0.2.0/24", "--allow", "2001:db8:a::/48"]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WRAPPER, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)


def one_socket(service: str) -> state.SocketState:
    (found,) = state.store_in_use().sockets_of(service)
    return found


def write_meta_raw(where: state.SocketState, data: bytes) -> None:
    fd = state.open_pin(where, "meta")
    try:
        bpf_calls.map_update(fd, struct.pack("=I", 0), data.ljust(state.META_SIZE, b"\0"))
    finally:
        os.close(fd)


def garbage(where: state.SocketState) -> None:
    write_meta_raw(where, b"\x8f{not json" * 100)


def no_argv(where: state.SocketState) -> None:
    meta = state.read_meta(where)
    del meta["argv"]
    write_meta_raw(where, json.dumps(meta).encode())


HELD: list[int] = []  # the real slot, held open while a foreign map takes its pin's place


def foreign_slot(where: state.SocketState) -> None:
    """Another program array where the slot's pin was.  The real slot is held open
    meanwhile: the last reference to a program array going empties it (so a socket
    whose slot lost its only pin drops everything; see the restart test)."""
    HELD.append(state.open_pin(where, "slot"))
    Path(where.path("slot")).unlink()
    other = bpf_calls.map_create(bpf_calls.BPF_MAP_TYPE_PROG_ARRAY, "foreign", 4, 4, 1)
    try:
        bpf_calls.obj_pin(other, where.path("slot"))
    finally:
        os.close(other)


@pytest.mark.parametrize("damage", [garbage, no_argv, foreign_slot])
def test_reload_refuses_damaged_state_and_the_old_rules_stay(
    network: Network, services: list[Service], damage: Callable[[state.SocketState], None]
) -> None:
    a, b = network.allowed, network.denied
    service = f"damaged-{damage.__name__}"
    svc = Service(
        network.server,
        [*WRAPPER, "--service", service, "--listen", "[::]:8080", *ALLOW_A, "--", *ECHO_SERVER],
    )
    services.append(svc)
    svc.wait_for(r"^ready ")  # its meta is written before the application starts
    damage(one_socket(service))
    # A stored reload, and one that would let the denied host in: both refused.
    for extra in ([], ["--allow", "198.51.100.0/24", "--allow", "2001:db8:b::/48"]):
        if damage is not foreign_slot and extra:
            continue  # with options given, a meta without them is not read
        out = run("reload", service, *extra)
        assert out.returncode == 78, out.stdout + out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "nothing was changed" in out.stderr, out.stderr
    check_policy(
        svc,
        served=[Probe(a, "tcp", 4, 8080), Probe(a, "tcp", 6, 8080)],
        dropped=[Probe(b, "tcp", 4, 8080), Probe(b, "tcp", 6, 8080)],
    )
    while HELD:
        os.close(HELD.pop())


def supervised(network: Network, services: list[Service], tmp: Path, service: str) -> Service:
    """A supervised service (activate.py): its first start runs 6 s and is killed; the
    supervisor waits for tmp/resume before the next start."""
    go = tmp / "go"
    svc = Service(
        network.server,
        [sys.executable, str(ACTIVATE), "--go", str(go), "--supervise", "--kill-after", "6",
         "--pause", str(tmp / "resume"), "--generations", "2", "tcp:[::]:8080:echo", "--",
         *WRAPPER, "--service", service, *ALLOW_A, "--", *ECHO_SERVER],
    )  # fmt: skip
    services.append(svc)
    svc.wait_for(r"^listening$")
    go.touch()
    svc.wait_for(r"^ready ", timeout=60)
    svc.wait_for(r"^generation 1 exited", timeout=30)
    return svc


def test_a_restart_refuses_a_slot_that_is_not_the_dispatchers(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """Its pins would have the new program go where no packet looks: refused, with one
    line.  The real slot, its pin gone and nothing else holding it, is emptied by the
    kernel, and the socket drops everything: closed, not open."""
    svc = supervised(network, services, tmp_path, "restart-foreign")
    foreign_slot(one_socket("restart-foreign"))
    os.close(HELD.pop())
    (tmp_path / "resume").touch()
    svc.wait_for(r"^generation 2 exited", timeout=60)
    assert "is damaged: the slot is not the one the dispatcher calls into" in svc.errors()
    a, b = network.allowed, network.denied
    assert b.probe("tcp", 4, 8080, "after", timeout=2) == "timeout"
    assert a.probe("tcp", 4, 8080, "after", timeout=2) == "timeout"


def test_a_restart_checks_the_folders_again(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """A service's folder whose mode lets others in (someone may have made or changed
    it) is refused on a restart too, not only on the first start."""
    svc = supervised(network, services, tmp_path, "restart-mode")
    where = one_socket("restart-mode")
    os.chmod(where.service_dir, 0o755)
    try:
        (tmp_path / "resume").touch()
        svc.wait_for(r"^generation 2 exited", timeout=60)
        assert "with mode 755" in svc.errors(), svc.errors()
    finally:
        os.chmod(where.service_dir, 0o700)


def test_options_too_long_to_keep_are_refused_before_anything_is_attached(
    network: Network, services: list[Service], tmp_path: Path
) -> None:
    """More rule options than a socket's meta can keep for reload: the error comes before
    the socket is touched (it carries no filter after), exit 64."""
    go = tmp_path / "go"
    many = [arg for i in range(600) for arg in ("--allow", f"10.{i // 256}.{i % 256}.0/24")]
    argv = [sys.executable, str(ACTIVATE), "--go", str(go), "--supervise", "--generations", "1",
            "tcp:[::]:8080:echo", "--", *WRAPPER, "--service", "long-options", *many, "--",
            *ECHO_SERVER]  # fmt: skip
    svc = Service(network.server, argv)
    services.append(svc)
    svc.wait_for(r"^listening$")
    go.touch()
    svc.wait_for(r"^generation 1 exited 16384", timeout=60)  # exit status 64
    assert "the rule options: are too long to keep" in svc.errors(), svc.errors()
    assert not (state.ROOT / "long-options").exists()


def test_a_folder_a_gc_removes_between_mkdir_and_chown_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the next test found under load, made certain: a gc removes the empty
    service folder a start has just made, before the start gives it to its owner."""
    folder = tmp_path / "svc"
    give, removed = state.give_dir, []

    def gc_first(path: Path, uid: int, gid: int, mode: int) -> None:
        if not removed:
            removed.append(path)
            folder.rmdir()  # what a gc beside the start does to an empty folder
        give(path, uid, gid, mode)

    monkeypatch.setattr(trust, "give_dir", gc_first)
    state.trusted_dir(folder, True)
    assert removed == [folder] and folder.is_dir()
    assert folder.stat().st_uid == state.owner(folder)[0]


@pytest.mark.parametrize("services", [("race_a", "race_b"), ("race_c", "race_c")])
def test_starts_and_gcs_at_once_do_not_fail_each_other(
    bpf_root: None, services: tuple[str, str]
) -> None:
    """Many services start at boot, each collecting first what gone sockets left: a
    gc must not take the state another start is making (its folder, its socket's
    folder before the meta names the start's pid), nor fail on what a gc beside it
    removed.  Two processes, 150 starts each, of two services and of one."""
    race = ROOT / "tests/programs/gc_race.py"
    sides = [
        subprocess.Popen(
            [sys.executable, str(race), name, "150"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in services
    ]
    for side in sides:
        out, err = side.communicate(timeout=240)
        assert out.strip() == "failed 0", err[-3000:]
    state.store_in_use().gc()
    for name in set(services):
        assert not (state.ROOT / name).exists(), name


def test_a_gc_leaves_the_state_a_start_is_making(bpf_root: None) -> None:
    """The race above, held still: a start makes a socket's folder under the service
    folder's shared lock, its meta last (Store._make).  A gc meanwhile leaves that
    folder, which has no meta yet and whose socket is not bound; once the start lets
    go, the same folder is the state of a gone socket, and a gc takes it."""
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        where = state.store_in_use().state("making", state.socket_cookie(sock))
        state.store_in_use().root(create=True)
        state.trusted_dir(where.service_dir, create=True)
        with lock.service_lock(where.service_dir, exclusive=False) as held:
            assert held
            state.trusted_dir(where.dir, create=True)  # Store._make's first step
            assert where not in state.store_in_use().gc()  # (other tests' gone sockets may go)
            assert where.dir.is_dir()
        assert where in state.store_in_use().gc()
    assert not where.service_dir.exists()


@pytest.mark.alone  # a gc by another test would take the empty folder it holds
def test_a_start_waits_for_a_stopped_gc_only_so_long(
    bpf_root: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gc stopped while it holds a service's folder (Ctrl-Z on `alfwrapper gc`) makes
    a start of that service wait LOCK_SECONDS, then fail with one line and EX_TEMPFAIL,
    which the shipped units restart from; not hang until systemd's timeout."""
    service = "lockheld"
    folder = state.ROOT / service
    state.store_in_use().root(create=True)
    state.trusted_dir(folder, create=True)
    monkeypatch.setattr(lock, "LOCK_SECONDS", 0.3)
    held = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)

    def hung(_signum: int, _frame: object) -> None:
        raise TimeoutError("the start still waits after 10 s")

    before = signal.signal(signal.SIGALRM, hung)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            signal.alarm(10)  # a start that waits forever fails here, not hangs the suite
            with pytest.raises(AlfError) as err:
                state.store_in_use().create(service, sock, "lockheld_t0")
            signal.alarm(0)
        assert err.value.exit_code == 75 and "a gc has held it" in err.value.why
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
        os.close(held)
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        where, dispatch = state.store_in_use().create(service, sock, "lockheld_t0")  # once let go
    os.close(dispatch)
    state.store_in_use().remove(where)
    folder.rmdir()


def test_gc_keeps_the_knock_state_of_a_start_in_progress(bpf_root: None) -> None:
    """A start pins its knock state before its meta names it (the meta is written last);
    a gc by any other command meanwhile (a wrapper, status, reload) must leave it, or
    the start's next socket cannot pin its share of it.  Once the meta says the socket
    knocks no more, gc removes it."""
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
        sock.bind(("::1", 0))
        tree = state.store_in_use()
        where, dispatch = tree.create("gc-knock", sock, "x_u1", os.getppid())  # another's
        os.close(dispatch)
        knock = where.service_dir / "knock-0123456789abcdef"
        try:
            state.trusted_dir(knock, create=True)
            tree.gc()
            assert knock.is_dir(), "the knock state of a start in progress was removed"
            state.write_meta(where, {**state.read_meta(where), "knock": ""})
            tree.gc()
            assert not knock.exists(), "knock state no socket uses was kept"
        finally:
            tree.remove(where)
            shutil.rmtree(where.service_dir, ignore_errors=True)


def test_gc_judges_only_the_sockets_it_listed_before_asking_which_live(bpf_root: None) -> None:
    """A socket made after a gc asked sock_diag which sockets live is not in the answer:
    that gc leaves its state whatever the meta says (a damaged meta names no owner).
    One listed before is judged: dead, and nothing owns it, so it goes."""
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        tree = state.store_in_use()
        where, dispatch = tree.create("late", sock, "late_t0")
        os.close(dispatch)
        try:
            garbage(where)
            assert collection.collect_tree(tree, set(), set, None) == []
            assert where.dir.exists(), "a gc took a socket made after it asked"
            assert collection.collect_tree(tree, {where.dir}, set, None) == [where]
        finally:
            shutil.rmtree(where.service_dir, ignore_errors=True)


def test_a_start_claims_the_state_it_takes_before_it_compiles(bpf_root: None) -> None:
    """A start that finds its socket's state from a start that died names itself in the
    meta at once: while it compiles, a gc that does not see the socket alive (its
    sock_diag listing missed it) keeps the state by the start's pid.  Taken from under
    the start, the state would be gone while the socket stays locked on its dispatcher,
    and every later start would refuse the socket as filtered by someone else."""
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)  # a pid that was a process and is no more: the dead start's
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        tree = state.store_in_use()
        first = tree.take("claimed", sock, "claimed_t0")
        try:
            state.write_meta(first.state, {**state.read_meta(first.state), "pid": child})
            taken = tree.take("claimed", sock, "claimed_t0")  # the next start
            assert taken.state == first.state and not taken.made
            assert state.read_meta(taken.state)["pid"] == os.getpid()
            assert collection.collect_tree(tree, {taken.state.dir}, set, None) == []
            assert (taken.state.dir / "dispatch").exists(), "a gc took a start's state"
        finally:
            shutil.rmtree(first.state.service_dir, ignore_errors=True)


def test_status_of_every_service_passes_over_state_a_gc_takes_meanwhile(
    bpf_root: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status` lists the services, then reads each socket; a gc that takes a closed
    socket's state in between must not make the whole status fail (it did: 71)."""
    from alfwrapper.observe import status  # noqa: PLC0415

    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        tree = state.store_in_use()
        where, dispatch = tree.create("vanishing", sock, "vanishing_t0")
        os.close(dispatch)
        read_meta = state.read_meta

        def taken_first(pins: state.SocketState) -> dict[str, object]:
            if pins == where:
                tree.remove(where)  # as a gc would, the socket having closed
            return read_meta(pins)

        monkeypatch.setattr(state, "read_meta", taken_first)
        monkeypatch.setattr(status, "collect", lambda: None)  # no gc of its own first
        try:
            report = status.status("")
            mine = [s for s in report["services"] if s["name"] == "vanishing"]  # type: ignore[index]
            assert mine in ([], [{"name": "vanishing", "sockets": [], "resets": 0}]), mine
        finally:
            shutil.rmtree(where.service_dir, ignore_errors=True)
