"""Fixtures for every test: ``bpf_root`` skips (or, under CI=true, fails) without root and
BPF; ``network`` (three namespaced hosts), ``services`` (stopped afterwards) and
``manager`` (root's systemd --user with the shipped units)."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.hosts import Network, Service, make_network
from helpers.managers import UserManager
from helpers.support import ROOT, WRAPPER, bpf_problem, host_hold, require
from helpers.tiers import TIERS, tier_problem
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

from alfwrapper import state
from alfwrapper.bpf.parts import RUNTIME_KEY
from alfwrapper.host import bpf_calls

# Hypothesis keeps nothing in the checkout (.hypothesis/): no test writes there.  Its
# examples are drawn anew each run, as on a fresh clone; what it caches goes to a
# folder of this run's, removed at its end.
settings.register_profile("alfwrapper", database=None)
settings.load_profile("alfwrapper")
_HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="alfwrapper-hypothesis-")
set_hypothesis_home_dir(_HYPOTHESIS_HOME)
atexit.register(shutil.rmtree, _HYPOTHESIS_HOME, True)

# The program cache of every start the tests make (alfwrapper/bpf/cache.py): the
# checkout's own, so that a clean clone starts cold and nothing outside is used.
os.environ.setdefault("ALFWRAPPER_CACHE", str(ROOT / ".cache" / "programs"))


def another_workers(pid: int) -> bool:
    """Was this process started by another pytest-xdist worker (a sibling of ours, under
    the same controller)?  Such a process in our namespace is a visitor: its gc or
    status enters every namespace.  Ours, and orphans, are this test's to kill."""
    me, controller = os.getpid(), os.getppid()
    for _ in range(64):
        if pid in (me, 1) or pid <= 0:
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        parent = int(stat[stat.rfind(")") + 2 :].split()[1])
        if parent == controller and "PYTEST_XDIST_WORKER" in os.environ:
            return True
        pid = parent
    return False


@pytest.fixture
def bpf_root() -> None:
    problem = bpf_problem()
    require(not problem, problem)


@pytest.fixture
def network(bpf_root: None) -> Iterator[Network]:
    net = make_network()
    try:
        yield net
    finally:
        # Whatever still runs in them goes first; then alfwrapper forgets the state of
        # their sockets (it can tell only while the namespaces exist); then they go.
        # Only this test's: other workers' gc and status visit every namespace.
        deadline = time.monotonic() + 10
        for name in net.names:
            while time.monotonic() < deadline:
                pids = [
                    pid
                    for pid in subprocess.run(
                        ["ip", "netns", "pids", name], capture_output=True, text=True
                    ).stdout.split()
                    if not another_workers(int(pid))
                ]
                if not pids:
                    break
                subprocess.run(["kill", "-9", *pids], capture_output=True)
                time.sleep(0.05)
        forget_runtime_rules(net.names)
        subprocess.run([*WRAPPER, "gc"], capture_output=True, timeout=60)
        for name in net.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


_NETNS_COOKIE = (
    "import socket; s = socket.socket(); "
    "print(int.from_bytes(s.getsockopt(socket.SOL_SOCKET, 71, 8), 'little'))"
)


def forget_runtime_rules(names: list[str]) -> None:
    """Revoke the runtime rules of the gone sockets of these namespaces: gc keeps a gone
    socket's state for its rules until its next start (state.inherit_runtime), which
    a test's service never has, and a later test's service of the same name would
    inherit them."""
    cookies = set()
    for name in names:
        inside = ["nsenter", f"--net=/run/netns/{name}", sys.executable, "-c", _NETNS_COOKIE]
        out = subprocess.run(inside, capture_output=True, text=True, timeout=30)
        if out.returncode == 0:
            cookies.add(int(out.stdout))
    for tree in (state.ROOT, *state.USERS_ROOT.glob("[0-9]*")):
        for where in tree.glob("*/sock-*/runtime"):
            try:
                meta = json.loads(_meta_text(where.parent / "meta"))
                if meta.get("netns") not in cookies or state.alive(meta.get("pid")):
                    continue
                fd = bpf_calls.obj_get(str(where))
                try:
                    for key in bpf_calls.map_keys(fd, RUNTIME_KEY.size):
                        bpf_calls.map_delete(fd, key)
                finally:
                    os.close(fd)
            except (OSError, ValueError):
                continue  # collected meanwhile


def _meta_text(path: Path) -> bytes:
    fd = bpf_calls.obj_get(str(path))
    try:
        raw = bpf_calls.map_lookup(fd, b"\0\0\0\0", state.META_SIZE) or b""
    finally:
        os.close(fd)
    return raw.rstrip(b"\0") or b"{}"


@pytest.fixture
def services() -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for svc in started:
        svc.stop()


@pytest.fixture
def manager(network: Network) -> Iterator[UserManager]:
    """root's `systemd --user` in the server's namespace, with the shipped units."""
    if shutil.which("systemd") is None and not Path("/lib/systemd/systemd").exists():
        pytest.fail("systemd is missing: `make setup` installs it")
    if str(ROOT).startswith(("/tmp/", "/var/tmp/")):  # the units run files of the checkout
        pytest.fail(
            f"the shipped units have PrivateTmp=, so they cannot see {ROOT}: "
            "run the tests from a checkout outside /tmp and /var/tmp"
        )
    mgr = UserManager(network.server)
    try:
        yield mgr
    finally:
        mgr.stop()


@pytest.fixture(scope="session")
def readable_copy() -> Iterator[Path]:
    """alfwrapper (with its filters), pyroute2, the echo service and the test filters
    where any user can read them: the checkout (and its virtualenv) may sit in a
    directory only root can enter, as a fresh `mktemp -d` clone does.  Run it with the
    system Python (which has BCC) and PYTHONPATH=copy."""
    import tempfile  # noqa: PLC0415

    import pyroute2  # noqa: PLC0415

    # Not in /tmp: the loader's unit, which runs it, has PrivateTmp=.
    root = Path(tempfile.mkdtemp(prefix="alf-readable-", dir="/var/lib"))
    root.chmod(0o755)
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "alfwrapper", root / "alfwrapper", ignore=skip)
    shutil.copytree(ROOT / "filters", root / "filters", ignore=skip)
    shutil.copytree(Path(pyroute2.__file__).parent, root / "pyroute2", ignore=skip)
    shutil.copy(ROOT / "examples/echo_server.py", root / "echo_server.py")
    shutil.copy(ROOT / "tests/data/allowlist.c", root / "allowlist.c")
    for client in ("loader_client.py", "loader_flood.py"):  # run as the test's users
        shutil.copy(ROOT / "tests/programs" / client, root / client)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def deb() -> Path:
    """The Debian package, built by `make deb` from this tree once per session."""
    require(os.geteuid() == 0, "builds and installs a Debian package: needs root")
    import fcntl  # noqa: PLC0415

    # Two lanes (the Debian 12 and 13 guests) want it, on two workers: the first
    # builds it, the other waits and takes the same file (a second `make deb` would
    # rewrite it while a guest is reading it).
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", f"pid{os.getpid()}")
    (ROOT / "build").mkdir(exist_ok=True)
    with (ROOT / "build" / "deb.lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.seek(0)
        built = lock.read().split()
        if len(built) == 2 and built[0] == run and Path(built[1]).exists():
            return Path(built[1])
        build = subprocess.run(
            ["make", "-C", str(ROOT), "deb"], capture_output=True, text=True, timeout=900
        )
        assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
        # lintian ran inside `make deb` with --fail-on error; its warnings are printed.
        debs = sorted((ROOT / "dist").glob("alfwrapper_*_all.deb"))
        assert debs, build.stdout
        lock.truncate(0)
        lock.write(f"{run} {debs[-1]}\n")
        return debs[-1]


def pytest_configure(config: pytest.Config) -> None:
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    config.addinivalue_line("markers", "alone: no test of another worker runs meanwhile")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    problems = [
        problem
        for item in items
        if (problem := tier_problem(
            item.nodeid,
            {mark.name for mark in item.iter_markers()},
            set(getattr(item, "fixturenames", ())),
        )) is not None
    ]  # fmt: skip
    if problems:
        raise pytest.UsageError("\n".join(problems[:20]))


# `make test` runs three pytest-xdist workers (on two cores: much of a test is waiting),
# and this sends them work by lanes: a lane's
# tests run on one worker, one after another, as written.  The boot and release tiers
# are one lane, but for the boot tier's Debian 13 guests, which are another (the
# package is built once for both: `deb`).  The loader's tests are one: its unit (test_loader.py) and
# its stand-in (test_crash.py) mount the same /run/alfwrapper-loader.  Every other test
# file is a lane of its own (its services' names are unique among files, and the echo
# server's default name differs between workers: support.ECHO_SERVER).
LANES = {
    "boot": "guests",
    "kernel": "guests",
    "release": "guests",
    "test_loader.py": "loader",
    "test_crash.py": "loader",
}


def lane_of(nodeid: str) -> str:
    path, _, name = nodeid.partition("::")
    parts = Path(path).parts
    lane = LANES.get(parts[1] if len(parts) > 2 else "", "") or LANES.get(parts[-1], path)
    if lane == "guests" and parts[1:2] == ("boot",) and "trixie" in name:
        return "guests-trixie"
    return lane


@pytest.hookimpl(optionalhook=True)  # pytest -p no:xdist runs too
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling  # noqa: PLC0415

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane_of(nodeid)

    return Lanes(config, log)


@pytest.fixture(autouse=True)
def host_share(request: pytest.FixtureRequest) -> Iterator[None]:
    """Other workers' tests run beside this one.  One marked `alone` holds the host
    to itself: it changes a sysctl that every namespace and guest sees, or watches what
    any gc (each network test ends with one) would change.  Every other test shares it,
    but one in the qemu guest (qemu_guest): its kernel, disk and BPF file system are its
    own, so an `alone` test need not wait minutes for it."""
    if "qemu_guest" in request.fixturenames:
        yield
        return
    with host_hold(exclusive=request.node.get_closest_marker("alone") is not None):
        yield
