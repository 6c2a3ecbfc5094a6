"""Named sets: lists of prefixes kept once for the host, which any number of services
name (allow-set, deny-set) and which change while they run (alfwrapper set).

A set is a folder in a pinned tree of its own (state.py), which belongs to the
user alfwrapper-sets: the CrowdSec bouncer runs as it, so a bouncer taken over by
what it reads from the network reaches the sets and nothing of the services':

    /sys/fs/bpf/alfwrapper-sets/NAME/
      hosts     HASH: whole addresses (/32 and /128) -> expiry
      ranges    LPM_TRIE: every shorter prefix -> expiry
      sieve     ARRAY: a Bloom filter of the whole addresses, a word each (sets.c)

Every program that names the set holds these maps (sets.c reads them through its
arrays of maps), so a change here reaches every such service at its next packet,
and twenty services share one copy.  The sieve is what keeps a set cheap for a
packet: an address's two bits go in before its entry does, and are taken out only
by a rebuild from what the hash holds (a resync, a flush, a sweep, or after as many
removals as the sieve has words), so no entry ever lacks its bits; a removed
entry's bits left in place cost an address that shares them a hash lookup.

An expiry is the kernel's monotonic clock in ns (what bpf_ktime_get_coarse_ns()
reads), 0 for none: an entry lapses without a timer, and `set list` and the next
add past a full map remove lapsed entries.

A set comes from `alfwrapper set create NAME [FILE]`, or, the first time a service
names it, from /etc/alfwrapper/sets/NAME.list (one CIDR a line, # comments) if
that file exists.  Its maps are filled and pinned in a folder of their own
(NAME~making), which one rename puts in place, so a set is there whole or not at
all (create).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import stat
import struct
import time
from array import array
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

from alfwrapper import state
from alfwrapper.bpf.parts import (
    SET_EXPIRY,
    SET_FLAGS,
    SET_HOST,
    SET_HOST_FIELDS,
    SET_RANGE,
    SET_ROLES,
    SIEVE_BIT1,
    SIEVE_BIT2,
    SIEVE_FLAGS,
    SIEVE_MIX,
    SIEVE_MULTIPLIER,
    SIEVE_OLDER_FLAGS,
    SIEVE_RANGE_BITS,
    SIEVE_WORD,
    FillEnv,
    bpf_map_put_fd,
    c_offsets,
    sieve_fits,
    sieve_header,
    sieve_shift,
)
from alfwrapper.errors import (
    EX_CONFIG,
    EX_NOINPUT,
    EX_NOPERM,
    EX_OSERR,
    EX_TEMPFAIL,
    EX_USAGE,
    AlfError,
)
from alfwrapper.host import bpf_calls
from alfwrapper.host.faults import crash_point
from alfwrapper.policy.prefix_list import Array, read_rule_file
from alfwrapper.policy.prefixes import FAMILY_BITS, Prefix
from alfwrapper.policy.rules import SET_NAME_RULE, SocketRules, valid_set_name
from alfwrapper.record import replace

_ROOT = [state.SETS_ROOT]  # where the tree is seen (use_root)
LIST_DIR = Path("/etc/alfwrapper/sets")
DEFAULT_SIZE = 65536  # entries each map may hold (its most: `set create --size`)
MOST_SIZE = 1 << 24
MAKING = "~making"  # a set being made: NAME~making (making())
LOCK_SECONDS = 10.0
BATCH = 65536  # entries in one batch update
_INDEX = struct.Struct("=I")  # an array's key
_SHAPES = {  # each map's type, key size, value size and flags
    "hosts": (bpf_calls.BPF_MAP_TYPE_HASH, SET_HOST.size, SET_EXPIRY.size, SET_FLAGS),
    "ranges": (bpf_calls.BPF_MAP_TYPE_LPM_TRIE, SET_RANGE.size, SET_EXPIRY.size, SET_FLAGS),
    "sieve": (bpf_calls.BPF_MAP_TYPE_ARRAY, _INDEX.size, SIEVE_WORD.size, SIEVE_FLAGS),
    # One slot, the hosts map in force (parts.SET_ROLES); an array of maps takes no
    # BPF_F_RDONLY_PROG, and no program can write into one anyway.
    "hosts_at": (bpf_calls.BPF_MAP_TYPE_ARRAY_OF_MAPS, _INDEX.size, _INDEX.size, 0),
}
# A grown hosts map's pin until it takes the hosts pin's name (_grow): the name of no
# role, so nothing opens it as one; found by _repair after a kill.
GROWN = "hosts~grown"
SIEVE_BITS_AN_ENTRY = 32  # the sieve's size: about 0.5% of sources sent on to the hash
_M64 = (1 << 64) - 1


def _host_record(family: int) -> dict[str, object]:
    """SET_HOST for a whole address of this family, as a numpy record (_hosts), read
    from SET_HOST_FIELDS: its address in network order, as one ">u4" or two ">u8",
    the bytes not named zero."""
    offsets = c_offsets(SET_HOST_FIELDS)
    addr = offsets["addr"]
    six = [("hi", ">u8", addr), ("lo", ">u8", addr + 8)]
    words = [("addr", ">u4", addr)] if family == 4 else six
    fields = [("length", "u1", offsets["length"]), ("family", "u1", offsets["family"]), *words]
    return {"names": [f[0] for f in fields], "formats": [f[1] for f in fields],
            "offsets": [f[2] for f in fields], "itemsize": SET_HOST.size}  # fmt: skip


def use_root(path: Path) -> None:
    """See the sets' tree at ``path`` (where a unit binds it: bpffs's root is 0700)."""
    _ROOT[0] = path
    state.see_sets_tree(path)


def root() -> Path:
    return _ROOT[0]


def check_name(name: str) -> str:
    if not valid_set_name(name):
        raise AlfError(f"set {name!r}", "is not a set name", SET_NAME_RULE, EX_USAGE)
    return name


def folder(name: str) -> Path:
    return root() / check_name(name)


def list_file(name: str) -> Path:
    return LIST_DIR / f"{check_name(name)}.list"


def now_ns() -> int:
    """The clock sets.c compares expiries with (CLOCK_MONOTONIC; the kernel's coarse
    reading of it lags by a tick at most)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def _fail(what: str, err: OSError) -> AlfError:
    denied = err.errno in (errno.EPERM, errno.EACCES)
    return AlfError(
        what,
        err.strerror or str(err),
        "run as root (sets are root's)" if denied else "check `alfwrapper doctor`",
        EX_NOPERM if denied else EX_OSERR,
    )


def exists(name: str) -> bool:
    return all((folder(name) / role).exists() for role in SET_ROLES)


def open_role(name: str, role: str, read_only: bool = False) -> int:
    """An fd of one of the set's maps; ``read_only``: one that cannot change it, all a
    program's filling needs (FillEnv.open_set), and all the loader can open."""
    path = folder(name) / role
    try:
        fd = bpf_calls.obj_get(str(path), read_only)
    except OSError as err:
        if err.errno == errno.ENOENT:
            raise AlfError(
                f"named set {name}",
                "does not exist",
                f"create it with `alfwrapper set create {name}`, or write {list_file(name)}",
                EX_CONFIG,
            ) from None
        raise _fail(f"named set {name} ({path})", err) from None
    # Whoever owns the tree could have pinned any map here: one of another shape
    # would be read past its end by the fixed-size buffers below.
    try:
        shape = bpf_calls.map_shape(fd)
    except OSError:
        shape = (0, 0, 0, 0, 0)
    wrong_size = role == "sieve" and sieve_shift(shape[3]) == 0  # not 1 + 2^k words
    kind, key, value, flags = _SHAPES[role]
    if role == "sieve" and shape[4] == SIEVE_OLDER_FLAGS:  # an older alfwrapper's
        flags = SIEVE_OLDER_FLAGS
    if shape[:3] + shape[4:] != (kind, key, value, flags) or wrong_size:
        os.close(fd)
        raise AlfError(
            f"named set {name}",
            f"its {role} map ({path}) is not a set's",
            f"remove the set and make it again: alfwrapper set destroy {name}",
            EX_CONFIG,
        )
    if role == "hosts_at" and read_only and not _holds_the_pin(name, fd):
        os.close(fd)
        raise AlfError(
            f"named set {name}",
            "the hosts map it holds is not the set's (an older alfwrapper made the set "
            "again, or a change was stopped half way)",
            f"run `alfwrapper set create {name}` as root, which mends it, then start again",
            EX_CONFIG,
        )
    return fd


def _holds_the_pin(name: str, hosts_at: int) -> bool:
    """Does hosts_at hold the set's hosts map: the hosts pin's, or, for the moment a
    growth (_grow) takes between its switch and its rename, the grown one's?  A program
    bound to it then reads the entries that changes write."""
    in_force = _in_force(hosts_at)
    for pin in ("hosts", GROWN):
        try:
            fd = bpf_calls.obj_get(str(folder(name) / pin), read_only=True)
        except OSError:
            continue
        try:
            if bpf_calls.map_info_id(fd) == in_force:
                return True
        finally:
            os.close(fd)
    return False


Maps = dict[str, int]  # a set's maps' fds, by role


@contextmanager
def _opened(name: str, changing: bool = True) -> Iterator[Maps]:
    """The set's maps; ``changing``: under the set's lock, so that a sweep, which
    reads an entry as lapsed and then deletes it, never deletes what another process
    wrote in between (a deny entry lost), and no two change the sieve at once."""
    fds: Maps = {}
    try:
        for role in SET_ROLES:
            fds[role] = open_role(name, role)
        if changing:
            with _locked(folder(name)) as at:
                _repair(name, fds, at)
                if not sieve_fits(fds["hosts_at"], fds["sieve"]):  # an older alfwrapper's
                    _resieve(fds)  # change: rebuilt before anything is added
                fds[_FOLDER] = at
                try:
                    yield fds
                finally:
                    del fds[_FOLDER]  # _locked closes it
        else:
            yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


_FOLDER = "folder"  # in a changing _opened's Maps: the set's folder, open and locked


def _in_force(hosts_at: int) -> int:
    """The id of the hosts map that hosts_at holds (0: none)."""
    raw = bpf_calls.map_lookup(hosts_at, _INDEX.pack(0), _INDEX.size)
    return _INDEX.unpack(raw)[0] if raw else 0


def _repair(name: str, fds: Maps, at: int) -> None:
    """Under the set's lock, before anything is changed: the hosts pin and hosts_at
    must name one map, or entries written through the pin would not be those programs
    read.  A growth killed after its switch (_grow) is finished: the grown pin, which
    the slot holds, takes the hosts pin's name.  Any other difference (a kill before
    the switch leaves none; an older alfwrapper that made the hosts map again beside
    hosts_at) puts the hosts pin in the slot, its sieve first marked as built for no
    set (so no start takes it until it is rebuilt here: _resieve writes its header
    last)."""
    in_force, grown = _in_force(fds["hosts_at"]), _at(at, GROWN)
    if in_force != bpf_calls.map_info_id(fds["hosts"]):
        if os.path.exists(grown):
            fd = bpf_calls.obj_get(grown)
            if bpf_calls.map_info_id(fd) == in_force:
                os.rename(GROWN, "hosts", src_dir_fd=at, dst_dir_fd=at)
                os.close(fds["hosts"])
                fds["hosts"] = fd
                return
            os.close(fd)
        _set_header(fds["sieve"], 0, 0)
        bpf_map_put_fd(fds["hosts_at"], 0, fds["hosts"])
    if os.path.exists(grown):
        os.unlink(GROWN, dir_fd=at)


@contextmanager
def _locked(path: Path) -> Iterator[int]:
    """flock(2) on a set's folder, waited for at most LOCK_SECONDS; the folder's fd,
    which names its pins where a name might be swapped for a link (_at)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        deadline = time.monotonic() + LOCK_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise AlfError(
                        f"{path}",
                        f"another `alfwrapper set` has held it for {LOCK_SECONDS:.0f} s",
                        "let it finish, or stop it, then try again",
                        EX_TEMPFAIL,
                    ) from None
                time.sleep(0.01)
        yield fd
    finally:
        os.close(fd)


def _at(folder: int, role: str) -> str:
    """A pin's path through its folder's fd: what the kernel resolves is the folder
    this process opened (no link followed), wherever its name now points."""
    return f"/proc/self/fd/{folder}/{role}"


def _give_pin(folder: int, role: str) -> None:
    """A pin just made, to the sets' owner, readable by its group (state.modes), by a
    descriptor of the pin itself: nothing the tree's owner swaps in is followed."""
    uid, gid = state.owner(root())
    fd = os.open(role, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{role} is not a pin")
        os.chmod(f"/proc/self/fd/{fd}", state.modes(root())[1])  # while ours
        os.chown(f"/proc/self/fd/{fd}", uid, gid)
    finally:
        os.close(fd)


def make_tree() -> None:
    """The sets' tree, made if missing, and, as root, its top folder given to its owner
    with the mode that lets its group (the loader's) pass through (state.modes): also
    one an older alfwrapper made, mode 0700.  Nothing below it is walked as root."""
    if root() == state.SETS_ROOT:
        state.check_bpffs()
    if os.geteuid() == 0 and root().is_dir() and not root().is_symlink():
        try:  # its parent is root's: nothing can be swapped in for it
            state.give_dir(root(), *state.owner(root()), state.modes(root())[0])
        except OSError as err:
            raise _fail(f"the sets' tree {root()}", err) from None
    state.trusted_dir(root(), create=True)


def create(name: str, prefixes: Sequence[Prefix] = (), size: int = DEFAULT_SIZE) -> bool:
    """Make the set, holding ``prefixes``, unless it exists; True if it was made.

    Whole or not at all: its maps are made, filled and pinned in a folder of their own
    (making()), which one rename then puts in the set's place.  A create that fails
    or is killed on the way leaves no set, only that folder, which the next create of
    the name (or a gc: collect_unfinished) empties; a set made in its place at once
    (the older way) could be listed and yet have no hosts map to add to."""
    where = folder(name)
    if not 1 <= size <= MOST_SIZE:
        raise AlfError(f"set {name}", f"size {size} is out of range", f"give 1 to {MOST_SIZE}",
                       EX_USAGE)  # fmt: skip
    make_tree()
    if not (where / "hosts").exists() and _make(name, prefixes, size):
        return True
    state.trusted_dir(where, create=False)
    with _locked(where) as at:
        if not (where / "hosts").exists():  # destroyed since
            raise AlfError(f"set {name}", "was removed while it was made", "make it again",
                           EX_TEMPFAIL)  # fmt: skip
        try:
            if not all((where / r).exists() for r in ("sieve", "hosts_at")):
                _complete(name, at)  # an older alfwrapper's set
            _refit(name, at)
            if os.geteuid() == 0:  # an older alfwrapper's set, 0700 and 0600, or one
                os.fchmod(at, state.modes(where)[0])  # made killed before it was given
                for role in SET_ROLES:  # away: given now, by fds
                    _give_pin(at, role)
        except OSError as err:
            raise _fail(f"set {name} in {where}", err) from None
    return False


def making(name: str) -> Path:
    """The folder a set is made in before it is renamed into place: no set's name (a
    set's has no ~), so nothing lists or opens it as a set."""
    return root() / f"{check_name(name)}{MAKING}"


def _make(name: str, prefixes: Sequence[Prefix], size: int) -> bool:
    """Make the set in making(name), under its lock (one create of a name at a time),
    and rename it into place; False if another create made the set meanwhile."""
    where, temp = folder(name), making(name)
    for _ in range(10):  # a gc may remove the folder between its mkdir and its lock
        state.trusted_dir(temp, create=True)
        try:
            with _locked(temp) as at:
                if not _still(temp, at):
                    continue
                if (where / "hosts").exists():  # made by the create that held the lock
                    return False
                _build(name, prefixes, size, temp, at)
                return True
        except FileNotFoundError:
            continue
    raise AlfError(f"set {name}", f"{temp} kept vanishing", "try again", EX_TEMPFAIL)


def _still(path: Path, fd: int) -> bool:
    """Does ``path`` still name the folder open at ``fd`` (not removed, not swapped)?"""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (info.st_dev, info.st_ino) == (mine.st_dev, mine.st_ino)


def _build(name: str, prefixes: Sequence[Prefix], size: int, temp: Path, at: int) -> None:
    """The set's maps, made, filled, pinned in ``temp`` (open at ``at``) and given
    away by fds, then ``temp`` renamed into the set's place; on a failure nothing of
    them is left pinned."""
    where = folder(name)
    _unpin_all(at)  # what a killed create left here
    made: Maps = {}
    whole = sum(1 for p in prefixes if p.length == FAMILY_BITS[p.family])
    if whole > MOST_SIZE:
        raise AlfError(f"set {name}", f"{whole} whole addresses are more than a set holds "
                       f"({MOST_SIZE})", "split them into sets", EX_USAGE)  # fmt: skip
    try:
        made = _new_set_maps(name, max(size, whole))  # room for them all: no growing here
        _put(name, made, prefixes, 0)
        for role in SET_ROLES:
            _pin(made[role], at, role)
            crash_point(f"set-{role}-pinned")
        crash_point("set-made")
        _rename_in(name, temp, where)
    except OSError as err:
        _discard(temp, at)
        raise _fail(f"creating set {name} in {where}", err) from None
    except BaseException:
        _discard(temp, at)
        raise
    finally:
        for fd in made.values():
            os.close(fd)


def _rename_in(name: str, temp: Path, where: Path) -> None:
    """``temp`` put in the set's place at once.  A rename replaces an empty folder
    there; one that holds pins but no hosts map (a destroy killed half way, or an older
    alfwrapper's create) is emptied first, under its own lock."""
    try:
        os.rename(temp, where)
        return
    except OSError as err:
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    with _locked(where) as at:
        if (where / "hosts").exists():
            raise OSError(errno.EEXIST, "made by another create meanwhile", str(where))
        _unpin_all(at)
    os.rename(temp, where)


def _unpin_all(at: int) -> None:
    """Unpin every set map in the folder open at ``at``."""
    for role in (*SET_ROLES, GROWN):
        try:
            os.unlink(role, dir_fd=at)
        except FileNotFoundError:
            pass


def _discard(temp: Path, at: int) -> None:
    """A failed create's folder, emptied and removed (only if it is still ours)."""
    try:
        _unpin_all(at)
        if _still(temp, at):
            temp.rmdir()
    except OSError:
        pass  # left for the next create or a gc


def collect_unfinished() -> list[str]:
    """Remove what creates and destroys left half done: making() folders (a create
    killed or failed), and set folders without a hosts map (a destroy killed half way,
    an older alfwrapper's create); each only if no one holds its lock.  The names of
    the folders removed (for gc)."""
    try:
        found = sorted(root().iterdir())
    except (FileNotFoundError, PermissionError):
        return []
    except OSError as err:
        raise _fail(f"{root()}", err) from None
    removed = []
    for path in found:
        base = path.name.removesuffix(MAKING)
        temp = base != path.name
        if not valid_set_name(base) or not temp and (path / "hosts").exists():
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _still(path, fd) and (temp or not (path / "hosts").exists()):
                _unpin_all(fd)
                path.rmdir()
                removed.append(path.name)
        except OSError:
            continue  # in use (locked), or not ours to remove
        finally:
            os.close(fd)
    return removed


def _pin(fd: int, at: int, role: str) -> None:
    """Pin a map as the role's, in the folder open at ``at``, and give it away."""
    try:
        os.unlink(role, dir_fd=at)
    except FileNotFoundError:
        pass
    bpf_calls.obj_pin(fd, _at(at, role))
    _give_pin(at, role)


def _complete(name: str, at: int) -> None:
    """An older alfwrapper's set (hosts and ranges, perhaps a sieve, no hosts_at)
    given what it lacks, its sieve rebuilt from what it holds, under its lock (``at``:
    its folder's fd)."""
    fds: Maps = {}
    try:
        fds["hosts"], fds["ranges"] = open_role(name, "hosts"), open_role(name, "ranges")
        size = bpf_calls.map_shape(fds["hosts"])[3]
        if os.path.exists(_at(at, "hosts_at")):
            fds["hosts_at"] = open_role(name, "hosts_at")
        else:
            fds["hosts_at"] = _new_map(name, "hosts_at", 1, inner=fds["hosts"])
            bpf_map_put_fd(fds["hosts_at"], 0, fds["hosts"])
        fds["sieve"] = (open_role(name, "sieve") if os.path.exists(_at(at, "sieve"))
                        else _new_map(name, "sieve", size))  # fmt: skip
        _resieve(fds)
        for role in ("sieve", "hosts_at"):
            if not os.path.exists(_at(at, role)):
                _pin(fds[role], at, role)
    finally:
        for fd in fds.values():
            os.close(fd)


def _refit(name: str, at: int) -> None:
    """Mend the set (_repair) and rebuild its sieve if it was built for another set
    (an older alfwrapper destroyed and made the set again beside it); the caller holds
    the set's lock (``at``: its folder's fd)."""
    fds: Maps = {}
    try:
        for role in SET_ROLES:
            fds[role] = open_role(name, role)
        _repair(name, fds, at)
        if not sieve_fits(fds["hosts_at"], fds["sieve"]):
            _resieve(fds)
    finally:
        for fd in fds.values():
            os.close(fd)


def sieve_words(size: int) -> int:
    """How many words (besides its header) the sieve of a set of ``size`` has: a
    power of two, SIEVE_BITS_AN_ENTRY bits for each entry it may hold, 64 at least."""
    bits = max(size, 1) * SIEVE_BITS_AN_ENTRY
    return 1 << max(6, (bits // 64 - 1).bit_length())


def _new_map(name: str, role: str, size: int, inner: int = 0) -> int:
    """A new map of the role's shape: a hosts map of ``size`` entries, a trie that may
    hold up to MOST_SIZE (it takes memory for what it holds alone, and cannot grow:
    programs reach it through their own array of maps), a sieve for ``size`` whole
    addresses, hosts_at of one slot for maps of ``inner``'s shape."""
    kind, key, value, flags = _SHAPES[role]
    label = ("set." + name.replace("-", "_"))[:15]  # a map's name: letters, digits, _ and .
    entries = {"ranges": MOST_SIZE, "sieve": 1 + sieve_words(size), "hosts_at": 1}
    return bpf_calls.map_create(kind, label, key, value, entries.get(role, size), flags, inner)


def _new_set_maps(name: str, size: int) -> Maps:
    """A new set's maps, empty: hosts_at holding its hosts, the sieve's header naming
    hosts_at (the set it belongs to, however its hosts map grows)."""
    made: Maps = {}
    try:
        for role in ("hosts", "ranges", "sieve"):
            made[role] = _new_map(name, role, size)
        made["hosts_at"] = _new_map(name, "hosts_at", 1, inner=made["hosts"])
        bpf_map_put_fd(made["hosts_at"], 0, made["hosts"])
        _set_header(made["sieve"], bpf_calls.map_info_id(made["hosts_at"]), 0)
    except BaseException:
        for fd in made.values():
            os.close(fd)
        raise
    return made


def ensure(names: Sequence[str]) -> None:
    """Sets that services name, made from their list files where they do not exist
    yet (a start's first; a set with neither fails at fill: open_role says so)."""
    for name in names:
        if exists(name):
            continue
        path = list_file(name)
        if path.exists():
            create(name, read_rule_file(str(path)))


def fill_env(env: FillEnv, rules: Iterable[SocketRules]) -> FillEnv:
    """``env`` able to open the sets these rules name, each made from its list file
    first where it does not exist (ensure)."""
    wanted = sorted({n for r in rules for n in (*r.deny_sets, *r.allow_sets)})
    if not wanted or not state.store().opens_sets:
        return env  # a user's service: the loader opens root's sets (open_sets there)
    ensure(wanted)
    return replace(env, open_set=read_only)


def read_only(name: str, role: str) -> int:
    """FillEnv.open_set: an fd that reads the set's map (a program's filling puts it in
    the program's arrays of maps, and no program may write into a set)."""
    return open_role(name, role, read_only=True)


def check_env(env: FillEnv) -> FillEnv:
    """``env`` for `alfwrapper check`, which changes nothing: a set that exists is
    opened, one that a start would make from its list file is stood in for by an
    empty map of its shape, and one with neither is the error a start would give."""

    stand_ins: dict[str, Maps] = {}  # kept open while check runs: each open a dup

    def open_set(name: str, role: str) -> int:
        if exists(name) or not list_file(name).exists():
            return read_only(name, role)
        try:
            if name not in stand_ins:  # an empty set, made as a start would make it
                stand_ins[name] = _new_set_maps(name, 1)
            return os.dup(stand_ins[name][role])
        except OSError as err:
            raise _fail(f"checking set {name}", err) from None

    return replace(env, open_set=open_set)


def _key(prefix: Prefix) -> tuple[str, bytes]:
    """The map a prefix goes in, and its key there."""
    width = FAMILY_BITS[prefix.family]
    raw = prefix.value.to_bytes(width // 8, "big").ljust(16, b"\0")
    if prefix.length == width:
        return "hosts", SET_HOST.pack(width, prefix.family, b"", raw)
    return "ranges", SET_RANGE.pack(32 + prefix.length, prefix.family, b"", raw)


def _prefix(role: str, key: bytes) -> Prefix:
    if role == "hosts":
        length, family, _, raw = SET_HOST.unpack(key)
    else:
        bits, family, _, raw = SET_RANGE.unpack(key)
        length = bits - 32
    width = FAMILY_BITS.get(family, 128)
    return Prefix(family, int.from_bytes(raw[: width // 8], "big"), length)


def _value(prefix: Prefix, expiry: int) -> bytes:
    """An entry's value (sets.c): its expiry; a range's rounded up to 256 ns, with its
    prefix length in the low 8 bits (the kernel looks past a lapsed range by it)."""
    if prefix.length == FAMILY_BITS[prefix.family]:
        return SET_EXPIRY.pack(expiry)
    return SET_EXPIRY.pack(((expiry + 0xFF) & ~0xFF) | prefix.length)


def _expiry(role: str, raw: bytes) -> int:
    value = int(SET_EXPIRY.unpack(raw)[0])
    return value if role == "hosts" else value & ~0xFF


def _put(name: str, fds: Maps, prefixes: Sequence[Prefix], expiry: int) -> None:
    sieve = fds["sieve"]
    _sieve_add(sieve, sieved(_shift(sieve), prefixes))  # before the entries (module doc)
    crash_point("set-bits-set")
    for prefix in prefixes:
        role, key = _key(prefix)
        _update(name, fds, role, key, _value(prefix, expiry))


def _update(name: str, fds: Maps, role: str, key: bytes, value: bytes) -> None:
    """One entry in; a full map first loses its lapsed entries, then a full hosts map
    grows (_grow); a trie full at MOST_SIZE is an error."""
    try:
        bpf_calls.map_update(fds[role], key, value)
    except OSError as err:
        if err.errno not in (errno.E2BIG, errno.ENOSPC):
            raise
        if not _sweep(fds[role], role):
            if role != "hosts":
                raise AlfError(
                    f"set {name}",
                    f"its {role} map is full at {_prefix(role, key)}",
                    "remove entries, or split the set",
                    EX_CONFIG,
                ) from None
            _grow(name, fds, 1)
        bpf_calls.map_update(fds[role], key, value)


def _grow(name: str, fds: Maps, more: int) -> None:
    """Give the set a hosts map with room for ``more`` whole addresses besides those it
    holds (twice the room at least, MOST_SIZE at most), while every program that
    names it runs.  Under the set's lock (a changing _opened: no entry is written
    meanwhile): the entries are copied into a larger map, pinned as GROWN, which one
    update of hosts_at then puts in force for every program at once, and which a
    rename then makes the hosts pin.  No packet is judged on a half-filled map: the
    old one serves, whole, until the switch.  A kill at any step leaves the set as it
    was or as it is after, never between (_repair)."""
    at, old = fds[_FOLDER], fds["hosts"]
    room = bpf_calls.map_shape(old)[3]
    keys, values, held = bpf_calls.map_items(old, SET_HOST.size, SET_EXPIRY.size)
    wanted = held + more
    if wanted > MOST_SIZE:
        raise AlfError(f"set {name}", f"{wanted} whole addresses are more than a set holds "
                       f"({MOST_SIZE})", "remove entries, or split the set", EX_CONFIG)  # fmt: skip
    size = min(MOST_SIZE, max(2 * room, 1 << (wanted - 1).bit_length()))
    new = _new_map(name, "hosts", size)
    switched = False
    try:
        for start in range(0, held, BATCH):
            count = min(BATCH, held - start)
            bpf_calls.map_update_batch(
                new,
                keys[start * SET_HOST.size : (start + count) * SET_HOST.size],
                values[start * SET_EXPIRY.size : (start + count) * SET_EXPIRY.size],
                count,
            )
        _pin(new, at, GROWN)
        crash_point("set-grown-pinned")
        bpf_map_put_fd(fds["hosts_at"], 0, new)  # in force for every program from here
        switched = True
        crash_point("set-grown-switched")
        os.rename(GROWN, "hosts", src_dir_fd=at, dst_dir_fd=at)
    except OSError as err:
        _undo_growth(at, new, switched)
        raise _fail(f"growing set {name}", err) from None
    except BaseException:
        _undo_growth(at, new, switched)
        raise
    os.close(old)
    fds["hosts"] = new


def _undo_growth(at: int, new: int, switched: bool) -> None:
    """A growth that failed: before the switch, its copy goes; after, _repair finishes
    it at the next change (the slot holds the copy, which GROWN names)."""
    if not switched:
        with contextlib.suppress(OSError):
            os.unlink(GROWN, dir_fd=at)
    os.close(new)


def _sweep(fd: int, role: str) -> int:
    """Remove lapsed entries; how many."""
    size = (SET_HOST if role == "hosts" else SET_RANGE).size
    now, gone = now_ns(), 0
    for key in bpf_calls.map_keys(fd, size):
        found = bpf_calls.map_lookup(fd, key, SET_EXPIRY.size)
        if found is not None and 0 < _expiry(role, found) <= now:
            gone += bpf_calls.map_delete(fd, key)
    return gone


def sweep(name: str, roles: Sequence[str] = ("hosts", "ranges")) -> int:
    """Remove the set's lapsed entries (of these maps); how many.  Lapsed ranges are
    best gone soon: the kernel looks past at most ALF_SET_NEST nested ones.  A sweep
    of the hosts rebuilds the sieve without the bits of what it removed."""
    with _opened(name) as fds:
        try:
            gone = sum(_sweep(fds[role], role) for role in roles)
            if "hosts" in roles:
                _resieve(fds)
            return gone
        except OSError as err:
            raise _fail(f"sweeping set {name}", err) from None


def add(name: str, prefixes: Sequence[Prefix], timeout: float = 0.0) -> None:
    """Put prefixes in the set, each lapsing after ``timeout`` seconds (0: never); an
    entry already there takes the new expiry."""
    expiry = now_ns() + int(timeout * 1e9) if timeout else 0
    with _opened(name) as fds:
        try:
            _put(name, fds, prefixes, expiry)
        except OSError as err:
            raise _fail(f"adding to set {name}", err) from None


def load_bulk() -> None:
    """Load what hold and assign take many entries with (numpy): a daemon pays for it
    once, at its start, rather than in its first answer."""
    import numpy  # noqa: F401, PLC0415


Keyed = dict[str, tuple[list[bytes], list[bytes]]]  # role -> keys, values


def _keyed(entries: dict[Prefix, int], shift: int) -> tuple[Keyed, Sieved]:
    """Each entry's key and value (_key, _value), by map, and their bits in a sieve
    of this shift (sieved); whole addresses, nearly all of a CrowdSec answer, in numpy
    columns (_hosts, _spots), picked out by them too; ranges one by one."""
    import numpy as np  # noqa: PLC0415

    by_role: Keyed = {"hosts": ([], []), "ranges": ([], [])}
    if not entries:
        return by_role, Sieved({}, 0)
    prefixes, count = list(entries), len(entries)
    families = np.fromiter(map(itemgetter(0), prefixes), dtype=np.uint8, count=count)
    lengths = np.fromiter(map(itemgetter(2), prefixes), dtype=np.uint8, count=count)
    values = np.fromiter(map(itemgetter(1), prefixes), dtype=object, count=count)
    untils = np.fromiter(entries.values(), dtype=np.uint64, count=count)
    whole = lengths == np.where(families == 4, 32, 128)
    ranges = [prefixes[at] for at in np.flatnonzero(~whole).tolist()]
    for prefix in ranges:
        by_role["ranges"][0].append(_key(prefix)[1])
        by_role["ranges"][1].append(_value(prefix, entries[prefix]))
    sieve_keys = []
    for family in (4, 6):
        picked = np.flatnonzero(whole & (families == family))
        if picked.size:
            keys, sieve_key = _hosts(family, values[picked])
            by_role["hosts"][0].extend(keys)  # and their values, SET_EXPIRY: native u64
            by_role["hosts"][1].extend(np.frombuffer(untils[picked].tobytes(), "V8").tolist())
            sieve_keys.append(sieve_key)
    found = sieved(shift, ranges)
    if not sieve_keys:
        return by_role, found
    spots = _spots(np.concatenate(sieve_keys), shift)
    for index, bits in found.spots.items():
        spots[index] = spots.get(index, 0) | bits
    return by_role, Sieved(spots, found.ranges)


def _hosts(family: int, values: Array) -> tuple[list[bytes], Array]:
    """Whole addresses' keys (_key) and their sieve's keys (sieved), many at once, from
    a column of the addresses (Python's ints): numpy's columns, not a loop of Python."""
    import numpy as np  # noqa: PLC0415

    key = np.zeros(len(values), dtype=np.dtype(_host_record(family)))  # type: ignore[call-overload]
    key["length"], key["family"] = FAMILY_BITS[family], family
    if family == 4:
        signed = values.astype(np.int64)  # past 63 bits: OverflowError
        if (signed >> 32).any():  # negative or past 32 bits: the record would cut it
            raise OverflowError("an IPv4 address out of 32 bits")
        key["addr"] = sieve_key = signed.astype(np.uint64)
    elif (values < 0).any():  # as _key: below, the halves would wrap
        raise OverflowError("a negative IPv6 address")
    else:  # sieved's key of an IPv6 address; the product wraps at 64 bits, as in C
        key["hi"] = high = (values >> 64).astype(np.uint64)
        key["lo"] = low = (values & _M64).astype(np.uint64)
        sieve_key = high ^ low * np.uint64(SIEVE_MIX)
    return np.frombuffer(key.tobytes(), f"V{SET_HOST.size}").tolist(), sieve_key


def _spots(key: Array, shift: int) -> Spots:
    """_spot of many sieve keys at once: the hash wraps at 64 bits, as the kernel's does."""
    import numpy as np  # noqa: PLC0415

    h = key * np.uint64(SIEVE_MULTIPLIER)
    one = (h >> np.uint64(SIEVE_BIT1) & np.uint64(0x3FFF)) % np.uint64(62)
    two = (h >> np.uint64(SIEVE_BIT2) & np.uint64(0x7FFF)) % np.uint64(62)
    bits = np.uint64(1) << one | np.uint64(1) << two
    index = (h >> np.uint64(shift)) + np.uint64(1)
    order = np.argsort(index, kind="stable")
    index, bits = index[order], bits[order]
    starts = np.flatnonzero(np.concatenate(([True], index[1:] != index[:-1])))
    words = np.bitwise_or.reduceat(bits, starts)
    return dict(zip(index[starts].tolist(), words.tolist(), strict=True))


def _bits_first(name: str, fds: Maps, entries: dict[Prefix, int]) -> tuple[Keyed, Sieved]:
    """The entries keyed (_keyed), their bits set in the sieve before they go in."""
    by_role, bits = _keyed(entries, _shift(fds["sieve"]))
    try:
        _sieve_add(fds["sieve"], bits)
    except OSError as err:
        raise _fail(f"adding to set {name}", err) from None
    crash_point("set-bits-set")
    return by_role, bits


def hold(name: str, entries: dict[Prefix, int]) -> None:
    """Put each prefix in the set until its own expiry (monotonic ns; 0: never)."""
    with _opened(name) as fds:
        by_role, _ = _bits_first(name, fds, entries)
        _hold_keyed(name, fds, by_role)


def assign(name: str, entries: dict[Prefix, int]) -> int:
    """Make the set hold these entries and nothing else (a resync); how many of what
    it held were removed.  Under one lock: no change of another process falls between
    the removal and the holding."""
    with _opened(name) as fds:
        by_role, bits = _bits_first(name, fds, entries)
        removed = 0
        for role in ("hosts", "ranges"):
            wanted = set(by_role[role][0])
            size = (SET_HOST if role == "hosts" else SET_RANGE).size
            try:
                for key in [k for k in bpf_calls.map_keys(fds[role], size) if k not in wanted]:
                    removed += bpf_calls.map_delete(fds[role], key)
            except OSError as err:
                raise _fail(f"removing from set {name}", err) from None
        _hold_keyed(name, fds, by_role)
        try:  # the set holds these alone now: their bits alone
            _sieve_exact(fds["sieve"], bits, fds["hosts_at"])
        except OSError as err:
            raise _fail(f"rebuilding the sieve of set {name}", err) from None
    return removed


class NotWhole(AlfError):
    """Entries the set could not take (it cannot grow: at MOST_SIZE, or no memory for a
    larger map); every other one was put in.  ``unstored``: how many."""

    def __init__(self, first: AlfError, unstored: int) -> None:
        super().__init__(first.what, f"{unstored} entries could not be stored: {first.why}",
                         first.hint, first.exit_code)  # fmt: skip
        self.unstored = unstored


def _hold_keyed(name: str, fds: Maps, by_role: Keyed) -> None:
    """Whole addresses in one batch update (Linux 5.6), shorter prefixes one by one
    (an LPM trie has no batch update); their sieve's bits are set already.  An entry
    the set cannot take stops no other: once the hosts map cannot grow, the rest go in
    one by one (those it holds are renewed, new ones counted), the ranges go in, and
    NotWhole then says how many were left out."""
    unstored, first = 0, None
    try:
        keys, values = by_role["hosts"]
        for start in range(0, len(keys), BATCH):
            part = slice(start, start + BATCH)
            if first is not None:
                unstored += _one_by_one(fds["hosts"], keys[part], values[part])
                continue
            batch = (b"".join(keys[part]), b"".join(values[part]), len(keys[part]))
            try:
                bpf_calls.map_update_batch(fds["hosts"], *batch)
            except OSError as err:
                if err.errno != errno.E2BIG:
                    raise
                _sweep(fds["hosts"], "hosts")
                try:
                    _grow(name, fds, batch[2])  # room for the whole batch, then it again
                except AlfError as grown:
                    # Only into the map programs read: a growth that failed after its
                    # switch leaves another in force until _repair (the next change).
                    if _in_force(fds["hosts_at"]) != bpf_calls.map_info_id(fds["hosts"]):
                        raise
                    first = grown
                    unstored += _one_by_one(fds["hosts"], keys[part], values[part])
                    continue
                bpf_calls.map_update_batch(fds["hosts"], *batch)
        for key, value in zip(*by_role["ranges"], strict=True):
            try:
                _update(name, fds, "ranges", key, value)
            except AlfError as full:
                first, unstored = first or full, unstored + 1
    except OSError as err:
        raise _fail(f"adding to set {name}", err) from None
    if first is not None:
        raise NotWhole(first, unstored)


def _one_by_one(fd: int, keys: Sequence[bytes], values: Sequence[bytes]) -> int:
    """Each entry on its own into a hosts map that cannot grow; how many found no room."""
    left = 0
    for key, value in zip(keys, values, strict=True):
        try:
            bpf_calls.map_update(fd, key, value)
        except OSError as err:
            if err.errno not in (errno.E2BIG, errno.ENOSPC, errno.ENOMEM):
                raise
            left += 1
    return left


def delete(name: str, prefixes: Sequence[Prefix]) -> int:
    """Take prefixes out of the set; how many were there.  Their bits stay in the
    sieve until as many removals as it has words call for a rebuild (_resieve)."""
    with _opened(name) as fds:
        try:
            gone = sum(bpf_calls.map_delete(fds[r], k) for r, k in map(_key, prefixes))
            _count_stale(fds, gone)
            return gone
        except OSError as err:
            raise _fail(f"removing from set {name}", err) from None


def count(name: str) -> int:
    """How many entries the set's maps hold, lapsed ones included (read in batches:
    what a bouncer reports after an answer it could not apply whole)."""
    with _opened(name, changing=False) as fds:
        try:
            held = bpf_calls.map_items(fds["hosts"], SET_HOST.size, SET_EXPIRY.size)[2]
            return held + len(bpf_calls.map_keys(fds["ranges"], SET_RANGE.size))
        except OSError as err:
            raise _fail(f"counting set {name}", err) from None


def entries(name: str) -> list[tuple[Prefix, int]]:
    """The set's standing entries with their expiries (0: never); lapsed ones are
    removed on the way."""
    out = []
    with _opened(name) as fds:
        for role in ("hosts", "ranges"):
            fd = fds[role]
            gone = _sweep(fd, role)
            if role == "hosts":
                _count_stale(fds, gone)
            size = (SET_HOST if role == "hosts" else SET_RANGE).size
            for key in bpf_calls.map_keys(fd, size):
                found = bpf_calls.map_lookup(fd, key, SET_EXPIRY.size)
                if found is not None:
                    out.append((_prefix(role, key), _expiry(role, found)))
    return sorted(out, key=lambda e: (e[0].family, e[0].value, e[0].length))


def flush(name: str) -> int:
    """Empty the set; how many entries it held."""
    gone = 0
    with _opened(name) as fds:
        for role in ("hosts", "ranges"):
            size = (SET_HOST if role == "hosts" else SET_RANGE).size
            for key in bpf_calls.map_keys(fds[role], size):
                gone += bpf_calls.map_delete(fds[role], key)
        _sieve_exact(fds["sieve"], Sieved({}, 0), fds["hosts_at"])  # nothing needs a bit
    return gone


def destroy(name: str) -> bool:
    """Unpin the set.  Services that hold it keep it until their next start or
    reload, and a set made again under the name is a new one."""
    where = folder(name)
    if not where.exists():
        return False
    with _locked(where) as at:
        for role in SET_ROLES:
            try:
                os.unlink(role, dir_fd=at)
            except FileNotFoundError:
                pass
        try:
            where.rmdir()
        except OSError as err:  # a create made it again meanwhile
            raise _fail(f"removing set {name}", err) from None
    return True


def names() -> list[str]:
    try:
        return sorted(  # whole sets: a folder without the hosts map is none (create)
            p.name for p in root().iterdir() if valid_set_name(p.name) and (p / "hosts").exists()
        )
    except FileNotFoundError:
        return []
    except OSError as err:
        raise _fail(f"{root()}", err) from None


def holding(name: str, family: int, value: int) -> tuple[Prefix, int] | None:
    """The standing entry of the set that holds an address (the address itself, else
    the longest range), with its expiry, for `explain`."""
    with _opened(name, changing=False) as fds:
        hosts, ranges = fds["hosts"], fds["ranges"]
        _, key = _key(Prefix(family, value, FAMILY_BITS[family]))
        found = [("hosts", hosts, key)]
        longest = _longest(ranges, family, value)
        if longest is not None:
            found.append(("ranges", ranges, longest))
        for role, fd, k in found:
            raw = bpf_calls.map_lookup(fd, k, SET_EXPIRY.size)
            expiry = None if raw is None else _expiry(role, raw)
            if expiry is not None and (expiry == 0 or expiry > now_ns()):
                return _prefix(role, k), expiry
    return None


def _longest(fd: int, family: int, value: int) -> bytes | None:
    """The key of the longest range holding an address (an LPM trie's lookup gives
    the value alone, so the keys are compared here: `explain` only)."""
    best: tuple[int, bytes] | None = None
    for key in bpf_calls.map_keys(fd, SET_RANGE.size):
        entry = _prefix("ranges", key)
        shift = FAMILY_BITS[family] - entry.length
        if entry.family == family and entry.value >> shift == value >> shift:
            if best is None or entry.length > best[0]:
                best = (entry.length, key)
    return None if best is None else best[1]


# The sieve (sets.c; its layout: SIEVE_* in bpf/parts.py; its word 0, which no
# program reads: sieve_header).
Spots = dict[int, int]  # a word's index -> the bits its entries set
_RANGES = {family: 1 << bit for family, bit in SIEVE_RANGE_BITS.items()}
_CHUNK = 8192  # words compared at once when a sieve is rebuilt


class Sieved(NamedTuple):
    """What some prefixes set in a sieve: their whole addresses' bits by word, and
    the bits every word holds for the families of their ranges."""

    spots: Spots
    ranges: int


def sieved(shift: int, prefixes: Iterable[Prefix]) -> Sieved:
    """Where ``prefixes`` set their bits in a sieve of this shift, as sets.c's
    set_sieve finds them."""
    found: Spots = {}
    ranges = 0
    for p in prefixes:
        if p.length != FAMILY_BITS[p.family]:
            ranges |= _RANGES[p.family]
            continue
        key = p.value if p.family == 4 else (p.value >> 64) ^ (p.value & _M64) * SIEVE_MIX
        index, bits = _spot(key, shift)
        found[index] = found.get(index, 0) | bits
    return Sieved(found, ranges)


def _spot(key: int, shift: int) -> tuple[int, int]:
    """The word and bits of an address's key (sets.c's set_sieve; _spots has it for
    many keys at once, held to it by tests/unit/test_set_keys.py)."""
    h = (key * SIEVE_MULTIPLIER) & _M64
    bits = 1 << (h >> SIEVE_BIT1 & 0x3FFF) % 62 | 1 << (h >> SIEVE_BIT2 & 0x7FFF) % 62
    return 1 + (h >> shift), bits


def _words_of(sieve: int) -> int:
    return bpf_calls.map_shape(sieve)[3] - 1


def _shift(sieve: int) -> int:
    return sieve_shift(1 + _words_of(sieve))


def _write_words(sieve: int, indexes: Sequence[int], values: Sequence[int]) -> None:
    """Write words in batches, word 1 and then the header last: _sieve_add reads a
    family's range bit in word 1 as every word's, and a start takes a header naming
    the set's hosts map as a sieve built for them, so neither may be there before the
    words it speaks for."""
    for last in (1, 0):
        if last in indexes:
            at = indexes.index(last)
            indexes = [*indexes[:at], *indexes[at + 1 :], last]
            values = [*values[:at], *values[at + 1 :], values[at]]
    for start in range(0, len(indexes), BATCH):
        part = slice(start, start + BATCH)
        count = len(indexes[part])
        keys, words = array("I", indexes[part]).tobytes(), array("Q", values[part]).tobytes()
        bpf_calls.map_update_batch(sieve, keys, words, count)


@contextmanager
def _mapped(sieve: int, words: int) -> Iterator[memoryview]:
    """The sieve's words, its header first, through a read-only mapping."""
    length = (1 + words) * SIEVE_WORD.size
    with (
        mmap.mmap(sieve, length, mmap.MAP_SHARED, mmap.PROT_READ) as region,
        memoryview(region) as view,
        view.cast("Q") as cast,
    ):
        yield cast


def _sieve_add(sieve: int, bits: Sieved) -> None:
    """Set these bits (and, in every word, the ranges' families), before the entries
    that need them go in."""
    words = _words_of(sieve)
    found = bits.spots
    with _mapped(sieve, words) as word:
        if bits.ranges & ~word[1]:  # a family new to the trie: every word says so first
            found = {i: found.get(i, 0) | bits.ranges for i in range(1, words + 1)}
        indexes, values = (_grown if len(found) <= _FEW_WORDS else _grown_many)(word, found)
    _write_words(sieve, indexes, values)


_FEW_WORDS = 256  # words _sieve_add looks at one by one; more, in numpy's columns


def _grown(word: memoryview, found: Spots) -> tuple[list[int], list[int]]:
    """The words that ``found``'s bits change, and what they become."""
    indexes, values = [], []
    for index, want in found.items():
        old = word[index]
        if old | want != old:
            indexes.append(index)
            values.append(old | want)
    return indexes, values


def _grown_many(word: memoryview, found: Spots) -> tuple[list[int], list[int]]:
    """_grown, for many words at once (a bouncer's answer: a Python loop took half
    as long as the kernel's writes)."""
    import numpy as np  # noqa: PLC0415

    index = np.fromiter(found.keys(), dtype=np.int64, count=len(found))
    old = np.frombuffer(word, dtype=np.uint64)[index]
    grown = old | np.fromiter(found.values(), dtype=np.uint64, count=len(found))
    changed = grown != old
    return index[changed].tolist(), grown[changed].tolist()


def _sieve_exact(sieve: int, bits: Sieved, hosts_at: int) -> None:
    """Make the sieve hold these bits alone, built for the set of ``hosts_at`` (its
    fd) with nothing stale: called once the set holds no entry that needs any other.
    Only the runs of words that differ are written."""
    words = _words_of(sieve)
    image = array("Q", [bits.ranges]) * (1 + words)
    image[0] = bpf_calls.map_info_id(hosts_at)  # the header (sieve_header): nothing stale
    for index, want in bits.spots.items():
        image[index] = want | bits.ranges
    indexes: list[int] = []
    with _mapped(sieve, words) as word:
        for first in range(0, 1 + words, _CHUNK):
            span = slice(first, min(first + _CHUNK, 1 + words))
            if word[span] != memoryview(image)[span]:
                indexes.extend(range(span.start, span.stop))
    _write_words(sieve, indexes, [image[i] for i in indexes])


def _resieve(fds: Maps) -> None:
    """Rebuild the sieve from what the hash and trie hold."""
    sieve = fds["sieve"]
    held = [_prefix("hosts", k) for k in bpf_calls.map_keys(fds["hosts"], SET_HOST.size)]
    ranges = [_prefix("ranges", k) for k in bpf_calls.map_keys(fds["ranges"], SET_RANGE.size)]
    _sieve_exact(sieve, sieved(_shift(sieve), held + ranges), fds["hosts_at"])


def _count_stale(fds: Maps, removed: int) -> None:
    """Count removals whose bits the sieve keeps; past as many as it has words, it is
    rebuilt (a CrowdSec set's decisions come and go for as long as the host runs)."""
    if not removed:
        return
    sieve = fds["sieve"]
    hosts, stale = sieve_header(sieve)
    if stale + removed > _words_of(sieve):
        _resieve(fds)
    else:
        _set_header(sieve, hosts, stale + removed)


def _set_header(sieve: int, hosts: int, stale: int) -> None:
    """The sieve's word 0 (sieve_header): the id of its hosts map, and removals."""
    bpf_calls.map_update(sieve, _INDEX.pack(0), SIEVE_WORD.pack(hosts | stale << 32))


def read_list(path: str) -> Sequence[Prefix]:
    """A list file's prefixes (one CIDR a line, # comments)."""
    if not os.path.exists(path):
        raise AlfError(f"set list {path}", "no such file", "check the path", EX_NOINPUT)
    return read_rule_file(path)
