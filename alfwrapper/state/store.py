"""A Store: one tree of pinned state and what can be done to it (a socket taken under its
locked dispatcher, a program loaded and installed in its slot, gone sockets collected),
and the store in use.

A locked filter cannot be replaced, so what is locked never changes: every
socket gets a fixed dispatcher that tail-calls the program in its slot, and
a new policy goes into the slot (one atomic map update).

A Store is the root's tree, or a user's (alfwrapper-users/UID).  A wrapper or command
that cannot reach the tree itself uses the loader's Store instead
(loader.client.Broker), which asks the loader to do the same things in the user's tree;
store_in_use() is the one in use.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from alfwrapper.bpf.program import object_name
from alfwrapper.errors import EX_CONFIG, EX_TEMPFAIL, EX_USAGE, AlfError
from alfwrapper.host import activation, attach, bpf_calls
from alfwrapper.host.faults import crash_point
from alfwrapper.policy.rules import check_service
from alfwrapper.record import Record
from alfwrapper.state.collection import gc_everywhere, gc_here
from alfwrapper.state.inuse import pins_in_use, use_pins
from alfwrapper.state.liveness import socket_cookie, socket_netns_cookie
from alfwrapper.state.lock import LOCK_SECONDS, service_lock
from alfwrapper.state.meta import META_SIZE, claim, write_meta
from alfwrapper.state.places import SocketState, folder_name, is_service_folder, service_of
from alfwrapper.state.trust import ROOT, USERS_ROOT, failure, own, state_root, trusted_dir

if TYPE_CHECKING:
    from alfwrapper.bpf.compiler import LoadedFilter
    from alfwrapper.bpf.parts import FillEnv
    from alfwrapper.policy.rules import SocketRules


def socket_unit_restart() -> str:
    """How to get fresh sockets for this service: the command that restarts the socket
    unit that passed them.  systemd names it (TriggeredBy=) when systemctl may ask; in
    a sandboxed unit it often may not, and then it is the socket unit of the same name,
    systemd's default.  Outside systemd, a general hint."""
    unit = activation.unit_of_this_process()
    if not unit:
        return "restart the socket unit that passes them (systemctl list-sockets)"
    # A user manager sets $MANAGERPID for what it starts, the system one does not
    # (systemd.exec(5)).
    manager = ["--user"] if os.environ.get("MANAGERPID") else []
    sockets = [f"{unit}.socket"]
    import subprocess  # noqa: PLC0415  (3 ms of imports, for this hint alone)

    try:
        out = subprocess.run(
            ["systemctl", *manager, "show", "--property=TriggeredBy", "--value", f"{unit}.service"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        named = [u for u in out.stdout.split() if u.endswith(".socket")]
        if out.returncode == 0 and named:
            sockets = named
    except (OSError, subprocess.TimeoutExpired):
        pass
    return f"run systemctl {' '.join([*manager, 'restart', *sockets])}"


class Store:
    """One tree of pinned state (``base``: ROOT, or a user's) and what can be done to it."""

    # Does this process open the named sets its filters name (and make a missing one
    # from its list file)?  Not a user's: the loader opens root's for them, read-only.
    opens_sets = True

    def __init__(self, base: Path = ROOT, top: Path = ROOT) -> None:
        self.base = base
        self.top = top

    def root(self, create: bool = True) -> Path:
        return state_root(create, self.base, self.top)

    def state(self, service: str, cookie: int) -> SocketState:
        return SocketState(service, cookie, self.base)

    def find(self, service: str, sock: socket.socket) -> SocketState | None:
        """This socket's state, if an earlier start of this service left all of it (the
        dispatcher is pinned last), its folders checked as any start checks them (a
        restart's later steps check the service's folder again: `make mutate` found
        this check alone not missed; it stays, the first a restart meets)."""
        state = self.state(service, socket_cookie(sock))
        if not (state.dir / "dispatch").exists():
            return None
        self.root(create=False)
        trusted_dir(state.service_dir, False)
        trusted_dir(state.dir, False)
        return state

    def load_filter(
        self,
        rules: SocketRules,
        where: SocketState | None,
        label: str,
        cookies: list[int],
        sock: socket.socket | None = None,
        env: FillEnv | None = None,
    ) -> LoadedFilter:
        """Compile and load a program for these rules: against the socket's pinned maps
        (made if missing) if ``where``, else on its own.  Here, with BCC; the loader's
        client (loader.client.Broker) asks the loader instead, so no caller asks which it has.
        ``cookies``: the knock part's listening sockets; ``sock``: the socket of an
        unpinned program (the loader checks it; here unused)."""
        from alfwrapper.bpf import compiler, program  # noqa: PLC0415  (BCC only to load)
        from alfwrapper.bpf.parts import FillEnv, Pins, knock_folders  # noqa: PLC0415

        pins = None
        if where is not None:
            for folder in knock_folders(rules):
                trusted_dir(where.service_dir / folder, create=True)
            pins = Pins(str(where.dir), str(where.service_dir))
        loaded = compiler.load_program(program.plan_program(rules, pins, label), env or FillEnv())
        if cookies and rules.knock:
            compiler.set_knock_listeners(loaded.tables, cookies)
        if where is not None:
            own(where.service_dir)
        return loaded

    def take(self, service: str, sock: socket.socket, label: str, pid: int = 0) -> Taken:
        """Bring a socket to "filtered by our locked dispatcher", from wherever a start
        before this one left it.

        The kernel says whether the socket carries a filter (SO_GET_FILTER); the pins are
        a cache, and what they say is checked against it:

            no pins, no filter  a new socket: pin its state (the dispatcher last), then
                                attach and lock the dispatcher; its empty slot drops
            pins, no filter     a start died between the two: attach the pinned one
            pins, filter        ours (only the holder of the socket can attach, and our
                                pins for its cookie say who did): lock it if a start died
                                before it could
            no pins, filter     someone else's filter: refused

        The invariant: a socket with pinned state carries the dispatcher pinned there,
        attached and locked, or gets it from the next start before anything else is done
        with it.  A kill at any point between the steps leaves one of these four, each
        of which the next start settles.  What was queued on the socket counts as judged
        only once the meta says so (mark_judged, after the judgement), so a start that died
        before that leaves it to the next one.  The pinned dispatcher's own slot is checked
        too (check_pins): a damaged state refuses rather than fill a slot nobody calls.
        ``pid``: the process that will hold the socket (the loader's caller; default
        this one).  The loader's client (Broker.take) makes all of it one request.
        """
        filtered = attach.has_filter(sock)
        found = self.find(service, sock)
        if found is not None:
            problem = self.check_pins(found)
            if problem and filtered:
                raise AlfError(
                    f"the pinned state of {attach.describe(sock)} in {found.dir}",
                    f"is damaged: {problem}",
                    f"nothing was changed; {socket_unit_restart()}",
                    EX_CONFIG,
                )
            if problem:  # no filter yet: nothing relies on it; made anew below
                self.remove(found)
                found = None
        if found is None:
            if filtered:
                raise AlfError(
                    f"filtering {attach.describe(sock)}",
                    f"it carries a filter that alfwrapper did not attach for service {service}",
                    "start with the --service name it was filtered under, or, for fresh "
                    f"sockets, {socket_unit_restart()}",
                    EX_CONFIG,
                )
            made, dispatch = self.create(service, sock, label, pid)
            crash_point("pinned")
            try:
                attach.attach_filter(sock, dispatch)
            finally:
                os.close(dispatch)
            crash_point("attached")
            return Taken(made, judged=False, made=True)
        if not filtered:  # a start died between pinning and attaching
            self.attach_pinned(found, sock)
            crash_point("attached")
            claim(found, pid)
            return Taken(found, judged=False, made=False)
        if not attach.is_locked(sock):  # ... or between attaching and locking
            attach.attach_filter(sock, -1)
        return Taken(found, judged=claim(found, pid).get("judged") is True, made=False)

    def install(self, where: SocketState, prog_fd: int) -> None:
        """Put the program in the socket's slot: one atomic update, no unfiltered moment.
        The socket's runtime rules stay (they are the socket's, not the program's)."""
        slot = self.open_pin(where, "slot")
        try:
            bpf_calls.prog_array_set(slot, 0, prog_fd)
        except OSError as err:
            raise failure(f"installing the new program for {where.dir}", err) from None
        finally:
            os.close(slot)

    def create(
        self, service: str, sock: socket.socket, label: str, pid: int = 0
    ) -> tuple[SocketState, int]:
        """A new socket's state: its directory, slot, meta and dispatcher (named for
        ``label``, program.label).  Returns the dispatcher's fd, to attach.  ``pid``
        is the process that will hold the socket (default: this one)."""
        state = self.state(service, socket_cookie(sock))
        self.root()
        deadline = time.monotonic() + LOCK_SECONDS
        while True:
            trusted_dir(state.service_dir, True)
            # Shared until the meta names this pid: a gc (of another start, or the timer's)
            # then leaves this state alone, and the folder too.
            with service_lock(state.service_dir, exclusive=False) as held:
                if held:
                    return self._make(state, service, sock, label, pid)
            if time.monotonic() >= deadline:  # a gc removed it each time it was made
                raise AlfError(
                    f"{state.service_dir}",
                    f"removed by a gc each time this start made it, for {LOCK_SECONDS:.0f} s",
                    "start the service again",
                    EX_TEMPFAIL,
                )

    def _make(
        self, state: SocketState, service: str, sock: socket.socket, label: str, pid: int
    ) -> tuple[SocketState, int]:
        if state.dir.exists():
            self.remove(state)  # a stale socket of the same cookie cannot exist: leftovers
        trusted_dir(state.dir, True)
        try:
            slot = bpf_calls.map_create(
                bpf_calls.BPF_MAP_TYPE_PROG_ARRAY, object_name(label, "slot"), 4, 4, 1
            )
            meta = bpf_calls.map_create(
                bpf_calls.BPF_MAP_TYPE_ARRAY, object_name(label, "meta"), 4, META_SIZE, 1
            )
            dispatch = bpf_calls.load_dispatcher(slot, f"{label}_d")
            for fd, name in ((slot, "slot"), (meta, "meta"), (dispatch, "dispatch")):
                bpf_calls.obj_pin(fd, state.path(name))
            os.close(slot)
            os.close(meta)
        except OSError as err:
            raise failure(f"pinning the state of {service} in {state.dir}", err) from None
        own(state.dir)
        # Until this socket is bound, sock_diag does not list it: gc keeps it by this pid.
        # Its queue is not judged yet (Store.take).
        write_meta(
            state,
            {
                "pid": pid or os.getpid(),
                "netns": socket_netns_cookie(sock),
                "service": service,
                "judged": False,
            },
        )
        return state, dispatch

    def check_pins(self, where: SocketState) -> str:
        """What is wrong with a socket's pins, or "": the dispatcher a socket filter, its
        slot the very program array it calls into, the meta an array of META_SIZE."""
        try:
            dispatch = self.open_pin(where, "dispatch")
        except AlfError as err:
            return err.why
        try:
            if bpf_calls.prog_type(dispatch) != bpf_calls.BPF_PROG_TYPE_SOCKET_FILTER:
                return "the dispatcher is not a socket filter"
            calls = bpf_calls.prog_map_ids(dispatch)
            for name, shape in (
                ("slot", (bpf_calls.BPF_MAP_TYPE_PROG_ARRAY, 4, 4, 1)),
                ("meta", (bpf_calls.BPF_MAP_TYPE_ARRAY, 4, META_SIZE, 1)),
            ):
                try:
                    fd = self.open_pin(where, name)
                except AlfError as err:
                    return f"{name}: {err.why}"
                try:
                    if bpf_calls.map_shape(fd)[:4] != shape:
                        return f"{name} is not the map alfwrapper makes"
                    if name == "slot" and bpf_calls.map_info_id(fd) not in calls:
                        return "the slot is not the one the dispatcher calls into"
                finally:
                    os.close(fd)
        except OSError as err:
            return err.strerror or str(err)
        finally:
            os.close(dispatch)
        return ""

    def attach_pinned(self, where: SocketState, sock: socket.socket) -> None:
        """Attach and lock the socket's pinned dispatcher (Store.take's repair)."""
        dispatch = self.open_pin(where, "dispatch")
        try:
            attach.attach_filter(sock, dispatch)
        finally:
            os.close(dispatch)

    def remove(self, state: SocketState) -> None:
        """Forget a socket's state: the dispatcher's pin first, so that a kill half-way
        leaves a state no start takes for complete (find)."""
        try:
            (state.dir / "dispatch").unlink()
        except OSError:
            pass
        crash_point("removing")
        shutil.rmtree(state.dir, ignore_errors=True)

    def open_pin(self, state: SocketState, name: str) -> int:
        try:
            return bpf_calls.obj_get(state.path(name))
        except OSError as err:
            raise failure(f"opening {state.path(name)}", err) from None

    def has_pin(self, state: SocketState, name: str) -> bool:
        return (state.dir / name).exists()

    def services(self) -> list[str]:
        root = self.root(create=False)
        return sorted(service_of(p.name) for p in root.iterdir() if is_service_folder(p))

    def sockets_of(self, service: str) -> list[SocketState]:
        self.root(create=False)
        folder = self.base / folder_name(check_service(service))
        if not folder.is_dir():
            raise AlfError(
                f"service {service}",
                "has no pinned state",
                "is it running behind alfwrapper? `alfwrapper status` lists services",
                EX_USAGE,
            )
        trusted_dir(folder, False)
        found = []
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith("sock-") and entry.name[5:].isdigit():
                found.append(self.state(service, int(entry.name[5:])))
        return found

    def gc(self) -> list[SocketState]:
        """Remove the state of sockets of this network namespace that no longer exist
        (collection.gc_here); state from other namespaces is left to `alfwrapper gc`."""
        return gc_here(self)

    def collect(self) -> tuple[list[SocketState], str]:
        """Forget sockets that are gone: in every network namespace when we may enter
        them (root), else in this one.  Returns what was removed, and where we looked."""
        try:
            removed = gc_everywhere([Store(ROOT), *user_stores()])
            return removed, "every network namespace"
        except OSError:
            return self.gc(), "this network namespace (run as root for all)"


def user_stores() -> list[Store]:
    """The trees of users' services (kept by the loader), for root's gc."""
    try:
        uids = [p.name for p in USERS_ROOT.iterdir() if p.name.isdigit()]
    except OSError:
        return []
    return [Store(USERS_ROOT / uid, USERS_ROOT) for uid in sorted(uids)]


class Taken(Record):
    """A socket of a service's, as Store.take left it: filtered by the dispatcher pinned
    in ``state``, and ``judged`` if what was queued on it has been judged since."""

    state: SocketState
    judged: bool
    made: bool  # its state was made by this start


def store_in_use() -> Store:
    """The store in use: root's tree, or the loader's for a user (use_store)."""
    return cast("Store", pins_in_use())


def use_store(chosen: Store) -> None:
    use_pins(chosen)


use_store(Store(ROOT))  # until the loader's client is chosen (loader.client.use_if_needed)
