"""The loader's server: accept, serve each connection in a child of its own, bounded in
time, per user and in memory; the operations; the confinement of every compile; and the
`alfwrapper loader` command."""

from __future__ import annotations

import argparse
import errno
import inspect
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alfwrapper import state
from alfwrapper.bpf.parts import INNER_MAPS, SET_BOUND_ROLES, FillEnv
from alfwrapper.errors import (
    EX_CONFIG,
    EX_DATAERR,
    EX_NOPERM,
    EX_SOFTWARE,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    EX_USAGE,
    AlfError,
)
from alfwrapper.host import attach, bpf_calls, cgroups, landlock
from alfwrapper.loader.person import SubuidFile
from alfwrapper.loader.protocol import (
    FD_VALUE_LIMIT,
    LENGTH,
    READ_SECONDS,
    REQUEST_LIMIT,
    WORK_SECONDS,
    bad_request,
    decode_rules,
    from_wire,
    receive,
    request_field,
    send,
    to_wire,
)
from alfwrapper.loader.quota import (
    DEFAULT_MAP_MEMORY,
    DEFAULT_PROGRAMS,
    Caller,
    Limits,
    check_quota,
    no_service,
    open_ledger,
    peer,
    quota_reached,
    record_program,
    services_of,
    with_kin,
)
from alfwrapper.policy.rules import SocketRules, check_service
from alfwrapper.record import replace

WORKERS = 8  # connections served at once


WORKERS_PER_USER = 2


PENDING_PER_USER = 16  # connections of one user waiting for a worker, at most


PENDING = 1024  # of everyone's


# Who counts as whom: a uid in another user's subordinate range is that user (person.py).
SUBUIDS = SubuidFile()


YOURS = "busy with too many requests of yours"


OTHERS = "busy with other users' requests"


# What a user may open of a socket's pinned state (never the dispatcher).
OPENABLE = frozenset(
    {"slot", "meta", "counters", "runtime", "runtime_count", "events", "log_bucket", "spa"}
)


# The map types the built-in filters use (BPF_MAP_TYPE_*): hash, array,
# prog array, percpu array, LRU hash, LPM trie, ring buffer.
MAP_TYPES = frozenset({
    bpf_calls.BPF_MAP_TYPE_HASH, bpf_calls.BPF_MAP_TYPE_ARRAY, bpf_calls.BPF_MAP_TYPE_PROG_ARRAY,
    bpf_calls.BPF_MAP_TYPE_PERCPU_ARRAY, bpf_calls.BPF_MAP_TYPE_LRU_HASH,
    bpf_calls.BPF_MAP_TYPE_LPM_TRIE, bpf_calls.BPF_MAP_TYPE_RINGBUF,
    bpf_calls.BPF_MAP_TYPE_ARRAY_OF_MAPS,  # named sets (sets.c)
})  # fmt: skip


# Those whose values are data (not fds: a program array's or an array of maps' value,
# written, names an fd of whoever makes the call): the ones an "fd" request may write.
DATA_MAP_TYPES = MAP_TYPES - {
    bpf_calls.BPF_MAP_TYPE_PROG_ARRAY,
    bpf_calls.BPF_MAP_TYPE_RINGBUF,
    bpf_calls.BPF_MAP_TYPE_ARRAY_OF_MAPS,
}


PROG_ARRAY = bpf_calls.BPF_MAP_TYPE_PROG_ARRAY


PROG_TYPE_SOCKET_FILTER = bpf_calls.BPF_PROG_TYPE_SOCKET_FILTER


_LABEL = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,9}$")  # program.label()


def serve(listener: socket.socket, limits: Limits) -> None:  # noqa: C901
    """Accept and serve, one child per connection, until SIGTERM."""
    running: dict[int, int] = {}  # child pid -> the person it serves
    stop = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    listener.setblocking(False)

    def reap() -> None:
        while running:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                running.clear()
                return
            if pid == 0:
                return
            running.pop(pid, None)

    pending: list[tuple[socket.socket, Caller, float]] = []  # waiting for a worker
    while not stop:
        reap()
        # One person's requests wait for each other (bounded), never for anyone else's.
        waiting = []
        for conn, who, since in pending:
            mine = sum(1 for person in running.values() if person == who.person)
            if len(running) < WORKERS and mine < WORKERS_PER_USER:
                try:
                    running[_fork_worker(listener, conn, who, limits)] = who.person
                except OSError as err:  # no process to spare now: it waits, bounded
                    print(f"alfwrapper loader: fork: {err}", file=sys.stderr, flush=True)
                    waiting.append((conn, who, since))
                    continue
                conn.close()
            elif time.monotonic() - since > READ_SECONDS:
                # Whose load kept it waiting: the caller's own, or everyone else's.
                why = YOURS if mine >= WORKERS_PER_USER else OTHERS
                _refuse(conn, "the loader", why, "try again", EX_TEMPFAIL)
                conn.close()
            else:
                waiting.append((conn, who, since))
        pending = waiting
        try:
            ready, _, _ = select.select([listener], [], [], 0.02 if pending else 0.5)
        except InterruptedError:
            continue
        if ready:
            pending = _accept_all(listener, pending, limits)
    for conn, _, _ in pending:
        conn.close()


def _accept_all(
    listener: socket.socket, pending: list[tuple[socket.socket, Caller, float]], limits: Limits
) -> list[tuple[socket.socket, Caller, float]]:
    """Everything the listen queue holds (up to PENDING at a time), so that one person's
    flood does not fill the kernel's queue in front of another person's connection."""
    queued: dict[int, int] = {}
    for _, other, _ in pending:
        queued[other.person] = queued.get(other.person, 0) + 1
    for _ in range(PENDING):
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            break
        except OSError as err:  # out of fds or memory: the rest wait in the kernel's queue
            print(f"alfwrapper loader: accepting: {err}", file=sys.stderr, flush=True)
            break
        try:
            who = peer(conn, limits.pins, SUBUIDS.person)
        except OSError:
            conn.close()
            continue
        # Bounded per person: a flood fills only its person's share of the queue; the
        # rest is told "busy" in one non-blocking send, and closed.
        mine = queued.get(who.person, 0)
        if mine >= PENDING_PER_USER or len(pending) >= PENDING:
            try:
                conn.send(BUSY if mine >= PENDING_PER_USER else BUSY_OTHERS, socket.MSG_DONTWAIT)
            except OSError:
                pass
            conn.close()
            continue
        queued[who.person] = mine + 1
        pending.append((conn, who, time.monotonic()))
    return pending


def _busy_answer(why: str) -> bytes:
    data = json.dumps(
        {"error": {"what": "the loader", "why": why, "hint": "try again", "code": EX_TEMPFAIL}}
    )
    return LENGTH.pack(len(data)) + data.encode()


BUSY = _busy_answer("busy with too many connections of yours")


BUSY_OTHERS = _busy_answer(OTHERS)  # everyone's queue is full, not the caller's share


def _fork_worker(listener: socket.socket, conn: socket.socket, who: Caller, limits: Limits) -> int:
    child = os.fork()
    if child == 0:
        listener.close()
        code = 0
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.alarm(int(WORK_SECONDS))
            who = with_kin(who, SUBUIDS.person)  # before confine(): the person's other trees
            if limits.memory is not None:  # all this request makes is charged to its person
                try:
                    limits.memory.enter(who.person, limits.map_memory)
                except OSError as err:
                    _refuse(
                        conn,
                        "loader",
                        f"cannot count your memory ({err})",
                        "the administrator: see the loader's log",
                        EX_SOFTWARE,
                    )
                    raise
            serve_one(conn, who, limits)
        except BaseException:  # noqa: BLE001  (a child never returns to the loop)
            code = 1
        os._exit(code)
    return child


_ANSWERED: list[int] = []  # in a compile's own process: the pipe that says it answered


_SCRATCH: list[str] = []  # the folder a compile may write in (its worker removes it)


_KEPT: list[Any] = []  # in a compile's own process: what it loaded (it serves one request)


def _answered() -> None:
    for fd in _ANSWERED:
        os.write(fd, b"1")


def _compile_apart(conn: socket.socket, who: Caller, limits: Limits) -> bool:
    """In the worker: the load goes on in a child of its own, so that a compiler that
    dies (LLVM aborts on some input) still leaves the user an answer.  False in the
    child, which serves the request; True in the worker once it has been answered."""
    read, write = os.pipe()
    refused = _refusals(who, limits)
    before = refused()
    _SCRATCH[:] = [tempfile.mkdtemp(prefix="alfwrapper-loader-")]  # the compile's, removed after
    child = os.fork()
    if child == 0:
        os.close(read)
        _ANSWERED[:] = [write]
        signal.alarm(int(WORK_SECONDS))
        try:  # the compile, not the worker that answers for it, goes at the quota
            Path("/proc/self/oom_score_adj").write_text("1000")
        except OSError:
            pass
        return False
    os.close(write)
    _, status = os.waitpid(child, 0)
    shutil.rmtree(_SCRATCH[0], ignore_errors=True)
    answered = os.read(read, 1)
    os.close(read)
    if not answered:
        error = _refused_by(refused(), before, limits)
        if error is not None:
            _refuse(conn, error.what, error.why, error.hint, error.exit_code)
            return True
        how = (
            f"killed by signal {os.WTERMSIG(status)}"
            if os.WIFSIGNALED(status)
            else f"exit status {os.waitstatus_to_exitcode(status)}"
        )
        _refuse(
            conn,
            "compiling the filter",
            f"the compiler ended without an answer ({how})",
            "check the filter's asm statements and includes",
            EX_DATAERR,
        )
    return True


def _refusals(who: Caller, limits: Limits) -> Callable[[], tuple[int, int]]:
    """How often the kernel refused memory to the caller's person (their quota) and
    to the loader as a whole (its unit's MemoryMax=), as a call that keeps working
    after confine() (both files are open now)."""
    if limits.memory is None:
        return lambda: (0, 0)
    mine, everyone = limits.memory.watch(who.person), limits.memory.watch_all()
    return lambda: (mine(), everyone())


def _refused_by(now: tuple[int, int], before: tuple[int, int], limits: Limits) -> AlfError | None:
    """Whose memory a failure ran out of: the person's own quota, or the loader's,
    which only other people's filters and requests can have filled meanwhile (a
    person's own limit is reached first)."""
    if now[0] > before[0]:
        return quota_reached(limits)
    if now[1] > before[1]:
        return AlfError(
            "the loader",
            f"{OTHERS}: the memory of all of them is in use",
            "try again later, or ask the administrator",
            EX_TEMPFAIL,
        )
    return None


def _refuse(conn: socket.socket, what: str, why: str, hint: str, code: int = EX_DATAERR) -> None:
    try:
        conn.settimeout(1)
        send(conn, {"error": {"what": what, "why": why, "hint": hint, "code": code}})
        _answered()
    except OSError:
        pass


# What a refused allocation surfaces as, where it is not an AlfError already.
_REFUSED = frozenset({errno.ENOMEM, errno.EPERM, errno.EACCES})


def serve_one(conn: socket.socket, who: Caller, limits: Limits) -> None:
    """One connection: one request, one answer.  Every failure is an answer; one in a
    request during which the kernel refused the user memory (their memory cgroup
    reached its limit) is the quota's, whatever it surfaced as (a map or a program
    refused, a helper's error path), and says so."""
    fds: list[int] = []
    refused = _refusals(who, limits)
    before = refused()  # the files are open now: read again after confine() too
    try:
        message, fds = receive(conn, REQUEST_LIMIT, READ_SECONDS, 2)
        if message.get("op") == "load" and _compile_apart(conn, who, limits):
            return  # answered by the compile's own process, or for it
        answer, out = handle(message, fds, who, limits)
        try:
            send(conn, answer, out)
            _answered()
        except OSError:
            pass  # the caller left; what was made for it goes with this process
    except AlfError as err:
        said = _refused_by(refused(), before, limits) or err
        _refuse(conn, said.what, said.why, said.hint, said.exit_code)
    except Exception as err:  # noqa: BLE001  (hostile input must not end the loader)
        where = err.__traceback__
        while where is not None and where.tb_next is not None:
            where = where.tb_next
        place = f"{Path(where.tb_frame.f_code.co_filename).name}:{where.tb_lineno}" if where else ""
        print(
            f"alfwrapper loader: request of uid {who.uid}: internal error: "
            f"{type(err).__name__}: {err} ({place})",
            file=sys.stderr,
            flush=True,
        )
        error = _refused_by(refused(), before, limits)
        if error is not None and isinstance(err, OSError) and err.errno in _REFUSED:
            _refuse(conn, error.what, error.why, error.hint, error.exit_code)
        else:
            _refuse(
                conn, "loader", f"internal error: {type(err).__name__}", "report it", EX_SOFTWARE
            )
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def _socket_of(fds: list[int]) -> socket.socket:
    """The one socket a request carries: TCP or UDP, IPv4 or IPv6."""
    if len(fds) != 1 or not stat.S_ISSOCK(os.fstat(fds[0]).st_mode):
        raise bad_request("this request carries one socket")
    sock = socket.socket(fileno=os.dup(fds[0]))
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type not in (
        socket.SOCK_STREAM,
        socket.SOCK_DGRAM,
    ):
        sock.close()
        raise bad_request("the socket must be a TCP or UDP one")
    return sock


def _where(message: dict[str, Any], who: Caller) -> state.SocketState:
    service = check_service(request_field(message, "service", str))
    cookie = request_field(message, "cookie", int)
    where = who.store.state(service, cookie)
    if not (where.dir / "dispatch").exists():
        raise AlfError(f"service {service}", f"has no socket {cookie} of yours", "", EX_USAGE)
    return where


Answer = tuple[dict[str, Any], list[int]]


Op = Callable[[dict[str, Any], list[int], Caller, Limits], Answer]


OPS: dict[str, Op] = {}  # every request the loader takes, by its "op"


def _op(name: str) -> Callable[[Op], Op]:
    def register(serve: Op) -> Op:
        OPS[name] = serve
        return serve

    return register


def handle(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    op = message.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise bad_request(f"unknown op {op!r}")
    return OPS[op](message, fds, who, limits)


@_op("services")
def _list_services(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    return {"services": services_of(who.store)}, []


@_op("limits")  # what doctor tells a user about the loader
def _limits(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    return {
        "programs": limits.programs,
        "memory_mib": limits.map_memory >> 20,
        "counted_by_kernel": limits.memory is not None,
        "landlock": landlock.landlock_abi(),
    }, []


@_op("collect")
def _collect(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    removed = who.store.gc()
    return {"removed": [[w.service, w.cookie] for w in removed]}, []


@_op("sockets")
def _sockets(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    service = check_service(request_field(message, "service", str))
    if service not in services_of(who.store):
        no_service(service)
    return {"cookies": [w.cookie for w in who.store.sockets_of(service)]}, []


@_op("pins")
def _pins(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    where = _where(message, who)
    return {"pins": sorted(p.name for p in where.dir.iterdir())}, []


@_op("open")
def _open(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    where = _where(message, who)
    name = request_field(message, "name", str)
    if name not in OPENABLE:
        raise bad_request(f"{name!r} cannot be opened (only {', '.join(sorted(OPENABLE))})")
    return {}, [who.store.open_pin(where, name)]


@_op("remove")
def _remove(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    who.store.remove(_where(message, who))
    return {}, []


@_op("check")
def _check(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    return {"problem": who.store.check_pins(_where(message, who))}, []


@_op("take")  # Store.take: the socket brought under its pinned dispatcher
def _take(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    service = check_service(request_field(message, "service", str))
    label = _label(message)
    with _socket_of(fds) as sock:
        tree = who.store
        tree.root(create=True)
        if not attach.has_filter(sock) and tree.find(service, sock) is None:
            tree.gc()  # a new socket's state: one more dispatcher, within the quota
            check_quota(who, limits, extra_programs=1)
        taken = tree.take(service, sock, label, who.pid)
        return {"cookie": taken.state.cookie, "judged": taken.judged, "made": taken.made}, []


@_op("install")  # Store.install: a socket filter of the caller's into its own slot
def _install(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    where = _where(message, who)
    if len(fds) != 1 or _bpf_kind(fds[0]) != "prog":
        raise bad_request("install carries the fd of one BPF program")
    if bpf_calls.prog_type(fds[0]) != PROG_TYPE_SOCKET_FILTER:
        raise AlfError("install", "only socket filters go in a slot", "", EX_NOPERM)
    who.store.install(where, fds[0])
    return {}, []


@_op("fd")
def _fd(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    return fd_call(message, fds), []


def _bpf_kind(fd: int) -> str:
    """ "map" or "prog" for a BPF object's fd, "" for anything else."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""
    return {"anon_inode:bpf-map": "map", "anon_inode:bpf-prog": "prog"}.get(target, "")


def fd_call(message: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    """Make one of bpf_calls.FD_CALLS on the caller's fds.  Its answer is what the
    kernel says to us, which, for these calls and these object types, is what
    Linux 6.5 says to any holder of the fds: the kernel checks each fd's own read
    and write modes.  Never on a map whose values are fds (they would name ours)."""
    name = request_field(message, "call", str)
    if name not in bpf_calls.FD_CALLS:
        raise bad_request(f"{name!r} is not a call the loader makes on your fds")
    call, fd_params = bpf_calls.FD_CALLS[name]
    if len(fds) != len(fd_params):
        raise bad_request(f"{name} takes {len(fd_params)} fd(s)")
    raw = message.get("args")
    if not isinstance(raw, dict):
        raise bad_request("'args' must be an object")
    params = inspect.signature(call).parameters
    args: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in params or key in fd_params:
            raise bad_request(f"{name} has no argument {key!r}")
        args[key] = _fd_argument(key, params[key].annotation, from_wire(value))
    kinds = {param: _bpf_kind(fd) for param, fd in zip(fd_params, fds, strict=True)}
    for param, fd in zip(fd_params, fds, strict=True):
        wanted = args.get("what") if param == "fd" else param.split("_")[0]
        if kinds[param] != wanted:
            raise bad_request(f"{param} must be the fd of a BPF {wanted}")
        if wanted == "map" and name != "_info":
            kind = bpf_calls.map_shape(fd)[0]
            allowed = {
                "prog_array_set": {PROG_ARRAY},
                "map_lookup": DATA_MAP_TYPES | {PROG_ARRAY},  # a slot's program id
                "map_keys": DATA_MAP_TYPES | {PROG_ARRAY},
            }.get(name, DATA_MAP_TYPES)
            if kind not in allowed:
                raise AlfError(f"{name}", f"not on a map of type {kind}", "", EX_NOPERM)
        if wanted == "prog" and bpf_calls.prog_type(fd) != PROG_TYPE_SOCKET_FILTER:
            raise AlfError(f"{name}", "only on socket filters", "", EX_NOPERM)
    try:
        return {"result": to_wire(call(**dict(zip(fd_params, fds, strict=True)), **args))}
    except OSError as err:  # the kernel's answer, given back as it is
        return {"errno": err.errno or errno.EIO, "why": str(err)}


def _fd_argument(key: str, annotation: str, value: Any) -> Any:
    """An argument of an "fd" call, of its declared type and bounded."""
    if annotation == "bytes" and isinstance(value, bytes) and len(value) <= FD_VALUE_LIMIT:
        return value
    if annotation == "int" and type(value) is int:
        high = {"ingress_ifindex": 2**31 - 1, "repeat": 1000}.get(key, FD_VALUE_LIMIT)
        if 0 <= value <= high:
            return value
    if annotation == "str" and key == "what" and value in ("map", "prog"):
        return value
    raise bad_request(f"argument {key!r} is not a bounded {annotation}")


def _label(message: dict[str, Any]) -> str:
    label = request_field(message, "label", str)
    if not _LABEL.match(label):
        raise bad_request("'label' must be a C identifier of at most 10 characters")
    return str(label)


@_op("load")
def _load(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    rules = decode_rules(message.get("rules"))
    label = _label(message)
    listener = request_field(message, "listener", bool, False)
    where = _where(message, who) if "cookie" in message else None
    cookies: list[int] = []
    if where is None:  # an Accept=yes connection's own program: the socket comes along
        with _socket_of(fds) as sock:
            cookie = state.socket_cookie(sock)
            listener = listener and sock.type == socket.SOCK_STREAM
    else:
        cookie = where.cookie
    if listener:
        cookies = [cookie]
    tree = who.store
    tree.gc()
    check_quota(who, limits, extra_programs=0 if where is not None else 1)
    probe = _fresh_map_id()
    ledger = open_ledger(who, limits)  # before confine(): written after the load
    if limits.memory is not None and limits.memory.current(who.person) >= limits.map_memory:
        raise quota_reached(limits)
    opened = open_sets(rules)  # before confine(): root's sets, read-only
    try:
        confine(tree, rules.custom is not None)
        env = FillEnv(open_set=lambda name, role: os.dup(opened[name, role]))
        # A failure while the kernel refuses the user memory is the quota's (serve_one).
        loaded = tree.load_filter(rules, where, label, cookies, env=env)
    finally:
        for fd in opened.values():
            os.close(fd)
    maps = loaded.tables.fds()
    info = bpf_calls.prog_info(loaded.fd)
    _check_objects(maps, loaded.fd, probe, set(_pinned_ids(where)) if where else set())
    size = sum(bpf_calls.fd_memlock(fd) for fd in maps.values())
    record_program(who, limits, ledger, cookie, size)
    _KEPT.append(loaded)  # its fds close with it: kept until the answer carries them
    return {"program": info.id, "map_bytes": size}, [loaded.fd]


def open_sets(rules: SocketRules) -> dict[tuple[str, str], int]:
    """The maps of the named sets these rules name, by (name, role): root's sets, which
    a user's service may read and never change.  The loader's fds only read (its
    group reads the sets' tree, mode 0750 and 0640; BPF_F_RDONLY), no program may
    write into a set (its maps' BPF_F_RDONLY_PROG, which the verifier enforces), and
    the loader makes no set: it reads no list file of root's."""
    from alfwrapper import sets  # noqa: PLC0415

    opened: dict[tuple[str, str], int] = {}
    try:
        for name in (*rules.deny_sets, *rules.allow_sets):
            for role in SET_BOUND_ROLES:
                try:
                    opened[name, role] = sets.open_role(name, role, read_only=True)
                except AlfError as err:
                    missing = err.exit_code == EX_CONFIG and "does not exist" in err.why
                    raise AlfError(
                        f"named set {name}",
                        f"{err.why} (sets are root's)" if missing else err.why,
                        "ask the administrator to make it: alfwrapper set create NAME"
                        if missing
                        else "the loader reads root's sets in the group alfwrapper-sets, as "
                        "its unit runs it (SupplementaryGroups=); restart it to have "
                        "`alfwrapper loader --prepare` give the tree that group",
                        err.exit_code,
                    ) from None
    except BaseException:
        for fd in opened.values():
            os.close(fd)
        raise
    return opened


def _fresh_map_id() -> int:
    """The id the kernel gives a map made now: every map made by this request is
    newer, and any older one was opened, not made."""
    fd = bpf_calls.map_create(bpf_calls.BPF_MAP_TYPE_ARRAY, "alf_probe", 4, 4, 1)
    try:
        return bpf_calls.map_info_id(fd)
    finally:
        os.close(fd)


def _pinned_ids(where: state.SocketState) -> list[int]:
    """The maps of the socket's own pinned state (the program shares them on purpose)."""
    ids = []
    folder = where.dir
    for path in [*folder.iterdir(), *where.service_dir.glob("knock-*/*")]:
        try:
            fd = bpf_calls.obj_get(str(path))
        except OSError:
            continue
        try:
            ids.append(bpf_calls.map_info_id(fd))
        except OSError:
            pass
        finally:
            os.close(fd)
    return ids


def _check_objects(maps: dict[str, int], prog: int, probe: int, own: set[int]) -> None:
    if bpf_calls.prog_type(prog) != PROG_TYPE_SOCKET_FILTER:
        raise AlfError("loader", "only socket filters are loaded", "", EX_NOPERM)
    for name, fd in maps.items():
        kind = bpf_calls.map_shape(fd)[0]
        # Arrays of maps: the sets part's alone, never one a developer's filter declares.
        outer = kind == bpf_calls.BPF_MAP_TYPE_ARRAY_OF_MAPS and name not in INNER_MAPS
        if kind not in MAP_TYPES or outer:
            raise AlfError(
                f"map {name}", f"its type ({kind}) is not one the loader makes", "", EX_NOPERM
            )
        ident = bpf_calls.map_info_id(fd)
        if ident <= probe and ident not in own:
            raise AlfError(
                f"map {name}",
                "is one that existed before (a pinned or shared map), not made for you",
                "declare maps with BPF_HASH, BPF_ARRAY, ... and no pin",
                EX_NOPERM,
            )


def compile_readable() -> list[str]:
    """What a compile may read: alfwrapper's filter headers and its own modules (some
    are imported on first use), the kernel headers BCC uses (Debian keeps them in
    /usr/src), the count of possible CPUs (per-CPU maps), and this process's own fd
    tables.  Everything else (the loader's files, other
    users' ledgers, /etc, /run, /proc) is out of reach, however a source names it."""
    from alfwrapper.bpf import program  # noqa: PLC0415
    from alfwrapper.host import kernel_headers  # noqa: PLC0415

    paths = {
        str(program.filter_dir()),
        str(Path(__file__).resolve().parents[1]),
        "/usr/src",
        "/sys/devices/system/cpu/possible",
        f"/proc/{os.getpid()}/fd",
        f"/proc/{os.getpid()}/fdinfo",
    }
    tree = kernel_headers.find()
    for extra in (tree.source, *tree.include) if tree and tree.source else ():
        paths.add(str(extra))
    if tree and tree.source is None and not tree.where.startswith("/usr/src/"):
        paths.add(tree.where.split(" ")[0])  # a tree BCC finds by itself (/lib/modules)
    return sorted(p for p in paths if os.path.exists(p))


def confine(tree: state.Store, custom: bool) -> None:
    """From here on this process may read only what compiling needs (compile_readable)
    and write only in the user's own tree and a scratch folder (Landlock, Linux 5.13;
    Debian 12's kernel enables it).  So no spelling of #include, no .incbin, nothing a
    source can name reads a file of the loader's, and no map is pinned elsewhere.  The
    text check (program.checked_source) comes first, for a friendly message; this is
    the guard.  Where Landlock is missing a developer's filter is refused; a built-in
    one (alfwrapper's own C, the user's data only) is compiled all the same."""
    import tempfile  # noqa: PLC0415

    from alfwrapper.bpf import compiler  # noqa: PLC0415

    tree.root(create=True)
    compiler.prepare_to_compile()  # what BCC and libbpf load lazily, loaded now
    readable = compile_readable()
    scratch = _SCRATCH[0] if _SCRATCH else tempfile.mkdtemp(prefix="alfwrapper-loader-")
    tempfile.tempdir = scratch
    os.environ["TMPDIR"] = scratch
    try:
        landlock.landlock_restrict([str(tree.base), scratch], readable)
    except OSError as err:
        if custom:
            raise AlfError(
                "a developer's filter through the loader",
                f"Landlock is not available ({err.strerror or err}): it would be compiled "
                "unconfined",
                "boot with Landlock enabled (lsm=landlock,...; Linux 5.13), or use the "
                "built-in filters",
                EX_UNAVAILABLE,
            ) from None


def add_options(p: argparse.ArgumentParser) -> None:
    """The loader's options, on the parser the command line gives (cli.systemd.loader_parser)."""
    p.add_argument(
        "--listen",
        metavar="PATH",
        default="",
        help="listen here instead of on the socket systemd passes",
    )
    p.add_argument(
        "--max-programs",
        type=int,
        default=DEFAULT_PROGRAMS,
        metavar="N",
        help=f"per user (default {DEFAULT_PROGRAMS})",
    )
    p.add_argument(
        "--max-map-memory",
        type=int,
        default=DEFAULT_MAP_MEMORY >> 20,
        metavar="MIB",
        help=f"per user, in MiB (default {DEFAULT_MAP_MEMORY >> 20})",
    )
    p.add_argument(
        "--pins",
        metavar="DIR",
        default=str(state.USERS_ROOT),
        help=f"where {state.USERS_ROOT} is seen (the unit binds it there)",
    )
    p.add_argument(
        "--sets",
        metavar="DIR",
        default=str(state.SETS_ROOT),
        help=f"where {state.SETS_ROOT} is seen (the unit binds it there, read-only)",
    )
    p.add_argument(
        "--prepare",
        action="store_true",
        help=f"as root, before the loader starts: make {state.ROOT}, "
        f"{state.USERS_ROOT} and {state.SETS_ROOT}",
    )


def main(args: argparse.Namespace) -> int:
    if args.prepare:
        # Root's tree too: the loader's unit hides it under a tmpfs, which needs it there
        # (a manager that runs this inside the unit's namespace shows the tmpfs: skipped).
        if not state.hidden(state.ROOT):
            state.Store().root(create=True)
        state.Store(state.USERS_ROOT, state.USERS_ROOT).root(create=True)
        from alfwrapper import sets  # noqa: PLC0415

        sets.make_tree()  # for the unit's BindReadOnlyPaths=, which needs it there
        return 0
    if os.geteuid() == 0:
        raise AlfError(
            "alfwrapper loader",
            "refuses to run as root",
            "run it as the user alfwrapper with CAP_BPF only, as alfwrapper-loader.service does",
            EX_USAGE,
        )
    state.see_users_tree(Path(args.pins))
    from alfwrapper import sets  # noqa: PLC0415

    sets.use_root(Path(args.sets))
    limits = Limits(
        args.max_programs,
        args.max_map_memory << 20,
        os.environ.get("RUNTIME_DIRECTORY", "/run/alfwrapper-loader").split(":")[0],
        Path(args.pins),
    )
    if args.listen:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.unlink(args.listen)
        except FileNotFoundError:
            pass
        listener.bind(args.listen)
        os.chmod(args.listen, 0o666)
        listener.listen(64)
    else:
        from alfwrapper.host import activation  # noqa: PLC0415

        inherited = activation.inherit_unix_listener(os.environ, os.getpid())
        if inherited is None:
            raise AlfError(
                "alfwrapper loader",
                "no socket: not started by alfwrapper-loader.socket, and no --listen",
                "systemctl start alfwrapper-loader.socket",
                EX_USAGE,
            )
        listener = inherited
    try:
        state.Store(Path(args.pins), Path(args.pins)).root(create=False)  # reachable?
    except AlfError as err:
        raise AlfError(
            f"alfwrapper loader: its pinned tree {args.pins}",
            err.why,
            f"run it from alfwrapper-loader.service, which binds {state.USERS_ROOT} to "
            "/run/alfwrapper-loader/pins (--pins) after `alfwrapper loader --prepare`",
            err.exit_code,
        ) from None
    memory = cgroups.delegated()
    limits = replace(limits, memory=memory)
    counted = (
        f"counted by the kernel in {memory.base}/u<UID>: all a user's requests made and "
        "the one being served"
        if memory is not None
        else "counted from the maps of live sockets only: a program kept by its fd after "
        "its socket is gone is not counted (the unit's Delegate=memory needs cgroup v2)"
    )
    print(
        f"alfwrapper loader: serving (at most {limits.programs} programs and "
        f"{limits.map_memory >> 20} MiB of memory per user, {counted})",
        file=sys.stderr,
        flush=True,
    )
    serve(listener, limits)
    return 0
