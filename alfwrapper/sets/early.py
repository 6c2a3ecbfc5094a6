"""Early drop: deny sets enforced at XDP on chosen interfaces (filters/early.c), before
the stack allocates anything for a frame the sockets would drop anyway.

One XDP program per interface reads every set that is early there, through the same
pinned maps the sockets' programs read, so `set add` and the bouncer reach both at
once.  It drops a SYN or a UDP datagram only where the socket the kernel finds for it
denies a set that holds the source; which sockets deny which sets is written into its
ports map here, from the services' pinned state (each socket's deny_sets) and
sock_diag (every socket bound there: one that is not a service's, sharing the port,
keeps the port out).  refresh() rewrites it, and a start, a reload, `set early` and
`status` call it; a socket that closed needs nothing (the kernel no longer finds it).

    /sys/fs/bpf/alfwrapper-early/IFNAME@NETNS/   (root's; NETNS: the namespace's cookie)
      link    the BPF link that attaches the program (it outlives this process)
      sets    ARRAY: the sets' names, in the program's order
      ports   HASH: (family, protocol, port, bound address) -> bits of those sets
      local   HASH: the namespace's addresses
      counts  PERCPU_ARRAY: dropped by each set, then judged and passed

A change of an interface's sets loads a new program with new maps, filled before
BPF_LINK_UPDATE puts it in place in one step; the pins follow, `sets` first.  A crash
between leaves pins that the link's program does not use: refresh() finds that and
attaches again from the pinned `sets`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import struct
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from alfwrapper import state
from alfwrapper.bpf.parts import EARLY_LOCAL, EARLY_PORT, EARLY_PORTS, FillEnv
from alfwrapper.errors import EX_NOPERM, EX_OSERR, EX_UNAVAILABLE, EX_USAGE, AlfError
from alfwrapper.host import bpf_calls, sockdiag
from alfwrapper.host import interfaces as host_interfaces
from alfwrapper.host.faults import crash_point
from alfwrapper.record import Record
from alfwrapper.sets.creation import read_only
from alfwrapper.sets.tree import check_name, exists

ROOT = state.EARLY_ROOT
MOST_EARLY = 16  # sets early on one interface (the program keeps a bit for each)
NAME_BYTES = 64
MOST_SOCKETS = 1 << 16  # read from sock_diag in one family and protocol
MAPS = {"ports": "alf_early_ports", "local": "alf_early_local", "counts": "alf_early_counts"}
LABEL = "early"
_VALUE = struct.Struct("=Q")


class Interface(Record):
    """One interface's early drop, as its pins say."""

    name: str
    netns: int
    sets: tuple[str, ...]

    @property
    def folder(self) -> Path:
        return state.early_folder(self.name, self.netns)


def _folder_of(path: Path) -> Interface | None:
    name, at, cookie = path.name.rpartition("@")
    if not at or not name:
        return None
    try:
        return Interface(name, int(cookie, 16), read_names(path / "sets"))
    except (OSError, ValueError):
        return Interface(name, int(cookie, 16) if cookie.isalnum() else 0, ())


def configured() -> list[Interface]:
    """Every interface with early drop, in every network namespace."""
    if not ROOT.is_dir():
        return []
    found = [_folder_of(p) for p in sorted(ROOT.iterdir()) if p.is_dir()]
    return [f for f in found if f is not None]


def here() -> list[Interface]:
    """The interfaces with early drop in this network namespace."""
    cookie = state.netns_cookie()
    return [f for f in configured() if f.netns == cookie]


def read_names(pin: Path) -> tuple[str, ...]:
    fd = bpf_calls.obj_get(str(pin), read_only=True)
    try:
        names = []
        for i in range(MOST_EARLY):
            raw = bpf_calls.map_lookup(fd, struct.pack("=I", i), NAME_BYTES) or b""
            text = raw.split(b"\0", 1)[0].decode(errors="replace")
            if text:
                names.append(text)
        return tuple(names)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One change of early drop at a time on this host (flock on the tree)."""
    ROOT.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(ROOT, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# What the ports map should hold ------------------------------------------------------


def port_key(family: int, protocol: int, port: int, address: str) -> bytes:
    raw = socket.inet_pton(family, address).ljust(16, b"\0")
    return EARLY_PORT.pack(4 if family == socket.AF_INET else 6, protocol, port, raw)


def local_key(family: int, raw: bytes) -> bytes:
    return EARLY_LOCAL.pack(family, b"\0" * 3, raw.ljust(16, b"\0"))


Narrow = dict[int, Sequence[str]]  # socket cookie -> the deny sets it keeps (a reload)


def denied_by_cookie(
    names: Sequence[str], netns: int, narrow: Narrow | None = None
) -> dict[int, int]:
    """Each socket of root's services in this namespace, by cookie: the bits of ``names``
    its program denies (users' services, through the loader, are not dropped early).
    ``narrow``: sockets about to deny only these sets (a reload, before its programs go
    in), counted so already."""
    found: dict[int, int] = {}
    store = state.Store(state.ROOT)
    if not store.base.is_dir():
        return found
    for service in store.services():
        for where in store.sockets_of(service):
            try:
                meta = state.read_meta(where)
            except (OSError, AlfError):
                continue  # unreadable: not counted as denying anything
            denies = meta.get("deny_sets")
            if meta.get("netns") != netns or not isinstance(denies, list):
                continue
            if narrow is not None and where.cookie in narrow:
                denies = [n for n in denies if n in narrow[where.cookie]]
            found[where.cookie] = sum(1 << i for i, n in enumerate(names) if n in denies)
    return found


def wanted_ports(
    names: Sequence[str], denied: dict[int, int], bound: Sequence[sockdiag.Bound]
) -> dict[bytes, int]:
    """The ports map: for each address and port where sockets are bound, the sets that
    every one of them denies (a socket that is no service's denies none)."""
    ports: dict[bytes, int] = {}
    everything = (1 << len(names)) - 1
    # A socket bound to an interface (SO_BINDTODEVICE) is found by the device the stack
    # sees, which XDP's lookup does not know: its port is left to the sockets' filters.
    devices = {(s.protocol, s.port) for s in bound if s.interface}
    for sock in bound:
        key = port_key(sock.family, sock.protocol, sock.port, sock.local)
        mine = denied.get(sock.cookie, 0) if (sock.protocol, sock.port) not in devices else 0
        ports[key] = ports.get(key, everything) & mine
    return {key: bits for key, bits in ports.items() if bits}


def wanted_local() -> set[bytes]:
    return {local_key(family, raw) for family, raw in host_interfaces.local_addresses()}


def _write(map_fd: int, wanted: dict[bytes, bytes], key_size: int) -> None:
    """Make a map hold exactly ``wanted``: new and changed entries first, then the rest
    deleted."""
    for key, value in wanted.items():
        bpf_calls.map_update(map_fd, key, value)
    for key in bpf_calls.map_keys(map_fd, key_size):
        if key not in wanted:
            bpf_calls.map_delete(map_fd, key)


def write(ports_fd: int, ports: dict[bytes, int]) -> None:
    """The ports map made to hold exactly ``ports`` (wanted_ports)."""
    _write(ports_fd, {k: _VALUE.pack(v) for k, v in ports.items()}, EARLY_PORT.size)


def fill(
    ports_fd: int, local_fd: int, names: Sequence[str], netns: int, narrow: Narrow | None = None
) -> None:
    ports = wanted_ports(
        names, denied_by_cookie(names, netns, narrow), sockdiag.bound_sockets(MOST_SOCKETS)
    )
    write(ports_fd, ports)
    _write(local_fd, dict.fromkeys(wanted_local(), _VALUE.pack(1)), EARLY_LOCAL.size)


# Attaching ---------------------------------------------------------------------------


def _fail(what: str, err: OSError) -> AlfError:
    if err.errno == errno.EBUSY:
        return AlfError(
            what,
            "another XDP program is attached to this interface",
            "detach it (ip link set dev IFACE xdp off), then try again",
            EX_UNAVAILABLE,
        )
    if err.errno == errno.EPERM:
        return AlfError(what, "not permitted", "run as root", EX_USAGE)
    return AlfError(what, err.strerror or str(err), "run with -v for details", EX_OSERR)


def _names_map(names: Sequence[str]) -> int:
    fd = bpf_calls.map_create(2, "alf_early_sets", 4, NAME_BYTES, MOST_EARLY)  # ARRAY
    for i, name in enumerate(names):
        bpf_calls.map_update(fd, struct.pack("=I", i), name.encode().ljust(NAME_BYTES, b"\0"))
    return fd


def _repin(fd: int, pin: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        pin.unlink()
    bpf_calls.obj_pin(fd, str(pin))


def attach(ifname: str, names: Sequence[str]) -> None:
    """Make ``names`` the sets early on interface ``ifname`` of this namespace (none:
    detach).  Called with the lock held."""
    what = f"early drop on {ifname}"
    netns = state.netns_cookie()
    folder = Interface(ifname, netns, ()).folder
    link_pin = folder / "link"
    if not names:
        detach(folder)
        return
    ifindex = host_interfaces.link_index(ifname)
    if ifindex is None:
        raise AlfError(what, "no such interface here", "ip link shows the interfaces", EX_USAGE)
    under = host_interfaces.stacked(ifindex)
    if under:
        raise AlfError(
            what,
            f"it is {under}: the stack takes its frames as another interface's, whose "
            "sockets XDP here cannot find",
            "name the interface the addresses are on",
            EX_USAGE,
        )
    from alfwrapper.bpf import compiler, program  # noqa: PLC0415  (BCC: only here)

    loaded = compiler.compile_and_load(
        program.plan_early(tuple(names), LABEL), FillEnv(open_set=read_only)
    )
    fds = {role: loaded.tables[table].map_fd for role, table in MAPS.items()}
    names_fd = _names_map(names)
    fresh = not folder.exists()
    try:
        fill(fds["ports"], fds["local"], names, netns)
        folder.mkdir(mode=0o700, exist_ok=True)
        try:
            link_fd = bpf_calls.obj_get(str(link_pin))
        except FileNotFoundError:
            link_fd = -1
        if link_fd >= 0 and bpf_calls.link_info(link_fd)[1] != ifindex:
            os.close(link_fd)  # a link to an interface gone, or renamed: a new one
            link_fd = -1
            detach(folder)
            folder.mkdir(mode=0o700)
            fresh = True
        try:
            if link_fd >= 0:
                bpf_calls.link_update(link_fd, loaded.fd)
            else:  # the names first: a link pinned has them (a crash: refresh)
                _repin(names_fd, folder / "sets")
                link_fd = bpf_calls.xdp_link(loaded.fd, ifindex)
                bpf_calls.obj_pin(link_fd, str(link_pin))
        finally:
            if link_fd >= 0:
                os.close(link_fd)
        crash_point("early-updated")
        _repin(names_fd, folder / "sets")
        crash_point("early-named")
        _repin(loaded.fd, folder / "prog")
        for role, fd in fds.items():
            _repin(fd, folder / role)
    except OSError as err:
        if fresh:  # nothing attached: no folder left to say otherwise
            with contextlib.suppress(OSError):
                detach(folder)
        raise _fail(what, err) from None
    finally:
        os.close(names_fd)  # the program's own maps close with ``loaded``


def detach(folder: Path) -> None:
    """End an interface's early drop and remove its pins."""
    if not folder.is_dir():
        return
    with contextlib.suppress(FileNotFoundError):
        fd = bpf_calls.obj_get(str(folder / "link"))
        try:
            if bpf_calls.link_info(fd)[1]:  # not let go of by the kernel already
                bpf_calls.link_detach(fd)
        finally:
            os.close(fd)
    for pin in folder.iterdir():
        pin.unlink()
    folder.rmdir()


def set_early(name: str, ifnames: Sequence[str]) -> list[str]:
    """Make set ``name`` early on exactly these interfaces of this namespace (none:
    nowhere); a line for each interface changed."""
    check_name(name)
    if os.geteuid() != 0:
        raise AlfError(
            f"set early {name}",
            "early drop is root's (an XDP program on an interface)",
            "run it as root",
            EX_NOPERM,
        )
    if ifnames and not exists(name):
        raise AlfError(f"set {name}", "does not exist", f"alfwrapper set create {name}", EX_USAGE)
    done = []
    with _locked():
        current = {f.name: f.sets for f in here()}
        for ifname in sorted(set(current) | set(ifnames)):
            was = current.get(ifname, ())
            now = tuple(n for n in was if n != name) + ((name,) if ifname in ifnames else ())
            if now == was:
                continue
            if ifname not in ifnames and host_interfaces.link_index(ifname) is None:
                detach(Interface(ifname, state.netns_cookie(), ()).folder)
                done.append(f"{ifname}: gone; its early drop removed")
                continue
            if len(now) > MOST_EARLY:
                raise AlfError(
                    f"early drop on {ifname}",
                    f"more than {MOST_EARLY} sets",
                    "merge sets: one set may hold any number of prefixes",
                    EX_USAGE,
                )
            attach(ifname, now)
            done.append(f"{ifname}: early drop for {', '.join(now) or 'no set'}")
    return done


def forget(name: str) -> list[str]:
    """A destroyed set leaves early drop everywhere it was: on this namespace's
    interfaces, the others' sets kept; on another namespace's, early drop removed there
    (its sockets can be read only from inside).  A line for each interface changed."""
    cookie = state.netns_cookie()
    elsewhere = [f for f in configured() if name in f.sets and f.netns != cookie]
    lines = []
    if elsewhere:
        with _locked():
            for found in elsewhere:
                detach(found.folder)
                rest = ", ".join(n for n in found.sets if n != name)
                again = f"; run `alfwrapper set early` there for {rest}" if rest else ""
                lines.append(
                    f"{found.name} (network namespace {found.netns:x}): early drop removed{again}"
                )
    if any(name in f.sets for f in here()):
        lines += set_early(name, ())
    return lines


def collect() -> list[str]:
    """Remove the early drop of interfaces, or network namespaces, that are gone (its
    link detached by the kernel): their program held the sets' maps.  gc's."""
    if not ROOT.is_dir():
        return []
    removed = []
    with _locked():
        for found in configured():
            try:
                with _opened(found.folder, ("link",)) as fds:
                    _, ifindex = bpf_calls.link_info(fds["link"])
            except FileNotFoundError:
                ifindex = 0  # never linked: a killed `set early`
            if not ifindex:  # the kernel let go of it: its interface is gone
                detach(found.folder)
                removed.append(found.folder.name)
    return removed


def refresh(narrow: Narrow | None = None, mend: bool = True) -> list[str]:
    """Rewrite the ports and addresses of every interface with early drop in this
    namespace (after a start, a reload, and for status); with ``mend``, a program whose
    pins are not its own (a crash mid-change) is attached again (status and set early:
    not a start, which must not compile for it).  ``narrow``: see denied_by_cookie.
    Lines about what failed (early drop then keeps what it had)."""
    problems: list[str] = []
    if not ROOT.is_dir():
        return problems
    with _locked():
        for found in here():
            try:
                if not _consistent(found):
                    if mend and host_interfaces.link_index(found.name) is not None:
                        attach(found.name, found.sets)
                    continue  # the interface is gone (status says so), or not now
                with _opened(found.folder, ("ports", "local")) as fds:
                    fill(fds["ports"], fds["local"], found.sets, found.netns, narrow)
            except (OSError, AlfError) as err:
                why = err.why if isinstance(err, AlfError) else err.strerror or str(err)
                problems.append(
                    f"early drop on {found.name} was not brought up to date: {why} "
                    "(run `alfwrapper status` as root)"
                )
    return problems


def refresh_for_services(narrow: Narrow | None = None) -> None:
    """refresh() after a start or a reload of root's services, what failed said on
    stderr, a line each (the start goes on).  Callers import this module only where
    state.early_in() says some interface of their namespace has early drop."""
    if not state.store_in_use().opens_sets:
        return  # a user's service: root's services alone are dropped early
    try:
        lines = refresh(narrow, mend=False)
    except Exception as err:  # noqa: BLE001  (early drop is told; the start goes on)
        lines = [f"early drop was not brought up to date: {err} (run `alfwrapper status` as root)"]
    for line in lines:
        print(f"alfwrapper: note: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _opened(folder: Path, roles: Sequence[str]) -> Iterator[dict[str, int]]:
    fds: dict[str, int] = {}
    try:
        for role in roles:
            fds[role] = bpf_calls.obj_get(str(folder / role))
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


def _consistent(found: Interface) -> bool:
    """Are the pinned maps the pinned program's, and is that program the link's (no
    crash mid-change)?"""
    try:
        with _opened(found.folder, ("link", "prog", *MAPS)) as fds:
            prog_id, ifindex = bpf_calls.link_info(fds["link"])
            if not ifindex or bpf_calls.prog_info(fds["prog"]).id != prog_id:
                return False
            used = bpf_calls.prog_map_ids(fds["prog"])
            return all(bpf_calls.map_info_id(fds[role]) in used for role in MAPS)
    except FileNotFoundError:
        return False


class Counts(Record):
    interface: str
    dropped: dict[str, int]  # by set
    passed: int  # judged (a port that denies a set) and passed
    attached: bool


def counts() -> list[Counts]:
    """Each interface's counters (this namespace's)."""
    from alfwrapper.bpf.tables import possible_cpus  # noqa: PLC0415

    found = []
    cpus = possible_cpus()
    with _locked():
        for one in here():
            try:
                found.append(_counts(one, cpus))
            except FileNotFoundError:  # a killed `set early` not mended yet
                found.append(Counts(one.name, dict.fromkeys(one.sets, 0), 0, False))
    return found


def _counts(one: Interface, cpus: int) -> Counts:
    with _opened(one.folder, ("counts", "link")) as fds:
        values = []
        for i in range(len(one.sets) + 1):
            raw = bpf_calls.map_lookup(fds["counts"], struct.pack("=I", i), 8 * cpus) or b""
            values.append(sum(struct.unpack(f"={len(raw) // 8}Q", raw)))
        _, ifindex = bpf_calls.link_info(fds["link"])
    dropped = dict(zip(one.sets, values, strict=False))
    return Counts(one.name, dropped, values[-1], bool(ifindex))


__all__ = [
    "EARLY_PORTS",
    "collect",
    "configured",
    "counts",
    "forget",
    "here",
    "refresh",
    "set_early",
]
