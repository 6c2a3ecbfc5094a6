"""Per-socket state that outlives the wrapper, pinned in bpffs, and the one place it is kept.

A locked filter cannot be replaced, so what is locked never changes: every
socket gets a fixed dispatcher that tail-calls the program in its slot, and
a new policy goes into the slot (one atomic map update).  Restarts, reloads,
live allow/deny, status and gc all find a socket's state here by its cookie.

    /sys/fs/bpf/alfwrapper/             0700, owned by the alfwrapper user
      SERVICE/                          0700
        knock-HASH/                     knock state of the sockets sharing knock rules
        sock-COOKIE/                    one socket, by its SO_COOKIE
          dispatch                      the program attached and locked on the socket
          slot                          PROG_ARRAY[1]: the policy program in force
          meta                          ARRAY[1]: JSON about the socket, for status and reload
          counters                      PERCPU_ARRAY: verdicts by reason
          runtime, runtime_count        LPM_TRIE and ARRAY[1]: live allow and deny

Pinned objects are guarded by file permissions alone (since Linux 6.5 the
unprivileged_bpf_disabled check covers only creating maps and loading
programs): an application running as uid 0 without capabilities could open a
root-owned pin.  So the tree belongs to a user the application never is, and
every directory on the path is checked before it is trusted.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import re
import shutil
import socket
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from alfwrapper import syscalls
from alfwrapper.errors import EX_CONFIG, EX_NOPERM, EX_OSERR, EX_USAGE, AlfError, excerpt
from alfwrapper.program import object_name

BPFFS = Path("/sys/fs/bpf")
ROOT = BPFFS / "alfwrapper"
OWNER = "alfwrapper"
BPF_FS_MAGIC = 0xCAFE4A11
META_SIZE = 8192
SO_NETNS_COOKIE = 71  # Linux 5.14
_SERVICE = re.compile(r"^[A-Za-z0-9_.@:\\-]{1,200}$")
_U32 = struct.Struct("=I")


def _fail(what: str, err: OSError) -> AlfError:
    code = EX_NOPERM if err.errno in (errno.EPERM, errno.EACCES) else EX_OSERR
    hint = (
        "run as root, or give the unit CAP_DAC_OVERRIDE and CAP_CHOWN besides CAP_BPF"
        if code == EX_NOPERM
        else "run `alfwrapper doctor`"
    )
    return AlfError(what, err.strerror or str(err), hint, code)


def owner() -> tuple[int, int]:
    """The uid and gid the state belongs to."""
    try:
        user = pwd.getpwnam(OWNER)
    except KeyError:
        raise AlfError(
            "pinned state",
            f"the system user {OWNER} does not exist",
            f"create it (adduser --system --group {OWNER}), or run `make setup`",
            EX_CONFIG,
        ) from None
    return user.pw_uid, user.pw_gid


def check_bpffs() -> None:
    try:
        magic = _statfs_magic(str(BPFFS))
    except OSError as err:
        raise _fail(f"{BPFFS}", err) from None
    if magic != BPF_FS_MAGIC:
        raise AlfError(
            f"{BPFFS}",
            "is not a BPF file system",
            "mount one: mount -t bpf -o mode=700 bpf /sys/fs/bpf",
            EX_CONFIG,
        )


def _statfs_magic(path: str) -> int:
    import ctypes  # noqa: PLC0415

    buf = ctypes.create_string_buffer(120)  # struct statfs; f_type is its first word
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.statfs(path.encode(), buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int.from_bytes(buf.raw[:8], "little") & 0xFFFFFFFF


def trusted_dir(path: Path, create: bool) -> None:
    """A directory of ours: made if asked, then checked (no link, our owner, mode 0700)."""
    uid, gid = owner()
    if create:
        try:
            path.mkdir(mode=0o700)
            os.chown(path, uid, gid)
        except FileExistsError:
            pass
        except OSError as err:
            raise _fail(f"creating {path}", err) from None
    try:
        info = path.lstat()
    except FileNotFoundError:
        raise AlfError(f"{path}", "does not exist", "nothing is pinned there", EX_USAGE) from None
    except OSError as err:
        raise _fail(f"{path}", err) from None
    if not stat.S_ISDIR(info.st_mode):
        raise AlfError(f"{path}", "is not a directory", f"remove it as root: rm {path}", EX_CONFIG)
    if info.st_uid != uid or info.st_mode & 0o077:
        raise AlfError(
            f"{path}",
            f"belongs to uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):o}, not to "
            f"{OWNER} with mode 700: someone else may have made it",
            f"inspect it, then remove it as root (rm -r {path})",
            EX_CONFIG,
        )


def state_root(create: bool = True) -> Path:
    check_bpffs()
    trusted_dir(ROOT, create)
    try:
        os.listdir(ROOT)  # ours to enter?  (uid 0 without CAP_DAC_OVERRIDE is not)
    except OSError as err:
        raise _fail(f"{ROOT}", err) from None
    return ROOT


def check_service(name: str) -> str:
    if not _SERVICE.match(name) or name.startswith("."):
        raise AlfError(
            f"service {excerpt(name)}",
            "is not a service name",
            "use letters, digits and . _ @ : - (up to 200)",
            EX_USAGE,
        )
    return name


def service_name(explicit: str, environ: Mapping[str, str], command: tuple[str, ...]) -> str:
    """--service, else the systemd unit this process runs in, else the command's name."""
    if explicit:
        return check_service(explicit)
    unit = unit_of_this_process()
    if unit:
        return check_service(unit)
    base = os.path.basename(command[0]) if command else "alfwrapper"
    return check_service(re.sub(r"[^A-Za-z0-9_.@:-]", "_", base) or "alfwrapper")


def unit_of_this_process() -> str:
    """The systemd service this process runs in (its cgroup's .service), without .service."""
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        units = [p for p in path.split("/") if p.endswith(".service")]
        if units and not units[-1].startswith("user@"):
            return units[-1][: -len(".service")]
    return ""


@dataclass(frozen=True)
class SocketState:
    """Where one socket's pinned state is."""

    service: str
    cookie: int

    @property
    def dir(self) -> Path:
        return ROOT / self.service / f"sock-{self.cookie}"

    @property
    def service_dir(self) -> Path:
        return ROOT / self.service

    def path(self, name: str) -> str:
        return str(self.dir / name)

    def knock_dir(self, key: str) -> Path:
        return self.service_dir / f"knock-{key}"


def socket_cookie(sock: socket.socket) -> int:
    return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, 57, 8), "little")


def netns_cookie() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            return int.from_bytes(s.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")
        except OSError:
            return 0


def find(service: str, sock: socket.socket) -> SocketState | None:
    """This socket's state, if an earlier start of this service left it."""
    state = SocketState(service, socket_cookie(sock))
    return state if (state.dir / "dispatch").exists() else None


def create(service: str, sock: socket.socket, label: str) -> tuple[SocketState, int]:
    """A new socket's state: its directory, slot, meta and dispatcher (named for
    ``label``, program.label).  Returns the dispatcher's fd, to attach."""
    state = SocketState(service, socket_cookie(sock))
    state_root()
    trusted_dir(state.service_dir, True)
    if state.dir.exists():
        remove(state)  # a stale socket of the same cookie cannot exist: leftovers
    trusted_dir(state.dir, True)
    try:
        slot = syscalls.map_create(
            syscalls.BPF_MAP_TYPE_PROG_ARRAY, object_name(label, "slot"), 4, 4, 1
        )
        meta = syscalls.map_create(
            syscalls.BPF_MAP_TYPE_ARRAY, object_name(label, "meta"), 4, META_SIZE, 1
        )
        dispatch = syscalls.load_dispatcher(slot, f"{label}_d")
        for fd, name in ((slot, "slot"), (meta, "meta"), (dispatch, "dispatch")):
            syscalls.obj_pin(fd, state.path(name))
        os.close(slot)
        os.close(meta)
    except OSError as err:
        raise _fail(f"pinning the state of {service} in {state.dir}", err) from None
    own(state.dir)
    # Until this socket is bound, sock_diag does not list it: gc keeps it by this pid.
    write_meta(state, {"pid": os.getpid(), "netns": netns_cookie(), "service": service})
    return state, dispatch


def own(path: Path) -> None:
    """Give everything below path to the state's owner (BCC pins as whoever loads)."""
    uid, gid = owner()
    for entry in [path, *path.rglob("*")]:
        os.chown(entry, uid, gid, follow_symlinks=False)


def install(state: SocketState, prog_fd: int) -> None:
    """Put a program in the socket's slot: one atomic update, no unfiltered moment."""
    slot = open_pin(state, "slot")
    try:
        syscalls.map_update(slot, _U32.pack(0), _U32.pack(prog_fd))
    except OSError as err:
        raise _fail(f"installing the new program for {state.dir}", err) from None
    finally:
        os.close(slot)


def open_pin(state: SocketState, name: str) -> int:
    try:
        return syscalls.obj_get(state.path(name))
    except OSError as err:
        raise _fail(f"opening {state.path(name)}", err) from None


def write_meta(state: SocketState, meta: dict[str, object]) -> None:
    data = json.dumps(meta, sort_keys=True).encode()
    if len(data) > META_SIZE:
        raise AlfError(
            f"{state.dir}", "its description is too long", "use shorter paths or options", EX_USAGE
        )
    fd = open_pin(state, "meta")
    try:
        syscalls.map_update(fd, _U32.pack(0), data.ljust(META_SIZE, b"\0"))
    finally:
        os.close(fd)


def read_meta(state: SocketState) -> dict[str, object]:
    fd = open_pin(state, "meta")
    try:
        raw = syscalls.map_lookup(fd, _U32.pack(0), META_SIZE) or b""
    finally:
        os.close(fd)
    try:
        meta = json.loads(raw.rstrip(b"\0") or b"{}")
    except ValueError:
        meta = {}
    return meta if isinstance(meta, dict) else {}


_RUNTIME_KEY = struct.Struct("=IB3x16s")  # struct alf_runtime_key in runtime.c


def runtime_key(family: int, value: int, length: int) -> bytes:
    width = 32 if family == 4 else 128
    return _RUNTIME_KEY.pack(
        32 + length, family, value.to_bytes(width // 8, "big").ljust(16, b"\0")
    )


def runtime_rules(where: SocketState) -> list[tuple[int, int, int, int]]:
    """The socket's runtime rules: (family, value, length, verdict)."""
    fd = open_pin(where, "runtime")
    try:
        out = []
        for key in syscalls.map_keys(fd, _RUNTIME_KEY.size):
            length, family, raw = _RUNTIME_KEY.unpack(key)
            verdict = syscalls.map_lookup(fd, key, 1)
            width = 32 if family == 4 else 128
            value = int.from_bytes(raw[: width // 8], "big")
            out.append((family, value, length - 32, verdict[0] if verdict else 0))
        return out
    finally:
        os.close(fd)


def set_runtime(where: SocketState, key: bytes, verdict: int | None) -> bool:
    """Add (verdict 1 allow, 2 deny) or remove (None) one runtime rule.  Returns whether
    anything changed.  Touches one map entry, and the "may have rules" flag the filter
    checks first: set on the first rule, cleared only when a start or reload empties
    the map (clearing it on a revoke could race with a deny made at the same time)."""
    fd, flag = open_pin(where, "runtime"), open_pin(where, "runtime_count")
    try:
        if verdict is None:
            return syscalls.map_delete(fd, key)
        old = syscalls.map_lookup(fd, key, 1)
        syscalls.map_update(fd, key, bytes([verdict]))
        syscalls.map_update(flag, _U32.pack(0), _U32.pack(1))
        return old != bytes([verdict])
    except OSError as err:
        raise _fail(f"changing the runtime rules of {where.dir}", err) from None
    finally:
        os.close(fd)
        os.close(flag)


def clear_runtime(where: SocketState) -> None:
    """Forget the runtime rules (a start or a reload); nothing if none were made yet."""
    if not (where.dir / "runtime").exists():
        return
    fd, count_fd = open_pin(where, "runtime"), open_pin(where, "runtime_count")
    try:
        syscalls.map_update(count_fd, _U32.pack(0), _U32.pack(0))
        for key in syscalls.map_keys(fd, _RUNTIME_KEY.size):
            syscalls.map_delete(fd, key)
    finally:
        os.close(fd)
        os.close(count_fd)


def services() -> list[str]:
    root = state_root(create=False)
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def sockets_of(service: str) -> list[SocketState]:
    state_root(create=False)
    folder = ROOT / check_service(service)
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
            found.append(SocketState(service, int(entry.name[5:])))
    return found


def remove(state: SocketState) -> None:
    shutil.rmtree(state.dir, ignore_errors=True)


def live_cookies() -> set[int]:
    """The cookies of every TCP and UDP socket in this network namespace (sock_diag)."""
    from pyroute2 import DiagSocket  # noqa: PLC0415

    found: set[int] = set()
    with DiagSocket() as diag:
        diag.bind()
        for family in (socket.AF_INET, socket.AF_INET6):
            for protocol in (socket.IPPROTO_TCP, socket.IPPROTO_UDP):
                for msg in diag.get_sock_stats(family=family, protocol=protocol):
                    found.add(int(msg["idiag_cookie"]))
    return found


def gc() -> list[SocketState]:
    """Remove the state of sockets of this network namespace that no longer exist.

    Socket cookies are unique until reboot, and sock_diag lists every bound
    socket of a namespace: a socket it does not list, whose process (the
    wrapper that pinned it, then the application) is gone too, is gone.  State
    from other namespaces is left to `alfwrapper gc` (gc_everywhere).
    """
    return _collect(live_cookies(), {netns_cookie()})


def _collect(live: set[int], namespaces: set[int] | None) -> list[SocketState]:
    """Remove socket state whose cookie is not alive (only from these namespaces, if
    given), and knock state no socket refers to any more."""
    try:
        root = state_root(create=False)
    except AlfError:
        return []
    removed = []
    for service_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        kept_knock = set()
        for entry in sorted(service_dir.glob("sock-*")):
            if not entry.name[5:].isdigit():
                continue
            where = SocketState(service_dir.name, int(entry.name[5:]))
            meta = read_meta(where) if (entry / "meta").exists() else {}
            known = namespaces is None or meta.get("netns") in namespaces or not meta
            owner_alive = alive(meta.get("pid"))  # its process: the socket may be unbound
            if known and where.cookie not in live and not owner_alive:
                remove(where)
                removed.append(where)
            else:
                kept_knock.add(str(meta.get("knock", "")))
        for knock in service_dir.glob("knock-*"):
            if knock.name not in kept_knock:
                shutil.rmtree(knock, ignore_errors=True)
        if not any(service_dir.iterdir()):
            service_dir.rmdir()
    return removed


def alive(pid: object) -> bool:
    """Does this process run (neither gone nor a zombie that nobody has reaped)?"""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:  # noqa: PTH123
            stat = f.read(1024)
    except OSError:
        return False
    end = stat.rfind(b")")  # the command name in brackets may hold anything
    return stat[end + 2 : end + 3] not in (b"Z", b"X")


def gc_everywhere() -> list[SocketState]:
    """As root: gc over every network namespace we can find (processes' and /run/netns).

    The state of a socket whose namespace we cannot find (a namespace no process is
    in, held only by a socket unit, or one deleted) is kept: it cannot be told
    from alive.
    """
    alive: set[int] = set()
    seen: set[int] = set()
    for _ in syscalls.each_netns():
        alive |= live_cookies()
        seen.add(netns_cookie())
    return _collect(alive, seen)
