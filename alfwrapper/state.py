"""Per-socket state that outlives the wrapper, pinned in bpffs, and the one place it is kept.

A locked filter cannot be replaced, so what is locked never changes: every
socket gets a fixed dispatcher that tail-calls the program in its slot, and
a new policy goes into the slot (one atomic map update).  Restarts, reloads,
live allow/deny, status and gc all find a socket's state here by its cookie.

    /sys/fs/bpf/alfwrapper/             0700, owned by the alfwrapper user (root's services)
      SERVICE/                          0700
        knock-HASH/                     knock state of the sockets sharing knock rules
        knock-spa/                      the service's SPA replay table (parts.SPA_TABLE)
        sock-COOKIE/                    one socket, by its SO_COOKIE
          dispatch                      the program attached and locked on the socket
          slot                          PROG_ARRAY[1]: the policy program in force
          meta                          ARRAY[1]: JSON about the socket, for status and reload
          counters                      PERCPU_ARRAY: verdicts by reason
          runtime, runtime_count        LPM_TRIE and ARRAY[1]: live allow and deny
    /sys/fs/bpf/alfwrapper-users/       0700, owned by the alfwrapper-loader user
      UID/SERVICE/...                   the same, for the services of user UID, kept by
                                        the loader (loader/) on that user's requests
    /sys/fs/bpf/alfwrapper-sets/        0700, owned by the alfwrapper-sets user: the
      NAME/hosts, NAME/ranges           named sets (sets.py), which the CrowdSec
                                        bouncer runs as, reaching nothing else

Pinned objects are guarded by file permissions alone (since Linux 6.5 the
unprivileged_bpf_disabled check covers only creating maps and loading
programs): an application running as uid 0 without capabilities could open a
root-owned pin.  So the tree belongs to a user the application never is, and
every directory on the path is checked before it is trusted.  The users' tree
belongs to the loader's own user, and root's is not even in the loader's mount
namespace: a loader taken over by a local user's filter reaches no root service.

A Store is one such tree and what can be done to it: the root's, or a user's
(alfwrapper-users/UID).  A wrapper or command that cannot reach the tree itself uses the
loader's Store instead (loader.client.Broker), which asks the loader to do the same
things in the user's tree; store() is the one in use.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import pwd
import shutil
import socket
import stat
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from alfwrapper.bpf.parts import RUNTIME_KEY
from alfwrapper.bpf.program import object_name
from alfwrapper.errors import (
    EX_CONFIG,
    EX_NOPERM,
    EX_OSERR,
    EX_TEMPFAIL,
    EX_USAGE,
    AlfError,
)
from alfwrapper.host import activation, attach, bpf_calls, libc, netns, sockdiag
from alfwrapper.host.faults import crash_point
from alfwrapper.policy.rules import check_service, valid_service
from alfwrapper.record import Record

if TYPE_CHECKING:
    from alfwrapper.bpf.compiler import LoadedFilter
    from alfwrapper.bpf.parts import FillEnv
    from alfwrapper.policy.rules import SocketRules

BPFFS = Path("/sys/fs/bpf")
ROOT = BPFFS / "alfwrapper"
OWNER = "alfwrapper"
USERS_ROOT = BPFFS / "alfwrapper-users"
LOADER_OWNER = "alfwrapper-loader"
# Where the users' tree is seen: here, and where the loader's unit binds it (--pins).
_USERS_VIEWS = [USERS_ROOT]
SETS_ROOT = BPFFS / "alfwrapper-sets"  # named sets (alfwrapper/sets.py)
SETS_OWNER = "alfwrapper-sets"
_SETS_VIEWS = [SETS_ROOT]
BPF_FS_MAGIC = 0xCAFE4A11
TMPFS_MAGIC = 0x01021994
META_SIZE = 8192
LOCK_SECONDS = 10.0  # how long a start waits for a gc to let go of its service's folder
SO_NETNS_COOKIE = 71  # Linux 5.14
_U32 = struct.Struct("=I")


def _fail(what: str, err: OSError) -> AlfError:
    code = EX_NOPERM if err.errno in (errno.EPERM, errno.EACCES) else EX_OSERR
    hint = (
        "run as root, or give the unit CAP_DAC_OVERRIDE and CAP_CHOWN besides CAP_BPF"
        if code == EX_NOPERM
        else "run `alfwrapper doctor`"
    )
    return AlfError(what, err.strerror or str(err), hint, code)


def see_users_tree(at: Path) -> None:
    """The users' tree is (also) seen at ``at``: its folders belong to LOADER_OWNER."""
    _USERS_VIEWS.append(at)


@functools.cache
def _account(name: str) -> pwd.struct_passwd:
    """A system user's entry, read once (the loader's compile may not read /etc then)."""
    return pwd.getpwnam(name)


def see_sets_tree(at: Path) -> None:
    """The sets' tree is (also) seen at ``at``: its folders belong to SETS_OWNER."""
    _SETS_VIEWS.append(at)


def _in_sets_tree(path: Path | None) -> bool:
    return path is not None and any(path.is_relative_to(v) for v in _SETS_VIEWS)


def modes(path: Path) -> tuple[int, int]:
    """The modes of the folders and the pins at ``path``: the owner's alone (0700,
    0600), but in the sets' tree, whose group may pass through its folders (not list
    them) and read its pins (0710, 0640): the loader runs in the group, and opens a
    set's maps read-only for a user's service."""
    return (0o710, 0o640) if _in_sets_tree(path) else (0o700, 0o600)


def owner_name(path: Path | None = None) -> str:
    if _in_sets_tree(path):
        return SETS_OWNER
    users = path is not None and any(path.is_relative_to(v) for v in _USERS_VIEWS)
    return LOADER_OWNER if users else OWNER


def owner(path: Path | None = None) -> tuple[int, int]:
    """The uid and gid the state at ``path`` belongs to: the loader's user in the users'
    tree, alfwrapper in root's."""
    name = owner_name(path)
    try:
        user = _account(name)
    except KeyError:
        raise AlfError(
            "pinned state",
            f"the system user {name} does not exist",
            "create it (systemd-sysusers /usr/lib/sysusers.d/alfwrapper.conf), or run `make setup`",
            EX_CONFIG,
        ) from None
    return user.pw_uid, user.pw_gid


def check_bpffs(where: Path = BPFFS) -> None:
    try:
        magic = libc.statfs_type(str(where))
    except OSError as err:
        raise _fail(f"{where}", err) from None
    if magic != BPF_FS_MAGIC:
        raise AlfError(
            f"{where}",
            "is not a BPF file system",
            "mount one: mount -t bpf -o mode=700 bpf /sys/fs/bpf",
            EX_CONFIG,
        )


def hidden(path: Path) -> bool:
    """Is ``path`` covered by a tmpfs (the loader's unit hides root's tree so)?"""
    try:
        return libc.statfs_type(str(path)) == TMPFS_MAGIC
    except OSError:
        return False


def trusted_dir(path: Path, create: bool) -> None:  # noqa: C901
    """A directory of ours: made if asked, then checked (no link, our owner, mode 0700).

    Starts that make the same folder at once (several units' first starts after a
    boot) see each other's: one made between its mkdir and its chown (by whatever uid
    the unit runs as) is waited for, and one a gc removed meanwhile is made again,
    for up to a second."""
    uid, gid = owner(path)
    deadline = time.monotonic() + 1.0
    while True:
        if create:
            try:
                path.mkdir(mode=0o700)
                crash_point("folder-made")
                give_dir(path, uid, gid, modes(path)[0])
            except FileExistsError:
                pass
            except FileNotFoundError as err:
                # A gc removed the empty folder between the mkdir and the chown.
                if time.monotonic() < deadline:
                    continue
                raise _fail(f"creating {path}", err) from None
            except OSError as err:
                raise _fail(f"creating {path}", err) from None
        try:
            info = path.lstat()
        except FileNotFoundError:
            if create and time.monotonic() < deadline:
                continue  # removed by a gc since: make it again
            raise AlfError(
                f"{path}", "does not exist", "nothing is pinned there", EX_USAGE
            ) from None
        except OSError as err:
            raise _fail(f"{path}", err) from None
        handing_over = (
            create
            and stat.S_ISDIR(info.st_mode)
            and info.st_uid != uid
            and not info.st_mode & ~modes(path)[0] & 0o777  # as made, before its chown
        )
        if not handing_over or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    if not stat.S_ISDIR(info.st_mode):
        raise AlfError(f"{path}", "is not a directory", f"remove it as root: rm {path}", EX_CONFIG)
    mode = modes(path)[0]
    if info.st_uid != uid or info.st_mode & ~mode & 0o777:
        raise AlfError(
            f"{path}",
            f"belongs to uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):o}, not to "
            f"{owner_name(path)} with mode {mode:o}: someone else may have made it",
            f"inspect it, then remove it as root (rm -r {path})",
            EX_CONFIG,
        )


def state_root(create: bool = True, base: Path = ROOT, top: Path = ROOT) -> Path:
    """The tree at ``base`` (``top``, or a user's under it), each folder on the way
    checked.  ``top`` is ROOT, or USERS_ROOT where the loader sees it (its unit binds
    it to a path the loader's user can reach)."""
    check_bpffs(top.parent if top in (ROOT, USERS_ROOT) else top)
    folder = top
    trusted_dir(folder, create)
    for part in base.relative_to(top).parts:
        folder = folder / part
        trusted_dir(folder, create)
    try:
        os.listdir(base)  # ours to enter?  (uid 0 without CAP_DAC_OVERRIDE is not)
    except OSError as err:
        raise _fail(f"{base}", err) from None
    return base


def user_base(uid: int, top: Path = USERS_ROOT) -> Path:
    """Where the state of user ``uid``'s services is kept."""
    return top / str(uid)


def folder_name(service: str) -> str:
    """A service's folder: bpffs reserves names with a dot (EPERM), so dots are
    written %2E."""
    return service.replace(".", "%2E")


def service_of(folder: str) -> str:
    return folder.replace("%2E", ".")


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
            ["systemctl", *manager, "show", "--property=TriggeredBy", "--value",
             f"{unit}.service"],
            capture_output=True, text=True, timeout=5,
        )  # fmt: skip
        named = [u for u in out.stdout.split() if u.endswith(".socket")]
        if out.returncode == 0 and named:
            sockets = named
    except (OSError, subprocess.TimeoutExpired):
        pass
    return f"run systemctl {' '.join([*manager, 'restart', *sockets])}"


class SocketState(Record):
    """Where one socket's pinned state is."""

    service: str
    cookie: int
    base: Path = ROOT  # the tree it is in: ROOT, or a user's (user_base)

    @property
    def dir(self) -> Path:
        return self.service_dir / f"sock-{self.cookie}"

    @property
    def service_dir(self) -> Path:
        return self.base / folder_name(self.service)

    def path(self, name: str) -> str:
        return str(self.dir / name)


socket_cookie = attach.socket_cookie


def socket_netns_cookie(sock: socket.socket) -> int:
    """The network namespace a socket lives in (SO_NETNS_COOKIE, Linux 5.14), or 0."""
    try:
        return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")
    except OSError:
        return 0


def netns_cookie() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return socket_netns_cookie(s)


def own(path: Path) -> None:
    """Give everything below path to the state's owner (BCC pins as whoever loads).
    What a gc removes meanwhile is passed over."""
    uid, gid = owner(path)
    os.chown(path, uid, gid, follow_symlinks=False)
    for folder, dirs, files in os.walk(path):  # listing errors (a folder gone) are skipped
        for name in dirs + files:
            try:
                os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)
            except FileNotFoundError:
                pass


def give_dir(path: Path, uid: int, gid: int, mode: int) -> None:
    """A folder just made, given away by its fd: whoever can write its parent (the
    sets' tree belongs to the bouncer's user) may swap a link in for it, which a
    chown by name would follow.  Its mode first, while this process owns it (no
    CAP_FOWNER needed)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
            os.fchmod(fd, mode)
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


# What a socket's meta holds besides the options and the folder: counts, ids and
# names of bounded size (lifecycle/kept.py: describe_sockets), well within this.
META_FIXED = 1280


def check_meta_room(argv: list[str], cwd: str) -> None:
    """Refuse, before anything is changed, options that its meta could not hold."""
    if len(json.dumps({"argv": argv, "cwd": cwd}).encode()) + META_FIXED > META_SIZE:
        raise AlfError(
            "the rule options",
            f"are too long to keep for reload (at most about {META_SIZE - META_FIXED} bytes "
            "with the working directory)",
            "put the rules in a policy file or a rule file (--policy, --allow-file)",
            EX_USAGE,
        )


def write_meta(state: SocketState, meta: dict[str, object]) -> None:
    data = json.dumps(meta, sort_keys=True).encode()
    if len(data) > META_SIZE:
        raise AlfError(
            f"{state.dir}", "its description is too long", "use shorter paths or options", EX_USAGE
        )
    fd = open_pin(state, "meta")
    try:
        bpf_calls.map_update(fd, _U32.pack(0), data.ljust(META_SIZE, b"\0"))
    finally:
        os.close(fd)


def read_meta(state: SocketState) -> dict[str, object]:
    fd = open_pin(state, "meta")
    try:
        raw = bpf_calls.map_lookup(fd, _U32.pack(0), META_SIZE) or b""
    finally:
        os.close(fd)
    try:
        meta = json.loads(raw.rstrip(b"\0") or b"{}")
    except ValueError:
        meta = {}
    return meta if isinstance(meta, dict) else {}


def runtime_key(family: int, value: int, length: int) -> bytes:
    """A runtime rule as struct alf_runtime_key (parts.RUNTIME_KEY)."""
    width = 32 if family == 4 else 128
    return RUNTIME_KEY.pack(
        32 + length, family, b"", value.to_bytes(width // 8, "big").ljust(16, b"\0")
    )


def runtime_rules(where: SocketState) -> list[tuple[int, int, int, int]]:
    """The socket's runtime rules: (family, value, length, verdict)."""
    fd = open_pin(where, "runtime")
    try:
        out = []
        for key in bpf_calls.map_keys(fd, RUNTIME_KEY.size):
            length, family, _, raw = RUNTIME_KEY.unpack(key)
            verdict = bpf_calls.map_lookup(fd, key, 1)
            width = 32 if family == 4 else 128
            value = int.from_bytes(raw[: width // 8], "big")
            out.append((family, value, length - 32, verdict[0] if verdict else 0))
        return out
    finally:
        os.close(fd)


def set_runtime(where: SocketState, key: bytes, verdict: int | None) -> bool:
    """Add (verdict 1 allow, 2 deny) or remove (None) one runtime rule.  Returns whether
    anything changed.  Touches one map entry, and the "may have rules" flag the filter
    checks first: set on the first rule, never cleared (clearing it on a revoke could
    race with a deny made at the same time)."""
    fd, flag = open_pin(where, "runtime"), open_pin(where, "runtime_count")
    try:
        if verdict is None:
            return bpf_calls.map_delete(fd, key)
        old = bpf_calls.map_lookup(fd, key, 1)
        # The flag first: a kill between the two leaves a flag with no rule (a trie
        # walk for nothing), never a rule the filter does not look at.
        bpf_calls.map_update(flag, _U32.pack(0), _U32.pack(1))
        crash_point("rule-flagged")
        bpf_calls.map_update(fd, key, bytes([verdict]))
        return old != bytes([verdict])
    except OSError as err:
        raise _fail(f"changing the runtime rules of {where.dir}", err) from None
    finally:
        os.close(fd)
        os.close(flag)


def holds_runtime_rules(where: SocketState, tree: Store | None = None) -> bool:
    """Does the socket's runtime map hold any rule (one key looked up, not all)?"""
    tree = tree or store()
    if not tree.has_pin(where, "runtime"):
        return False
    try:
        fd = tree.open_pin(where, "runtime")
    except AlfError:
        return False  # removed meanwhile
    try:
        return bpf_calls.map_first_key(fd, RUNTIME_KEY.size) is not None
    finally:
        os.close(fd)


def inherit_runtime(where: SocketState, name: str) -> int:
    """Give this socket the runtime rules of its service's other sockets named ``name``
    (gone or alive: the state of a gone one with rules is kept until a socket of its
    name holds them, Store._collect_service), so that a restart that makes new sockets
    keeps every ban.  A prefix one holds as allow and another as deny is denied.  Run
    by every start before its program is installed, and again once its meta names the
    socket (a deny in between reached the old sockets alone).  Returns how many rules
    this socket was given."""
    wanted: dict[bytes, int] = {}
    for other in store().sockets_of(where.service):
        if other.cookie == where.cookie:
            continue
        try:
            if read_meta(other).get("name") != name or not store().has_pin(other, "runtime"):
                continue
            rules = runtime_rules(other)
        except AlfError:
            continue  # collected meanwhile: a socket of this name holds its rules
        for family, value, length, verdict in rules:
            key = runtime_key(family, value, length)
            wanted[key] = max(wanted.get(key, 0), verdict)  # RUNTIME_DENY (2) wins
    if not wanted:
        return 0
    mine = {runtime_key(f, v, n): verdict for f, v, n, verdict in runtime_rules(where)}
    given = 0
    for key, verdict in wanted.items():
        if mine.get(key, 0) < verdict:
            set_runtime(where, key, verdict)
            crash_point("rule-inherited")
            given += 1
    return given


def live_cookies() -> set[int]:
    """The cookies of every TCP and UDP socket in this network namespace (sock_diag)."""
    return sockdiag.live_cookies()


def alive(pid: object) -> bool:
    """Does this process run (neither gone nor a zombie that nobody has reaped)?"""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(1024)
    except OSError:
        return False
    end = stat.rfind(b")")  # the command name in brackets may hold anything
    return stat[end + 2 : end + 3] not in (b"Z", b"X")


def open_pin(state: SocketState, name: str) -> int:
    """An fd of one of the socket's pinned objects (from the store in use)."""
    return store().open_pin(state, name)


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
            raise _fail(f"installing the new program for {where.dir}", err) from None
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
            raise _fail(f"pinning the state of {service} in {state.dir}", err) from None
        own(state.dir)
        # Until this socket is bound, sock_diag does not list it: gc keeps it by this pid.
        # Its queue is not judged yet (Store.take).
        write_meta(
            state,
            {"pid": pid or os.getpid(), "netns": socket_netns_cookie(sock), "service": service,
             "judged": False},
        )  # fmt: skip
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
            raise _fail(f"opening {state.path(name)}", err) from None

    def has_pin(self, state: SocketState, name: str) -> bool:
        return (state.dir / name).exists()

    def services(self) -> list[str]:
        root = self.root(create=False)
        return sorted(service_of(p.name) for p in root.iterdir() if _service_folder(p))

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
        """Remove the state of sockets of this network namespace that no longer exist.

        Socket cookies are unique until reboot, and sock_diag lists every bound
        socket of a namespace: a socket it does not list, whose process (the
        wrapper that pinned it, then the application) is gone too, is gone.  State
        from other namespaces is left to `alfwrapper gc` (gc_everywhere).
        """
        settled = self.socket_folders()
        # Asked only if some socket's process is gone (a dump of every socket).
        return self._collect(settled, functools.cache(live_cookies), {netns_cookie()})

    def collect(self) -> tuple[list[SocketState], str]:
        """Forget sockets that are gone: in every network namespace when we may enter
        them (root), else in this one.  Returns what was removed, and where we looked."""
        try:
            return gc_everywhere(), "every network namespace"
        except OSError:
            return self.gc(), "this network namespace (run as root for all)"

    def socket_folders(self) -> set[Path]:
        """The socket folders there are now: a gc lists them before it asks which
        sockets live, and judges only these.  A socket made after that question is
        alive whatever its meta says, and a meta may say nothing (damaged)."""
        try:
            root = self.root(create=False)
            return {p for d in root.iterdir() if _service_folder(d) for p in d.glob("sock-*")}
        except (AlfError, OSError):
            return set()

    def _collect(
        self, settled: set[Path], live: Callable[[], set[int]], namespaces: set[int] | None
    ) -> list[SocketState]:
        """Remove the state of the ``settled`` sockets whose cookie is not alive (``live()``,
        asked after ``settled`` was listed; only from these namespaces, if given), and
        knock state no socket refers to any more."""
        try:
            root = self.root(create=False)
        except AlfError:
            return []
        removed = []
        for service_dir in sorted(p for p in root.iterdir() if _service_folder(p)):
            with service_lock(service_dir, exclusive=True) as alone:
                removed += self._collect_service(service_dir, settled, live, namespaces, alone)
        return removed

    def _collect_service(  # noqa: C901
        self,
        service_dir: Path,
        settled: set[Path],
        live: Callable[[], set[int]],
        namespaces: set[int] | None,
        alone: bool,
    ) -> list[SocketState]:
        """One service's folder.  Unless ``alone`` (no start is making state in it), state
        without meta is a start's in progress, and the folder stays."""
        removed = []
        kept_knock = set()
        gone: list[tuple[SocketState, dict[str, object]]] = []
        staying: set[object] = set()  # the names of the sockets that stay
        try:
            entries = sorted(service_dir.iterdir())
        except FileNotFoundError:
            return []  # removed by another gc
        for entry in entries:
            if not entry.name.startswith("sock-") or not entry.name[5:].isdigit():
                continue
            if entry not in settled:  # made after the gc asked which sockets live
                kept_knock.add("*")
                continue
            where = self.state(service_of(service_dir.name), int(entry.name[5:]))
            try:
                meta = read_meta(where) if (entry / "meta").exists() else {}
            except AlfError:
                if (entry / "meta").exists():
                    raise
                meta = {}  # removed meanwhile, by another gc
            if not meta and not alone:
                kept_knock.add("*")  # a start's in progress: its knock state too
                continue
            known = namespaces is None or meta.get("netns") in namespaces or not meta
            owner_alive = alive(meta.get("pid"))  # its process: the socket may be unbound
            if known and not owner_alive and where.cookie not in live():
                gone.append((where, meta))
                continue
            staying.add(meta.get("name"))
            if "knock" in meta:  # its knock folders (or one, as a string)
                named = meta["knock"]
                kept_knock.update(map(str, named) if isinstance(named, list) else [str(named)])
            elif meta.get("pid") != os.getpid():
                # Another process's start in progress: its knock state may be pinned
                # and not named yet.  (This process's own is named once it runs.)
                kept_knock.add("*")
        for where, meta in gone:
            # A gone socket's runtime rules stay until a socket of its name holds them
            # (inherit_runtime): a restart that makes new sockets keeps every ban.
            # (One that was never named, a start's killed before its meta, was given
            # its rules by the sockets that keep them.)
            name = meta.get("name")
            if name is not None and name not in staying and holds_runtime_rules(where, self):
                continue
            self.remove(where)
            removed.append(where)
        for knock in entries:
            if not knock.name.startswith("knock-") or knock.name in kept_knock or "*" in kept_knock:
                continue
            if knock.is_dir():
                shutil.rmtree(knock, ignore_errors=True)
            else:  # a pin where a knock folder would be: nothing of ours
                knock.unlink(missing_ok=True)
        if alone:
            try:
                service_dir.rmdir()  # if empty
            except OSError:
                pass  # not empty, or removed by another gc
        return removed


@contextmanager
def service_lock(folder: Path, exclusive: bool) -> Iterator[bool]:
    """flock(2) on a service's folder.  A start holds it shared while it makes a
    socket's state there (until its meta names its pid), waiting at most
    LOCK_SECONDS for a gc to let go; gc holds it exclusive to remove state without
    meta or the folder itself, and does not wait: it yields False when a start holds
    it.  False too when the folder was removed meanwhile.  The kernel lets go when
    the holder dies."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield False
        return
    except OSError as err:
        raise _fail(f"{folder}", err) from None
    try:
        deadline = time.monotonic() + LOCK_SECONDS
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if exclusive:
                    yield False
                    return
                if time.monotonic() >= deadline:
                    raise AlfError(
                        f"{folder}",
                        f"a gc has held it for {LOCK_SECONDS:.0f} s (a stopped "
                        "`alfwrapper gc` or `status`?)",
                        "let it finish, or stop it, then start again",
                        EX_TEMPFAIL,
                    ) from None
                time.sleep(0.01)
            except OSError as err:
                raise _fail(f"locking {folder}", err) from None
        try:
            now = os.stat(folder)
        except FileNotFoundError:
            yield False
            return
        mine = os.fstat(fd)
        yield (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)  # not removed meanwhile
    finally:
        os.close(fd)


def _service_folder(path: Path) -> bool:
    """A folder alfwrapper made for a service: not the users' trees, nor anything
    else someone left in the tree (which would otherwise break every listing)."""
    name = service_of(path.name)
    return path.is_dir() and valid_service(name)


def user_stores() -> list[Store]:
    """The trees of users' services (kept by the loader), for root's gc."""
    try:
        uids = [p.name for p in USERS_ROOT.iterdir() if p.name.isdigit()]
    except OSError:
        return []
    return [Store(USERS_ROOT / uid, USERS_ROOT) for uid in sorted(uids)]


def live_everywhere(strict: bool = True) -> tuple[set[int], set[int]]:
    """The cookies of every socket in every network namespace we can enter (as root),
    and those namespaces' cookies; unless ``strict``, in this one alone where we may
    not enter them (an OSError otherwise)."""
    live: set[int] = set()
    seen: set[int] = set()
    try:
        for _ in netns.each_netns():
            live |= live_cookies()
            seen.add(netns_cookie())
    except OSError:
        if strict:
            raise
        return live_cookies(), {netns_cookie()}
    return live, seen


def gc_everywhere() -> list[SocketState]:
    """As root: gc over every network namespace we can find (processes' and /run/netns),
    in root's tree and in every user's.

    The state of a socket whose namespace we cannot find (a namespace no process is
    in, held only by a socket unit, or one deleted) is kept: it cannot be told
    from alive.
    """
    trees = [Store(ROOT), *user_stores()]
    settled = {p for tree in trees for p in tree.socket_folders()}
    live, seen = live_everywhere()
    removed = []
    for tree in trees:
        removed += tree._collect(settled, lambda: live, seen)
    return removed


class Taken(Record):
    """A socket of a service's, as Store.take left it: filtered by the dispatcher pinned
    in ``state``, and ``judged`` if what was queued on it has been judged since."""

    state: SocketState
    judged: bool
    made: bool  # its state was made by this start


def claim(where: SocketState, pid: int = 0) -> dict[str, object]:
    """Name this process (or ``pid``) in the meta of a socket's state taken from an earlier start
    (dead, or stopped for a restart), and return the meta.  Until describe_sockets
    rewrites it, a gc then keeps the state by this pid as well as by the socket's
    cookie: whatever a gc's sock_diag listing misses while this start compiles, it
    does not take the state from under it (which would leave the socket locked on a
    dispatcher no start can find again)."""
    meta = read_meta(where)
    if meta.get("pid") != (pid or os.getpid()):
        meta["pid"] = pid or os.getpid()
        write_meta(where, meta)
    return meta


def mark_judged(where: SocketState) -> None:
    """Write down that what was queued on the socket has been judged (Store.take)."""
    meta = read_meta(where)
    meta["judged"] = True
    write_meta(where, meta)


_store: Store = Store(ROOT)


def store() -> Store:
    """The store in use: root's tree, or the loader's for a user (use_store)."""
    return _store


def use_store(chosen: Store) -> None:
    global _store
    _store = chosen
