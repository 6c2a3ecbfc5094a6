"""The loader: filters for users who may not load BPF themselves.

Since 2021 distributions set kernel.unprivileged_bpf_disabled: creating a map
or loading a program needs CAP_BPF.  Attaching a loaded program to one's own
socket needs nothing (SO_ATTACH_BPF), and since Linux 6.5 neither does using
a map or program one holds an fd of; before 6.5 the loader makes those calls
too ("fd" requests: syscalls.use_fd_proxy), on the fds the user sends, which
the kernel checks as it would check the user's own on 6.5.  So a small service, `alfwrapper loader`
(units alfwrapper-loader.socket and alfwrapper-loader.service), holding
CAP_BPF alone and running as the user alfwrapper-loader, compiles and loads
filters for anyone who asks over /run/alfwrapper/loader.sock, keeps the pinned
state of each user's services in a tree of that user's own (state.user_base,
under /sys/fs/bpf/alfwrapper-users; root services' tree is not in its mount
namespace), and hands back file descriptors (SCM_RIGHTS).  A wrapper or
command without CAP_BPF uses it by itself: Broker is a state.Store whose every
operation is a request here.

The protocol: a request is a 4-byte big-endian length and a JSON object, with
at most two fds (a socket, or the maps and programs of an "fd" call) beside
it; the answer is the same, with the fds it hands back.  Rules travel packed
(PrefixList.packed).  The caller is who SO_PEERCRED says; only the tree of
that uid is ever touched.  Each connection is served by a fresh child process,
bounded in time, so a hostile request can take down only itself.

Limits: requests of at most REQUEST_LIMIT bytes, read within READ_SECONDS,
served within WORK_SECONDS; per user, at most WORKERS_PER_USER served and
PENDING_PER_USER waiting (the rest are told "busy": EX_TEMPFAIL, which the
client retries); per user, at most --max-programs live sockets and
--max-map-memory bytes of memory, counted by the kernel in a memory cgroup of
the user's own where the controller is delegated (cgroups.py), else from the
maps of live sockets; only socket filters, only the map types of the built-in
filters, only maps the request made (fresh ids); every compile confined by
Landlock to reading alfwrapper's headers and modules and the kernel headers
(confine), with the include check (program.checked_source) as a friendly
early error only.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import errno
import fcntl
import inspect
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alfwrapper import state
from alfwrapper.errors import (
    EX_DATAERR,
    EX_NOPERM,
    EX_SOFTWARE,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    EX_USAGE,
    AlfError,
)
from alfwrapper.host import cgroups, syscalls
from alfwrapper.policy.rules import (
    CustomFilter,
    KnockRules,
    MapSetting,
    Prefix,
    SocketRules,
    SubnetRules,
    parse_prefix,
)

SOCKET_PATH = "/run/alfwrapper/loader.sock"
REQUEST_LIMIT = 16 << 20  # packed rules: 5 bytes an IPv4 rule, at most 17 an IPv6 one
RULES_LIMIT = 2_000_000  # allow or deny rules in one request
READ_SECONDS = 10.0
WORK_SECONDS = 120.0
WORKERS = 8  # connections served at once
WORKERS_PER_USER = 2
PENDING_PER_USER = 16  # connections of one user waiting for a worker, at most
PENDING = 1024  # of everyone's
BUSY_SECONDS = 60.0  # how long a client retries while the loader says it is busy
DEFAULT_PROGRAMS = 64
DEFAULT_MAP_MEMORY = 1024 << 20  # a million rules: ~500 MiB while compiling
_LENGTH = struct.Struct("!I")
# What a user may open of a socket's pinned state (never the dispatcher).
OPENABLE = frozenset(
    {"slot", "meta", "counters", "runtime", "runtime_count", "events", "log_bucket"}
)
# The map types the built-in filters use (BPF_MAP_TYPE_*): hash, array,
# prog array, percpu array, LRU hash, LPM trie, ring buffer.
MAP_TYPES = frozenset({
    syscalls.BPF_MAP_TYPE_HASH, syscalls.BPF_MAP_TYPE_ARRAY, syscalls.BPF_MAP_TYPE_PROG_ARRAY,
    syscalls.BPF_MAP_TYPE_PERCPU_ARRAY, syscalls.BPF_MAP_TYPE_LRU_HASH,
    syscalls.BPF_MAP_TYPE_LPM_TRIE, syscalls.BPF_MAP_TYPE_RINGBUF,
})  # fmt: skip
# Those whose values are data (not fds: a program array's value, written, names an
# fd of whoever makes the call): the ones an "fd" request may write.
DATA_MAP_TYPES = MAP_TYPES - {syscalls.BPF_MAP_TYPE_PROG_ARRAY, syscalls.BPF_MAP_TYPE_RINGBUF}
PROG_ARRAY = syscalls.BPF_MAP_TYPE_PROG_ARRAY
PROG_TYPE_SOCKET_FILTER = syscalls.BPF_PROG_TYPE_SOCKET_FILTER
FD_VALUE_LIMIT = 1 << 16  # bytes of a key or value, and most ints, in an "fd" request
_LABEL = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,9}$")  # program.label()


def socket_path() -> str:
    return os.environ.get("ALFWRAPPER_LOADER", SOCKET_PATH)


# -- framing ------------------------------------------------------------------------


def connect(conn: socket.socket, path: str) -> None:
    """Connect, waiting (up to READ_SECONDS) while the listen queue is full: a Unix
    socket with a timeout says EAGAIN at once where a plain one would wait."""
    deadline = time.monotonic() + READ_SECONDS
    while True:
        try:
            conn.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise AlfError(f"the loader ({path})", "its queue stayed full",
                               "try again", EX_TEMPFAIL) from None  # fmt: skip
            time.sleep(0.01)


def send(conn: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    if len(data) > REQUEST_LIMIT:
        raise AlfError("a request to the loader", f"is {len(data) >> 20} MiB, more than the "
                       f"{REQUEST_LIMIT >> 20} MiB it takes", "use fewer rules, or run "
                       "the service with CAP_BPF", EX_DATAERR)  # fmt: skip
    frame = _LENGTH.pack(len(data)) + data
    sent = socket.send_fds(conn, [frame[:65536]], list(fds))
    conn.sendall(frame[sent:])


def receive(
    conn: socket.socket, limit: int, seconds: float, max_fds: int
) -> tuple[dict[str, Any], list[int]]:
    """One message and the fds beside it, within ``limit`` bytes and ``seconds``."""
    deadline = time.monotonic() + seconds
    fds: list[int] = []
    data = b""
    try:
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        data, fds, flags, _ = socket.recv_fds(conn, 65536, max_fds)
        if not data:
            raise AlfError("the loader", "closed the connection without an answer",
                           "see journalctl -u alfwrapper-loader", EX_SOFTWARE)  # fmt: skip
        if flags & socket.MSG_CTRUNC:
            raise _bad("too many file descriptors")
        if len(data) < _LENGTH.size:
            raise _bad("a message must start with its length")
        (length,) = _LENGTH.unpack(data[: _LENGTH.size])
        if length > limit:
            raise _bad(f"{length} bytes is more than the limit of {limit}")
        body = bytearray(data[_LENGTH.size :])
        while len(body) < length:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _bad(f"not all of it arrived within {seconds:.0f} s")
            conn.settimeout(left)
            chunk = conn.recv(min(1 << 20, length - len(body)))
            if not chunk:
                raise _bad("the connection closed in the middle of it")
            body += chunk
        if len(body) > length:
            raise _bad("more bytes than its length says")
        try:
            message = json.loads(bytes(body))
        except RecursionError:  # "[[[[..." : Python's decoder recurses per level
            raise _bad("it nests too deeply") from None
        if not isinstance(message, dict):
            raise _bad("it is not a JSON object")
        return message, fds
    except TimeoutError:
        for fd in fds:
            os.close(fd)
        raise _bad(f"nothing complete arrived within {seconds:.0f} s") from None
    except (ValueError, UnicodeDecodeError) as err:
        for fd in fds:
            os.close(fd)
        raise _bad(f"it is not JSON ({err})") from None
    except AlfError:
        for fd in fds:
            os.close(fd)
        raise


def _bad(why: str) -> AlfError:
    return AlfError("loader request", why, "", EX_DATAERR)


# -- rules, both ways -------------------------------------------------------------------


def encode_rules(rules: SocketRules) -> dict[str, Any]:
    """Rules as the loader takes them: everything already read (a filter's text, a
    knock secret), nothing for the loader to open."""
    from alfwrapper.policy.prefix_list import PrefixList  # noqa: PLC0415

    out: dict[str, Any] = {
        key: {"packed": base64.b64encode(PrefixList.of(prefixes).packed()).decode()}
        for key, prefixes in (("allow", rules.subnets.allow), ("deny", rules.subnets.deny))
    }
    out["log_rate"] = rules.log_rate
    if rules.interfaces:
        out["interfaces"] = list(rules.interfaces)
    if rules.knock:
        k = rules.knock
        out["knock"] = {
            "ports": list(k.ports),
            "secret": k.secret.hex(),
            "steps": k.steps,
            "timeout": k.timeout,
            "open_for": k.open_for,
            "window": k.window,
            "sources": k.sources,
        }
    if rules.custom:
        from alfwrapper.policy.rules import FILTER_LIMIT, read_text_input  # noqa: PLC0415

        source = rules.custom.source or read_text_input(
            rules.custom.path, "--filter", "give a restricted-C file", FILTER_LIMIT
        )
        out["filter"] = {
            "name": rules.custom.path,
            "source": source,
            "sets": [[m.map, m.key, m.value] for m in rules.custom.sets],
        }
    return out


def _field(d: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    value = d.get(key, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise _bad(f"{key!r} must be a {kind.__name__}")
    return value


def _number(d: dict[str, Any], key: str, kind: type, low: float, high: float) -> Any:
    value = _field(d, key, kind)
    if not low <= value <= high:
        raise _bad(f"{key!r} must be from {low} to {high}")
    return value


def _prefixes(d: dict[str, Any], key: str) -> Sequence[Prefix]:
    """A rule list: packed (PrefixList.packed, base64; what encode_rules sends) or a
    list of CIDR strings (for hand-written requests), of at most RULES_LIMIT rules."""
    items = d.get(key, [])
    try:
        if isinstance(items, dict) and set(items) == {"packed"}:
            from alfwrapper.policy.prefix_list import PrefixList  # noqa: PLC0415

            data = base64.b64decode(_field(items, "packed", str), validate=True)
            return PrefixList.unpacked(data, RULES_LIMIT)
        if (
            not isinstance(items, list)
            or len(items) > RULES_LIMIT
            or not all(isinstance(t, str) for t in items)
        ):
            raise _bad(f"'{key}' must be packed rules or a list of CIDR strings")
        return tuple(parse_prefix(t) for t in items)
    except (ValueError, TypeError) as err:  # binascii.Error is a ValueError
        raise _bad(f"'{key}': {err}") from None


def decode_rules(d: Any) -> SocketRules:
    """The rules of a request, checked as strictly as the command line checks them."""
    from alfwrapper.policy.files import accepted  # noqa: PLC0415

    if not isinstance(d, dict):
        raise _bad("'rules' must be an object")
    allowed = {"allow", "deny", "log_rate", "interfaces", "knock", "filter"}
    if set(d) - allowed:
        raise _bad(f"unknown rule keys {sorted(set(d) - allowed)}")
    prefixes: dict[str, Sequence[Prefix]] = {}
    for key in ("allow", "deny"):
        prefixes[key] = _prefixes(d, key)
    if d.get("interfaces"):
        raise AlfError(
            "--interface",
            "the loader cannot follow interface renames for a user's service",
            "use subnet rules, or run the service with CAP_BPF",
            EX_USAGE,
        )
    # 0 is "no log"; the highest is the command line's.
    log_rate = _number(d, "log_rate", int, 0, accepted("log-drops")[1]) if "log_rate" in d else 0
    knock = None
    if "knock" in d:
        k = _field(d, "knock", dict)
        ports = _field(k, "ports", list)
        if len(ports) > 8 or not all(isinstance(p, int) and 0 < p < 65536 for p in ports):
            raise _bad("'knock.ports' must be at most 8 ports")
        try:
            secret = bytes.fromhex(_field(k, "secret", str))
        except ValueError:
            raise _bad("'knock.secret' must be hex") from None
        if len(secret) > 4096 or bool(secret) == bool(ports):
            raise _bad("a knock needs ports or a secret of at most 4 KiB, not both")
        knock = KnockRules(
            ports=tuple(ports),
            secret=secret,
            steps=_number(k, "steps", int, *accepted("knock-steps")),
            timeout=_number(k, "timeout", float, *accepted("knock-timeout")),
            open_for=_number(k, "open_for", float, *accepted("knock-open-for")),
            window=_number(k, "window", int, *accepted("knock-window")),
            sources=_number(k, "sources", int, *accepted("knock-sources")),
        )
    custom = None
    if "filter" in d:
        f = _field(d, "filter", dict)
        name, source = _field(f, "name", str), _field(f, "source", str)
        sets = _field(f, "sets", list, [])
        if len(name) > 4096 or not source or len(source) > (1 << 20) or len(sets) > 100_000:
            raise _bad("'filter' needs a name, and a source of at most 1 MiB")
        if not all(isinstance(s, list) and len(s) == 3 and all(isinstance(x, str) and
                   len(x) < 4096 for x in s) for s in sets):  # fmt: skip
            raise _bad("'filter.sets' must be [map, key, value] strings")
        custom = CustomFilter(name, tuple(MapSetting(*s) for s in sets), source)
    return SocketRules(
        SubnetRules(prefixes["allow"], prefixes["deny"]), (), knock, custom, log_rate
    )


# -- the client: a Store whose operations are requests -------------------------------


class Broker(state.Store):
    """The pinned state of this user's services, through the loader."""

    def __init__(self, path: str = "") -> None:
        super().__init__(state.user_base(os.getuid()))
        self.path = path or socket_path()
        self._pins: dict[state.SocketState, set[str]] = {}

    def request(
        self, message: dict[str, Any], fds: Sequence[int] = (), seconds: float = WORK_SECONDS
    ) -> tuple[dict[str, Any], list[int]]:
        """One request, sent again while the loader is busy (it says so, or closes an
        over-full queue's connection unanswered), for at most BUSY_SECONDS."""
        deadline, pause = time.monotonic() + BUSY_SECONDS, 0.05
        while True:
            try:
                return self._request_once(message, fds, seconds)
            except AlfError as err:
                if err.exit_code != EX_TEMPFAIL or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 2.0)

    def _request_once(
        self, message: dict[str, Any], fds: Sequence[int], seconds: float
    ) -> tuple[dict[str, Any], list[int]]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            try:
                conn.settimeout(READ_SECONDS)
                connect(conn, self.path)
                try:
                    send(conn, message, fds)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused before it was all read: the answer says why
                answer, got = receive(conn, REQUEST_LIMIT, seconds, 8)
            except (FileNotFoundError, ConnectionRefusedError):
                raise unavailable(self.path) from None
            except OSError as err:
                raise AlfError(
                    f"the loader ({self.path})",
                    err.strerror or str(err),
                    "check `systemctl status alfwrapper-loader.service`",
                    EX_UNAVAILABLE,
                ) from None
        error = answer.get("error")
        if isinstance(error, dict):
            for fd in got:
                os.close(fd)
            raise AlfError(
                str(error.get("what", "loader")),
                str(error.get("why", "failed")),
                str(error.get("hint", "")),
                int(error.get("code", EX_SOFTWARE)),
            )
        return answer, got

    def root(self, create: bool = True) -> Path:
        return self.base

    def find(self, service: str, sock: socket.socket) -> state.SocketState | None:
        answer, _ = self.request({"op": "find", "service": service}, [sock.fileno()])
        return self.state(service, int(answer["cookie"])) if answer.get("found") else None

    def create(
        self, service: str, sock: socket.socket, label: str, pid: int = 0
    ) -> tuple[state.SocketState, int]:
        answer, fds = self.request(
            {"op": "create", "service": service, "label": label}, [sock.fileno()]
        )
        return self.state(service, int(answer["cookie"])), fds[0]

    def remove(self, where: state.SocketState) -> None:
        self.request({"op": "remove", "service": where.service, "cookie": where.cookie})

    def check_pins(self, where: state.SocketState) -> str:
        answer, _ = self.request({"op": "check", "service": where.service, "cookie": where.cookie})
        return str(answer.get("problem", ""))

    def attach_pinned(self, where: state.SocketState, sock: socket.socket) -> None:
        """The loader attaches the dispatcher itself: it never leaves the loader."""
        self.request(
            {"op": "attach", "service": where.service, "cookie": where.cookie}, [sock.fileno()]
        )

    def open_pin(self, where: state.SocketState, name: str) -> int:
        _, fds = self.request(
            {"op": "open", "service": where.service, "cookie": where.cookie, "name": name}
        )
        return fds[0]

    def has_pin(self, where: state.SocketState, name: str) -> bool:
        if where not in self._pins:
            answer, _ = self.request(
                {"op": "pins", "service": where.service, "cookie": where.cookie}
            )
            self._pins[where] = set(answer["pins"])
        return name in self._pins[where]

    def services(self) -> list[str]:
        return list(self.request({"op": "services"})[0]["services"])

    def sockets_of(self, service: str) -> list[state.SocketState]:
        answer, _ = self.request({"op": "sockets", "service": service})
        return [self.state(service, int(c)) for c in answer["cookies"]]

    def gc(self) -> list[state.SocketState]:
        return self.collect()[0]

    def collect(self) -> tuple[list[state.SocketState], str]:
        answer, _ = self.request({"op": "collect"})
        removed = [self.state(s, int(c)) for s, c in answer["removed"]]
        return removed, "your services' state, through the loader"

    def fd_call(self, name: str, fds: list[int], args: dict[str, Any]) -> Any:
        """A syscalls call the kernel refused us (before Linux 6.5), made by the loader."""
        answer, _ = self.request(
            {"op": "fd", "call": name, "args": {k: to_wire(v) for k, v in args.items()}}, fds
        )
        if "errno" in answer:  # what the kernel said to the loader, as if to us
            raise OSError(int(answer["errno"]), str(answer.get("why", "")))
        return from_wire(answer.get("result"))

    def load(
        self,
        rules: SocketRules,
        where: state.SocketState | None,
        label: str,
        listener: bool,
        sock: socket.socket | None = None,
    ) -> tuple[int, int]:
        """Compile and load a program for these rules (against the socket's pinned
        maps, if ``where``); its fd and id."""
        message: dict[str, Any] = {
            "op": "load",
            "rules": encode_rules(rules),
            "label": label,
            "listener": listener,
        }
        if where is not None:
            message.update(service=where.service, cookie=where.cookie)
        answer, fds = self.request(message, [sock.fileno()] if sock is not None else [])
        self._pins.pop(where, None) if where is not None else None
        return fds[0], int(answer["program"])

    def load_filter(
        self,
        rules: SocketRules,
        where: state.SocketState | None,
        label: str,
        cookies: list[int],
        sock: socket.socket | None = None,
        env: Any = None,
    ) -> Any:
        """Store.load_filter, by the loader: the program's fd, and the plan's rules (no
        BCC module here; the loader filled the maps)."""
        from alfwrapper.bpf import compiler, program  # noqa: PLC0415

        fd, _ = self.load(rules, where, label, bool(cookies), sock)
        plan = program.ProgramPlan(rules=rules, text="", defines=(), include_dirs=(), parts=(),
                                   label=label)  # fmt: skip
        return compiler.LoadedFilter(bpf=None, fd=fd, plan=plan)


def unavailable(path: str) -> AlfError:
    return AlfError(
        "loading the filter without CAP_BPF",
        f"the loader does not answer on {path}",
        "start it as root: systemctl enable --now alfwrapper-loader.socket "
        "(or run alfwrapper with CAP_BPF)",
        EX_UNAVAILABLE,
    )


def needed() -> bool:
    """Must this process go through the loader?  Yes when it may not create maps and
    load programs itself: without CAP_BPF (or CAP_SYS_ADMIN) where unprivileged BPF
    is disabled.  Where it is allowed, the built-in filters load directly."""
    from alfwrapper.host.privileges import CAP_BPF, CAP_SYS_ADMIN, effective  # noqa: PLC0415

    if effective() & ((1 << CAP_BPF) | (1 << CAP_SYS_ADMIN)):
        return False
    return syscalls.unprivileged_bpf_disabled() != 0  # unknown: as the strict setting


def use_if_needed() -> bool:
    """Use the loader's store for this process when it cannot do the work itself."""
    if not needed():
        return False
    broker = Broker()
    state.use_store(broker)
    syscalls.use_fd_proxy(broker.fd_call)
    return True


# -- the server ---------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    programs: int = DEFAULT_PROGRAMS
    map_memory: int = DEFAULT_MAP_MEMORY
    ledger: str = "/run/alfwrapper-loader"
    pins: Path = state.USERS_ROOT  # where the loader sees the users' tree
    memory: cgroups.UserMemory | None = None  # the kernel counts map_memory, if set


@dataclass(frozen=True)
class Caller:
    pid: int
    uid: int
    gid: int
    pins: Path = state.USERS_ROOT

    @property
    def store(self) -> state.Store:
        return state.Store(state.user_base(self.uid, self.pins), self.pins)


def peer(conn: socket.socket, pins: Path = state.USERS_ROOT) -> Caller:
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return Caller(pid, uid, gid, pins)


def serve(listener: socket.socket, limits: Limits) -> None:
    """Accept and serve, one child per connection, until SIGTERM."""
    running: dict[int, int] = {}  # child pid -> caller uid
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
        # One user's requests wait for each other (bounded), never for anyone else's.
        waiting = []
        for conn, who, since in pending:
            mine = sum(1 for uid in running.values() if uid == who.uid)
            if len(running) < WORKERS and mine < WORKERS_PER_USER:
                try:
                    running[_fork_worker(listener, conn, who, limits)] = who.uid
                except OSError as err:  # no process to spare now: it waits, bounded
                    print(f"alfwrapper loader: fork: {err}", file=sys.stderr, flush=True)
                    waiting.append((conn, who, since))
                    continue
                conn.close()
            elif time.monotonic() - since > READ_SECONDS:
                _refuse(conn, "loader", "busy with too many requests of yours", "try again",
                        EX_TEMPFAIL)  # fmt: skip
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
    """Everything the listen queue holds (up to PENDING at a time), so that one user's
    flood does not fill the kernel's queue in front of another user's connection."""
    queued: dict[int, int] = {}
    for _, other, _ in pending:
        queued[other.uid] = queued.get(other.uid, 0) + 1
    for _ in range(PENDING):
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            break
        except OSError as err:  # out of fds or memory: the rest wait in the kernel's queue
            print(f"alfwrapper loader: accepting: {err}", file=sys.stderr, flush=True)
            break
        try:
            who = peer(conn, limits.pins)
        except OSError:
            conn.close()
            continue
        # Bounded per user: a user's flood fills only that user's share of the queue;
        # the rest is told "busy" in one non-blocking send, and closed.
        if queued.get(who.uid, 0) >= PENDING_PER_USER or len(pending) >= PENDING:
            try:
                conn.send(BUSY, socket.MSG_DONTWAIT)
            except OSError:
                pass
            conn.close()
            continue
        queued[who.uid] = queued.get(who.uid, 0) + 1
        pending.append((conn, who, time.monotonic()))
    return pending


def _busy_answer() -> bytes:
    data = json.dumps(
        {
            "error": {
                "what": "the loader",
                "why": "busy with too many connections of yours",
                "hint": "try again",
                "code": EX_TEMPFAIL,
            }
        }
    )
    return _LENGTH.pack(len(data)) + data.encode()  # fmt: skip


BUSY = _busy_answer()


def _fork_worker(listener: socket.socket, conn: socket.socket, who: Caller, limits: Limits) -> int:
    child = os.fork()
    if child == 0:
        listener.close()
        code = 0
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.alarm(int(WORK_SECONDS))
            if limits.memory is not None:  # all this request makes is charged to its user
                try:
                    limits.memory.enter(who.uid, limits.map_memory)
                except OSError as err:
                    _refuse(conn, "loader", f"cannot count your memory ({err})",
                            "the administrator: see the loader's log", EX_SOFTWARE)  # fmt: skip
                    raise
            serve_one(conn, who, limits)
        except BaseException:  # noqa: BLE001  (a child never returns to the loop)
            code = 1
        os._exit(code)
    return child


_ANSWERED: list[int] = []  # in a compile's own process: the pipe that says it answered
_SCRATCH: list[str] = []  # the folder a compile may write in (its worker removes it)


def _answered() -> None:
    for fd in _ANSWERED:
        os.write(fd, b"1")


def _compile_apart(conn: socket.socket, who: Caller, limits: Limits) -> bool:
    """In the worker: the load goes on in a child of its own, so that a compiler that
    dies (LLVM aborts on some input) still leaves the user an answer.  False in the
    child, which serves the request; True in the worker once it has been answered."""
    read, write = os.pipe()
    before = _limited(who, limits)
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
        if _limited(who, limits) > before:
            error = _quota_reached(limits)
            _refuse(conn, error.what, error.why, error.hint, error.exit_code)
            return True
        how = (f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exit status {os.waitstatus_to_exitcode(status)}")  # fmt: skip
        _refuse(conn, "compiling the filter", f"the compiler ended without an answer ({how})",
                "check the filter's asm statements and includes", EX_DATAERR)  # fmt: skip
    return True


def _limited(who: Caller, limits: Limits) -> int:
    return limits.memory.limited(who.uid) if limits.memory is not None else 0


def _quota_reached(limits: Limits) -> AlfError:
    return AlfError(
        "loader quota",
        f"your filters and this request would take more than the {limits.map_memory >> 20} "
        "MiB of memory allowed",
        "use fewer rules, stop a service, or ask the administrator to raise --max-map-memory",
        EX_NOPERM,
    )


def _refuse(conn: socket.socket, what: str, why: str, hint: str, code: int = EX_DATAERR) -> None:
    try:
        conn.settimeout(1)
        send(conn, {"error": {"what": what, "why": why, "hint": hint, "code": code}})
        _answered()
    except OSError:
        pass


def serve_one(conn: socket.socket, who: Caller, limits: Limits) -> None:
    """One connection: one request, one answer.  Every failure is an answer."""
    fds: list[int] = []
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
        _refuse(conn, err.what, err.why, err.hint, err.exit_code)
    except Exception as err:  # noqa: BLE001  (hostile input must not end the loader)
        import traceback  # noqa: PLC0415

        where = traceback.extract_tb(err.__traceback__)[-1]
        print(
            f"alfwrapper loader: request of uid {who.uid}: internal error: "
            f"{type(err).__name__}: {err} ({Path(where.filename).name}:{where.lineno})",
            file=sys.stderr,
            flush=True,
        )
        _refuse(conn, "loader", f"internal error: {type(err).__name__}", "report it", EX_SOFTWARE)
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def _socket_of(fds: list[int]) -> socket.socket:
    """The one socket a request carries: TCP or UDP, IPv4 or IPv6."""
    if len(fds) != 1 or not stat.S_ISSOCK(os.fstat(fds[0]).st_mode):
        raise _bad("this request carries one socket")
    sock = socket.socket(fileno=os.dup(fds[0]))
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type not in (
        socket.SOCK_STREAM,
        socket.SOCK_DGRAM,
    ):
        sock.close()
        raise _bad("the socket must be a TCP or UDP one")
    return sock


def _where(message: dict[str, Any], who: Caller) -> state.SocketState:
    service = state.check_service(_field(message, "service", str))
    cookie = _field(message, "cookie", int)
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
        raise _bad(f"unknown op {op!r}")
    return OPS[op](message, fds, who, limits)


@_op("services")
def _list_services(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    return {"services": _services(who.store)}, []


@_op("limits")  # what doctor tells a user about the loader
def _limits(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    return {
        "programs": limits.programs,
        "memory_mib": limits.map_memory >> 20,
        "counted_by_kernel": limits.memory is not None,
        "landlock": syscalls.landlock_abi(),
    }, []


@_op("collect")
def _collect(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    removed = who.store.gc()
    return {"removed": [[w.service, w.cookie] for w in removed]}, []


@_op("sockets")
def _sockets(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    service = state.check_service(_field(message, "service", str))
    if service not in _services(who.store):
        _no_service(service)
    return {"cookies": [w.cookie for w in who.store.sockets_of(service)]}, []


@_op("pins")
def _pins(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    where = _where(message, who)
    return {"pins": sorted(p.name for p in where.dir.iterdir())}, []


@_op("open")
def _open(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    where = _where(message, who)
    name = _field(message, "name", str)
    if name not in OPENABLE:
        raise _bad(f"{name!r} cannot be opened (only {', '.join(sorted(OPENABLE))})")
    return {}, [who.store.open_pin(where, name)]


@_op("remove")
def _remove(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    who.store.remove(_where(message, who))
    return {}, []


@_op("check")
def _check(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    return {"problem": who.store.check_pins(_where(message, who))}, []


@_op("attach")  # the pinned dispatcher onto the socket it was made for
def _attach(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    where = _where(message, who)
    with _socket_of(fds) as sock:
        if state.socket_cookie(sock) != where.cookie:
            raise _bad("that socket is not the one this state was made for")
        who.store.attach_pinned(where, sock)
    return {}, []


@_op("find")
def _find(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    service = state.check_service(_field(message, "service", str))
    with _socket_of(fds) as sock:
        who.store.root(create=True)
        found = who.store.find(service, sock)
        return {"found": found is not None, "cookie": state.socket_cookie(sock)}, []


@_op("create")
def _create(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    service = state.check_service(_field(message, "service", str))
    with _socket_of(fds) as sock:
        who.store.gc()
        _check_quota(who, limits, extra_programs=1)
        label = _label(message)
        where, dispatch = who.store.create(service, sock, label, who.pid)
        return {"cookie": where.cookie}, [dispatch]


@_op("fd")
def _fd(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    return fd_call(message, fds), []


# -- calls on fds the user holds, for kernels before 6.5 --------------------------------


def to_wire(value: Any) -> Any:
    """An argument or answer of an "fd" call as JSON."""
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, list):
        return [to_wire(v) for v in value]
    if isinstance(value, syscalls.TestRun):
        return {"run": [value.retval, value.duration_ns]}
    return value


def from_wire(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"bytes"} and isinstance(value["bytes"], str):
        return bytes.fromhex(value["bytes"])
    if isinstance(value, dict) and set(value) == {"run"}:
        return syscalls.TestRun(*(int(x) for x in value["run"]))
    if isinstance(value, list):
        return [from_wire(v) for v in value]
    if isinstance(value, dict):
        raise _bad("an unknown value")
    return value


def _bpf_kind(fd: int) -> str:
    """ "map" or "prog" for a BPF object's fd, "" for anything else."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""
    return {"anon_inode:bpf-map": "map", "anon_inode:bpf-prog": "prog"}.get(target, "")


def fd_call(message: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    """Make one of syscalls.FD_CALLS on the caller's fds.  Its answer is what the
    kernel says to us, which, for these calls and these object types, is what
    Linux 6.5 says to any holder of the fds: the kernel checks each fd's own read
    and write modes.  Never on a map whose values are fds (they would name ours)."""
    name = _field(message, "call", str)
    if name not in syscalls.FD_CALLS:
        raise _bad(f"{name!r} is not a call the loader makes on your fds")
    call, fd_params = syscalls.FD_CALLS[name]
    if len(fds) != len(fd_params):
        raise _bad(f"{name} takes {len(fd_params)} fd(s)")
    raw = message.get("args")
    if not isinstance(raw, dict):
        raise _bad("'args' must be an object")
    params = inspect.signature(call).parameters
    args: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in params or key in fd_params:
            raise _bad(f"{name} has no argument {key!r}")
        args[key] = _fd_argument(key, params[key].annotation, from_wire(value))
    kinds = {param: _bpf_kind(fd) for param, fd in zip(fd_params, fds, strict=True)}
    for param, fd in zip(fd_params, fds, strict=True):
        wanted = args.get("what") if param == "fd" else param.split("_")[0]
        if kinds[param] != wanted:
            raise _bad(f"{param} must be the fd of a BPF {wanted}")
        if wanted == "map" and name != "_info":
            kind = syscalls.map_shape(fd)[0]
            allowed = {
                "prog_array_set": {PROG_ARRAY},
                "map_lookup": DATA_MAP_TYPES | {PROG_ARRAY},  # a slot's program id
                "map_keys": DATA_MAP_TYPES | {PROG_ARRAY},
            }.get(name, DATA_MAP_TYPES)
            if kind not in allowed:
                raise AlfError(f"{name}", f"not on a map of type {kind}", "", EX_NOPERM)
        if wanted == "prog" and syscalls.prog_type(fd) != PROG_TYPE_SOCKET_FILTER:
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
    raise _bad(f"argument {key!r} is not a bounded {annotation}")


def _no_service(service: str) -> None:
    raise AlfError(
        f"service {service}",
        "has no pinned state of yours",
        "is it running behind alfwrapper? `alfwrapper status` lists services",
        EX_USAGE,
    )


def _services(tree: state.Store) -> list[str]:
    try:
        return tree.services()
    except AlfError:
        return []


def _label(message: dict[str, Any]) -> str:
    label = _field(message, "label", str)
    if not _LABEL.match(label):
        raise _bad("'label' must be a C identifier of at most 10 characters")
    return str(label)


@_op("load")
def _load(message: dict[str, Any], fds: list[int], who: Caller, limits: Limits) -> Answer:
    from alfwrapper.bpf import compiler  # noqa: PLC0415  (BCC in this child only)

    rules = decode_rules(message.get("rules"))
    label = _label(message)
    listener = _field(message, "listener", bool, False)
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
    _check_quota(who, limits, extra_programs=0 if where is not None else 1)
    probe = _fresh_map_id()
    ledger = _open_ledger(who, limits)  # before confine(): written after the load
    limited = limits.memory.watch(who.uid) if limits.memory is not None else lambda: 0
    before = limited()
    if limits.memory is not None and limits.memory.current(who.uid) >= limits.map_memory:
        raise _quota_reached(limits)
    confine(tree, rules.custom is not None)
    try:
        loaded = tree.load_filter(rules, where, label, cookies)
    except AlfError:
        if limited() > before:  # the kernel refused an allocation over the quota
            raise _quota_reached(limits) from None
        raise
    maps = compiler.map_fds(loaded.bpf)
    info = syscalls.prog_info(loaded.fd)
    _check_objects(maps, loaded.fd, probe, set(_pinned_ids(where)) if where else set())
    size = sum(syscalls.fd_memlock(fd) for fd in maps.values())
    _record(who, limits, ledger, cookie, size)
    return {"program": info.id, "map_bytes": size}, [loaded.fd]


def _fresh_map_id() -> int:
    """The id the kernel gives a map made now: every map made by this request is
    newer, and any older one was opened, not made."""
    fd = syscalls.map_create(syscalls.BPF_MAP_TYPE_ARRAY, "alf_probe", 4, 4, 1)
    try:
        return syscalls.map_info_id(fd)
    finally:
        os.close(fd)


def _pinned_ids(where: state.SocketState) -> list[int]:
    """The maps of the socket's own pinned state (the program shares them on purpose)."""
    ids = []
    folder = where.dir
    for path in [*folder.iterdir(), *where.service_dir.glob("knock-*/*")]:
        try:
            fd = syscalls.obj_get(str(path))
        except OSError:
            continue
        try:
            ids.append(syscalls.map_info_id(fd))
        except OSError:
            pass
        finally:
            os.close(fd)
    return ids


def _check_objects(maps: dict[str, int], prog: int, probe: int, own: set[int]) -> None:
    if syscalls.prog_type(prog) != PROG_TYPE_SOCKET_FILTER:
        raise AlfError("loader", "only socket filters are loaded", "", EX_NOPERM)
    for name, fd in maps.items():
        kind = syscalls.map_shape(fd)[0]
        if kind not in MAP_TYPES:
            raise AlfError(
                f"map {name}", f"its type ({kind}) is not one the loader makes", "", EX_NOPERM
            )
        ident = syscalls.map_info_id(fd)
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

    paths = {str(program.filter_dir()), str(Path(__file__).resolve().parents[1]), "/usr/src",
             "/sys/devices/system/cpu/possible", f"/proc/{os.getpid()}/fd",
             f"/proc/{os.getpid()}/fdinfo"}  # fmt: skip
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
        syscalls.landlock_restrict([str(tree.base), scratch], readable)
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


# Per-user accounting: the programs and map memory handed out whose sockets exist.


def _ledger_path(who: Caller, limits: Limits) -> str:
    return os.path.join(limits.ledger, f"{who.uid}.json")


def _ledger(who: Caller, limits: Limits) -> dict[str, int]:
    try:
        with open(_ledger_path(who, limits), encoding="utf-8") as f:  # noqa: PTH123
            fcntl.flock(f, fcntl.LOCK_SH)
            ledger = json.load(f)
    except (OSError, ValueError):
        return {}
    return ledger if isinstance(ledger, dict) else {}


def _usage(who: Caller, ledger: dict[str, int]) -> dict[str, int]:
    """cookie -> map bytes, for the user's programs whose sockets still exist (in the
    loader's network namespace, or with pinned state in the user's tree)."""
    tree = who.store
    pinned = set()
    for service in _services(tree):
        try:
            pinned |= {str(w.cookie) for w in tree.sockets_of(service)}
        except AlfError:
            continue
    live = {str(c) for c in state.live_cookies()} | pinned
    usage = {c: int(n) for c, n in ledger.items() if c in live}
    return usage | {c: usage.get(c, 0) for c in pinned}


def _over_quota(usage: dict[str, int], limits: Limits, programs: int, size: int) -> AlfError | None:
    if len(usage) + programs > limits.programs:
        return AlfError(
            "loader quota",
            f"you have {len(usage)} filtered socket(s), and at most {limits.programs} are allowed",
            "stop a service, or ask the administrator to raise --max-programs",
            EX_NOPERM,
        )
    used = sum(usage.values()) + size
    if used > limits.map_memory:
        return AlfError(
            "loader quota",
            f"your filters' maps would take {used / 2**20:.1f} MiB, and at most "
            f"{limits.map_memory >> 20} MiB are allowed",
            "use fewer rules, or ask the administrator to raise --max-map-memory",
            EX_NOPERM,
        )
    return None


def _check_quota(who: Caller, limits: Limits, extra_programs: int) -> None:
    """Before the work: is there room for one more socket at all?"""
    error = _over_quota(_usage(who, _ledger(who, limits)), limits, extra_programs, 0)
    if error is not None:
        raise error


def _open_ledger(who: Caller, limits: Limits) -> Any:
    os.makedirs(limits.ledger, mode=0o700, exist_ok=True)
    fd = os.open(_ledger_path(who, limits), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "r+", encoding="utf-8")


def _record(who: Caller, limits: Limits, f: Any, cookie: int, size: int) -> None:
    """Count this socket's program against the user's quota, or refuse it (before the
    fd is handed out: the program then goes away with this process)."""
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            ledger = json.loads(f.read() or "{}")
        except ValueError:
            ledger = {}
        usage = _usage(who, ledger if isinstance(ledger, dict) else {})
        usage.pop(str(cookie), None)  # a reload replaces the socket's program
        error = _over_quota(usage, limits, 1, size)
        if error is not None:
            raise error
        usage[str(cookie)] = size
        f.seek(0)
        f.truncate()
        json.dump(usage, f)


# -- the command ----------------------------------------------------------------------


def add_options(p: argparse.ArgumentParser) -> None:
    """The loader's options, on the parser the command line gives (cli.loader_parser)."""
    p.add_argument("--listen", metavar="PATH", default="",
                   help="listen here instead of on the socket systemd passes")  # fmt: skip
    p.add_argument("--max-programs", type=int, default=DEFAULT_PROGRAMS, metavar="N",
                   help=f"per user (default {DEFAULT_PROGRAMS})")  # fmt: skip
    p.add_argument("--max-map-memory", type=int, default=DEFAULT_MAP_MEMORY >> 20, metavar="MIB",
                   help=f"per user, in MiB (default {DEFAULT_MAP_MEMORY >> 20})")  # fmt: skip
    p.add_argument("--pins", metavar="DIR", default=str(state.USERS_ROOT),
                   help=f"where {state.USERS_ROOT} is seen (the unit binds it there)")  # fmt: skip
    p.add_argument("--prepare", action="store_true",
                   help=f"as root, before the loader starts: make {state.ROOT} and "
                        f"{state.USERS_ROOT}")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    if args.prepare:
        # Root's tree too: the loader's unit hides it under a tmpfs, which needs it there
        # (a manager that runs this inside the unit's namespace shows the tmpfs: skipped).
        if not state.hidden(state.ROOT):
            state.Store().root(create=True)
        state.Store(state.USERS_ROOT, state.USERS_ROOT).root(create=True)
        return 0
    if os.geteuid() == 0:
        raise AlfError(
            "alfwrapper loader",
            "refuses to run as root",
            "run it as the user alfwrapper with CAP_BPF only, as alfwrapper-loader.service does",
            EX_USAGE,
        )
    state.see_users_tree(Path(args.pins))
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
    limits = dataclasses.replace(limits, memory=memory)
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
