"""Whose the pinned trees are, and every folder on a path checked before it is trusted.

Pinned objects are guarded by file permissions alone (since Linux 6.5 the
unprivileged_bpf_disabled check covers only creating maps and loading
programs): an application running as uid 0 without capabilities could open a
root-owned pin.  So the tree belongs to a user the application never is, and
every directory on the path is checked before it is trusted.  The users' tree
belongs to the loader's own user, and root's is not even in the loader's mount
namespace: a loader taken over by a local user's filter reaches no root service.
"""

from __future__ import annotations

import errno
import functools
import os
import pwd
import stat
import time
from pathlib import Path

from alfwrapper.errors import EX_CONFIG, EX_NOPERM, EX_OSERR, EX_USAGE, AlfError
from alfwrapper.host import libc
from alfwrapper.host.faults import crash_point

BPFFS = Path("/sys/fs/bpf")
ROOT = BPFFS / "alfwrapper"
OWNER = "alfwrapper"
USERS_ROOT = BPFFS / "alfwrapper-users"
LOADER_OWNER = "alfwrapper-loader"
# Where the users' tree is seen: here, and where the loader's unit binds it (--pins).
_USERS_VIEWS = [USERS_ROOT]
SETS_ROOT = BPFFS / "alfwrapper-sets"  # named sets (alfwrapper/sets/)
SETS_OWNER = "alfwrapper-sets"
_SETS_VIEWS = [SETS_ROOT]
BPF_FS_MAGIC = 0xCAFE4A11
TMPFS_MAGIC = 0x01021994


def failure(what: str, err: OSError) -> AlfError:
    """The error for an OSError on a pinned tree, with what to do by its errno."""
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
        raise failure(f"{where}", err) from None
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


def trusted_dir(path: Path, create: bool) -> None:
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
                raise failure(f"creating {path}", err) from None
            except OSError as err:
                raise failure(f"creating {path}", err) from None
        try:
            info = path.lstat()
        except FileNotFoundError:
            if create and time.monotonic() < deadline:
                continue  # removed by a gc since: make it again
            raise AlfError(
                f"{path}", "does not exist", "nothing is pinned there", EX_USAGE
            ) from None
        except OSError as err:
            raise failure(f"{path}", err) from None
        handing_over = (
            create
            and stat.S_ISDIR(info.st_mode)
            and info.st_uid != uid
            and not info.st_mode & ~modes(path)[0] & 0o777  # as made, before its chown
        )
        if not handing_over or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    _check_folder(path, info, uid)


def _check_folder(path: Path, info: os.stat_result, uid: int) -> None:
    """Refuse a folder (as lstat saw it) that is not a directory of ``uid`` with our mode."""
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
        raise failure(f"{base}", err) from None
    return base


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
