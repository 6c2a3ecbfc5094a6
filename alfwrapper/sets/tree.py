"""Where sets live: the sets' tree in bpffs, a folder a set, its pins (the maps by
role), its lock, the slot (hosts_at) that holds the hosts map in force, and whole
folders listed, removed, or collected when a create or destroy stopped half way."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alfwrapper import state
from alfwrapper.bpf.parts import (
    SET_EXPIRY,
    SET_FLAGS,
    SET_HOST,
    SET_RANGE,
    SET_ROLES,
    SIEVE_FLAGS,
    SIEVE_OLDER_FLAGS,
    SIEVE_WORD,
    bpf_map_put_fd,
    sieve_shift,
)
from alfwrapper.errors import EX_CONFIG, EX_NOPERM, EX_OSERR, EX_TEMPFAIL, EX_USAGE, AlfError
from alfwrapper.host import bpf_calls
from alfwrapper.policy.rules import SET_NAME_RULE, valid_set_name
from alfwrapper.sets.bloom import INDEX, set_header, sieve_words

_ROOT = [state.SETS_ROOT]  # where the tree is seen (use_root)
LIST_DIR = Path("/etc/alfwrapper/sets")
DEFAULT_SIZE = 65536  # entries each map may hold (its most: `set create --size`)
MOST_SIZE = 1 << 24
MAKING = "~making"  # a set being made: NAME~making (making())
LOCK_SECONDS = 10.0
_SHAPES = {  # each map's type, key size, value size and flags
    "hosts": (bpf_calls.BPF_MAP_TYPE_HASH, SET_HOST.size, SET_EXPIRY.size, SET_FLAGS),
    "ranges": (bpf_calls.BPF_MAP_TYPE_LPM_TRIE, SET_RANGE.size, SET_EXPIRY.size, SET_FLAGS),
    "sieve": (bpf_calls.BPF_MAP_TYPE_ARRAY, INDEX.size, SIEVE_WORD.size, SIEVE_FLAGS),
    # One slot, the hosts map in force (parts.SET_ROLES); an array of maps takes no
    # BPF_F_RDONLY_PROG, and no program can write into one anyway.
    "hosts_at": (bpf_calls.BPF_MAP_TYPE_ARRAY_OF_MAPS, INDEX.size, INDEX.size, 0),
}
# A grown hosts map's pin until it takes the hosts pin's name (content._grow): the name
# of no role, so nothing opens it as one; found by repair after a kill.
GROWN = "hosts~grown"
Maps = dict[str, int]  # a set's maps' fds, by role


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


def making(name: str) -> Path:
    """The folder a set is made in before it is renamed into place: no set's name (a
    set's has no ~), so nothing lists or opens it as a set."""
    return root() / f"{check_name(name)}{MAKING}"


def fail(what: str, err: OSError) -> AlfError:
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
        raise fail(f"named set {name} ({path})", err) from None
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
    growth (content._grow) takes between its switch and its rename, the grown one's?  A program
    bound to it then reads the entries that changes write."""
    in_force = hosts_in_force(hosts_at)
    for role in ("hosts", GROWN):
        try:
            fd = bpf_calls.obj_get(str(folder(name) / role), read_only=True)
        except OSError:
            continue
        try:
            if bpf_calls.map_info_id(fd) == in_force:
                return True
        finally:
            os.close(fd)
    return False


def hosts_in_force(hosts_at: int) -> int:
    """The id of the hosts map that hosts_at holds (0: none)."""
    raw = bpf_calls.map_lookup(hosts_at, INDEX.pack(0), INDEX.size)
    return INDEX.unpack(raw)[0] if raw else 0


def repair(name: str, fds: Maps, at: int) -> None:
    """Under the set's lock, before anything is changed: the hosts pin and hosts_at
    must name one map, or entries written through the pin would not be those programs
    read.  A growth killed after its switch (content._grow) is finished: the grown pin, which
    the slot holds, takes the hosts pin's name.  Any other difference (a kill before
    the switch leaves none; an older alfwrapper that made the hosts map again beside
    hosts_at) puts the hosts pin in the slot, its sieve first marked as built for no
    set (so no start takes it until it is rebuilt here: resieve writes its header
    last)."""
    in_force, grown = hosts_in_force(fds["hosts_at"]), pin_path(at, GROWN)
    if in_force != bpf_calls.map_info_id(fds["hosts"]):
        if os.path.exists(grown):
            fd = bpf_calls.obj_get(grown)
            if bpf_calls.map_info_id(fd) == in_force:
                os.rename(GROWN, "hosts", src_dir_fd=at, dst_dir_fd=at)
                os.close(fds["hosts"])
                fds["hosts"] = fd
                return
            os.close(fd)
        set_header(fds["sieve"], 0, 0)
        bpf_map_put_fd(fds["hosts_at"], 0, fds["hosts"])
    if os.path.exists(grown):
        os.unlink(GROWN, dir_fd=at)


@contextmanager
def locked(path: Path) -> Iterator[int]:
    """flock(2) on a set's folder, waited for at most LOCK_SECONDS; the folder's fd,
    which names its pins where a name might be swapped for a link (pin_path)."""
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


def pin_path(folder: int, role: str) -> str:
    """A pin's path through its folder's fd: what the kernel resolves is the folder
    this process opened (no link followed), wherever its name now points."""
    return f"/proc/self/fd/{folder}/{role}"


def give_pin(folder: int, role: str) -> None:
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


def pin(fd: int, at: int, role: str) -> None:
    """Pin a map as the role's, in the folder open at ``at``, and give it away."""
    try:
        os.unlink(role, dir_fd=at)
    except FileNotFoundError:
        pass
    bpf_calls.obj_pin(fd, pin_path(at, role))
    give_pin(at, role)


def unpin_all(at: int) -> None:
    """Unpin every set map in the folder open at ``at``."""
    for role in (*SET_ROLES, GROWN):
        try:
            os.unlink(role, dir_fd=at)
        except FileNotFoundError:
            pass


def still(path: Path, fd: int) -> bool:
    """Does ``path`` still name the folder open at ``fd`` (not removed, not swapped)?"""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (info.st_dev, info.st_ino) == (mine.st_dev, mine.st_ino)


def new_map(name: str, role: str, size: int, inner: int = 0) -> int:
    """A new map of the role's shape: a hosts map of ``size`` entries, a trie that may
    hold up to MOST_SIZE (it takes memory for what it holds alone, and cannot grow:
    programs reach it through their own array of maps), a sieve for ``size`` whole
    addresses, hosts_at of one slot for maps of ``inner``'s shape."""
    kind, key, value, flags = _SHAPES[role]
    label = ("set." + name.replace("-", "_"))[:15]  # a map's name: letters, digits, _ and .
    entries = {"ranges": MOST_SIZE, "sieve": 1 + sieve_words(size), "hosts_at": 1}
    return bpf_calls.map_create(kind, label, key, value, entries.get(role, size), flags, inner)


def new_set_maps(name: str, size: int) -> Maps:
    """A new set's maps, empty: hosts_at holding its hosts, the sieve's header naming
    hosts_at (the set it belongs to, however its hosts map grows)."""
    made: Maps = {}
    try:
        for role in ("hosts", "ranges", "sieve"):
            made[role] = new_map(name, role, size)
        made["hosts_at"] = new_map(name, "hosts_at", 1, inner=made["hosts"])
        bpf_map_put_fd(made["hosts_at"], 0, made["hosts"])
        set_header(made["sieve"], bpf_calls.map_info_id(made["hosts_at"]), 0)
    except BaseException:
        for fd in made.values():
            os.close(fd)
        raise
    return made


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
            raise fail(f"the sets' tree {root()}", err) from None
    state.trusted_dir(root(), create=True)


def names() -> list[str]:
    try:
        return sorted(  # whole sets: a folder without the hosts map is none (create)
            p.name for p in root().iterdir() if valid_set_name(p.name) and (p / "hosts").exists()
        )
    except FileNotFoundError:
        return []
    except OSError as err:
        raise fail(f"{root()}", err) from None


def destroy(name: str) -> bool:
    """Unpin the set.  Services that hold it keep it until their next start or
    reload, and a set made again under the name is a new one."""
    where = folder(name)
    if not where.exists():
        return False
    with locked(where) as at:
        for role in SET_ROLES:
            try:
                os.unlink(role, dir_fd=at)
            except FileNotFoundError:
                pass
        try:
            where.rmdir()
        except OSError as err:  # a create made it again meanwhile
            raise fail(f"removing set {name}", err) from None
    return True


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
        raise fail(f"{root()}", err) from None
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
            if still(path, fd) and (temp or not (path / "hosts").exists()):
                unpin_all(fd)
                path.rmdir()
                removed.append(path.name)
        except OSError:
            continue  # in use (locked), or not ours to remove
        finally:
            os.close(fd)
    return removed
