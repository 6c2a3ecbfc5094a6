"""A set's making: made whole or not at all (create: filled and pinned in a folder of
its own, which one rename puts in place), an older alfwrapper's set mended, and the
sets a start names made from their list files and opened for its programs."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from alfwrapper import state
from alfwrapper.bpf.parts import SET_ROLES, FillEnv, bpf_map_put_fd, sieve_fits
from alfwrapper.errors import EX_NOINPUT, EX_TEMPFAIL, EX_USAGE, AlfError
from alfwrapper.host import bpf_calls
from alfwrapper.host.faults import crash_point
from alfwrapper.policy.prefix_list import read_rule_file
from alfwrapper.policy.prefixes import FAMILY_BITS, Prefix
from alfwrapper.policy.rules import SocketRules
from alfwrapper.record import replace
from alfwrapper.sets.content import put, resieve
from alfwrapper.sets.tree import (
    DEFAULT_SIZE,
    MOST_SIZE,
    Maps,
    exists,
    fail,
    folder,
    give_pin,
    list_file,
    locked,
    make_tree,
    making,
    new_map,
    new_set_maps,
    open_role,
    pin,
    pin_path,
    repair,
    still,
    unpin_all,
)


def create(name: str, prefixes: Sequence[Prefix] = (), size: int = DEFAULT_SIZE) -> bool:
    """Make the set, holding ``prefixes``, unless it exists; True if it was made.

    Whole or not at all: its maps are made, filled and pinned in a folder of their own
    (making()), which one rename then puts in the set's place.  A create that fails
    or is killed on the way leaves no set, only that folder, which the next create of
    the name (or a gc: collect_unfinished) empties; a set made in its place at once
    (the older way) could be listed and yet have no hosts map to add to."""
    where = folder(name)
    if not 1 <= size <= MOST_SIZE:
        raise AlfError(
            f"set {name}", f"size {size} is out of range", f"give 1 to {MOST_SIZE}", EX_USAGE
        )
    make_tree()
    if not (where / "hosts").exists() and _make(name, prefixes, size):
        return True
    state.trusted_dir(where, create=False)
    with locked(where) as at:
        if not (where / "hosts").exists():  # destroyed since
            raise AlfError(
                f"set {name}", "was removed while it was made", "make it again", EX_TEMPFAIL
            )
        try:
            if not all((where / r).exists() for r in ("sieve", "hosts_at")):
                _complete(name, at)  # an older alfwrapper's set
            _refit(name, at)
            if os.geteuid() == 0:  # an older alfwrapper's set, 0700 and 0600, or one
                os.fchmod(at, state.modes(where)[0])  # made killed before it was given
                for role in SET_ROLES:  # away: given now, by fds
                    give_pin(at, role)
        except OSError as err:
            raise fail(f"set {name} in {where}", err) from None
    return False


def _make(name: str, prefixes: Sequence[Prefix], size: int) -> bool:
    """Make the set in making(name), under its lock (one create of a name at a time),
    and rename it into place; False if another create made the set meanwhile."""
    where, temp = folder(name), making(name)
    for _ in range(10):  # a gc may remove the folder between its mkdir and its lock
        state.trusted_dir(temp, create=True)
        try:
            with locked(temp) as at:
                if not still(temp, at):
                    continue
                if (where / "hosts").exists():  # made by the create that held the lock
                    return False
                _build(name, prefixes, size, temp, at)
                return True
        except FileNotFoundError:
            continue
    raise AlfError(f"set {name}", f"{temp} kept vanishing", "try again", EX_TEMPFAIL)


def _build(name: str, prefixes: Sequence[Prefix], size: int, temp: Path, at: int) -> None:
    """The set's maps, made, filled, pinned in ``temp`` (open at ``at``) and given
    away by fds, then ``temp`` renamed into the set's place; on a failure nothing of
    them is left pinned."""
    where = folder(name)
    unpin_all(at)  # what a killed create left here
    made: Maps = {}
    whole = sum(1 for p in prefixes if p.length == FAMILY_BITS[p.family])
    if whole > MOST_SIZE:
        raise AlfError(
            f"set {name}",
            f"{whole} whole addresses are more than a set holds ({MOST_SIZE})",
            "split them into sets",
            EX_USAGE,
        )
    try:
        made = new_set_maps(name, max(size, whole))  # room for them all: no growing here
        put(name, made, prefixes, 0)
        for role in SET_ROLES:
            pin(made[role], at, role)
            crash_point(f"set-{role}-pinned")
        crash_point("set-made")
        _rename_in(name, temp, where)
    except OSError as err:
        _discard(temp, at)
        raise fail(f"creating set {name} in {where}", err) from None
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
    with locked(where) as at:
        if (where / "hosts").exists():
            raise OSError(errno.EEXIST, "made by another create meanwhile", str(where))
        unpin_all(at)
    os.rename(temp, where)


def _discard(temp: Path, at: int) -> None:
    """A failed create's folder, emptied and removed (only if it is still ours)."""
    try:
        unpin_all(at)
        if still(temp, at):
            temp.rmdir()
    except OSError:
        pass  # left for the next create or a gc


def _complete(name: str, at: int) -> None:
    """An older alfwrapper's set (hosts and ranges, perhaps a sieve, no hosts_at)
    given what it lacks, its sieve rebuilt from what it holds, under its lock (``at``:
    its folder's fd)."""
    fds: Maps = {}
    try:
        fds["hosts"], fds["ranges"] = open_role(name, "hosts"), open_role(name, "ranges")
        size = bpf_calls.map_shape(fds["hosts"])[3]
        if os.path.exists(pin_path(at, "hosts_at")):
            fds["hosts_at"] = open_role(name, "hosts_at")
        else:
            fds["hosts_at"] = new_map(name, "hosts_at", 1, inner=fds["hosts"])
            bpf_map_put_fd(fds["hosts_at"], 0, fds["hosts"])
        fds["sieve"] = (
            open_role(name, "sieve")
            if os.path.exists(pin_path(at, "sieve"))
            else new_map(name, "sieve", size)
        )
        resieve(fds)
        for role in ("sieve", "hosts_at"):
            if not os.path.exists(pin_path(at, role)):
                pin(fds[role], at, role)
    finally:
        for fd in fds.values():
            os.close(fd)


def _refit(name: str, at: int) -> None:
    """Mend the set (repair) and rebuild its sieve if it was built for another set
    (an older alfwrapper destroyed and made the set again beside it); the caller holds
    the set's lock (``at``: its folder's fd)."""
    fds: Maps = {}
    try:
        for role in SET_ROLES:
            fds[role] = open_role(name, role)
        repair(name, fds, at)
        if not sieve_fits(fds["hosts_at"], fds["sieve"]):
            resieve(fds)
    finally:
        for fd in fds.values():
            os.close(fd)


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
    if not wanted or not state.store_in_use().opens_sets:
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
                stand_ins[name] = new_set_maps(name, 1)
            return os.dup(stand_ins[name][role])
        except OSError as err:
            raise fail(f"checking set {name}", err) from None

    return replace(env, open_set=open_set)


def read_list(path: str) -> Sequence[Prefix]:
    """A list file's prefixes (one CIDR a line, # comments)."""
    if not os.path.exists(path):
        raise AlfError(f"set list {path}", "no such file", "check the path", EX_NOINPUT)
    return read_rule_file(path)
