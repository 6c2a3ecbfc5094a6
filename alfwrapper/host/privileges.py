"""Give up, before exec, what would let the application reach its own filter.

The application keeps the capabilities its unit gave (a root daemon that
changes user, chroots or binds itself still can), minus those that reach the
filter (REACHES_FILTER), unless --no-capabilities asks for none at all.  What
guards the filter then, besides the lock SO_LOCK_FILTER puts on the socket:

1. no_new_privs (Linux 3.5): from here on, exec cannot grant anything, not
   even to root (the kernel caps the new permitted set at the old one);
2. REACHES_FILTER leaves the ambient, bounding (needs CAP_SETPCAP; without it,
   step 1 already keeps exec from regaining them), permitted, effective and
   inheritable sets;
3. a seccomp filter (libseccomp) fails every bpf(2) call with EPERM, for the
   application and all it starts: since Linux 6.5 opening a pinned object
   (BPF_OBJ_GET) and changing a map through it check file permissions only,
   which CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN or CAP_SETUID get past;
4. when the application keeps one of those or CAP_KILL (PAST_GUARDS), Landlock
   keeps it from changing anything in a BPF file system (renaming or removing
   pins), from /proc/PID/root of processes it did not start, and from
   signalling those; and when the wrapper may (CAP_SYS_ADMIN), a mount
   namespace of the application's own has no BPF file system at all.  (Pinned
   maps are made without BTF, so they cannot be read as text through the file
   system either: compiler.name_maps.)

The interface watcher (watcher.py) moves to its own user and keeps only
CAP_BPF, which kernels before 6.5 ask for even to update a map.
"""

from __future__ import annotations

import errno
import os

from alfwrapper.errors import EX_OSERR, AlfError
from alfwrapper.host import landlock, process
from alfwrapper.host.capabilities import (
    CAP_LAST,
    CAP_SYS_ADMIN,
    PAST_GUARDS,
    REACHES_FILTER,
    REACHES_FILTER_MASK,
)

PR_SET_DUMPABLE = 4
PR_SET_KEEPCAPS = 8
PR_CAP_AMBIENT_LOWER = 3


def permitted(field: str = "CapPrm") -> int:
    """This process's permitted capability set (or another: CapEff), from
    /proc/self/status."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1], 16)
    return 0


def effective() -> int:
    return permitted("CapEff")


def set_dumpable(dumpable: bool) -> None:
    """PR_SET_DUMPABLE: an undumpable process cannot be traced or read through /proc
    by processes of its own user that lack CAP_SYS_PTRACE."""
    process.prctl(PR_SET_DUMPABLE, int(dumpable))


def switch_user(uid: int, gid: int, keep: int = 0) -> None:
    """As root: become uid/gid with no supplementary groups, keeping only ``keep``."""
    _drop_bounding(keep)
    process.prctl(PR_SET_KEEPCAPS, 1)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    process.prctl(PR_SET_KEEPCAPS, 0)
    drop_privileges(keep)


def _drop_bounding(keep: int) -> None:
    for cap in range(CAP_LAST + 1):
        if keep >> cap & 1:
            continue
        try:
            process.prctl(process.PR_CAPBSET_DROP, cap)
        except OSError as err:
            if err.errno not in (errno.EPERM, errno.EINVAL):
                raise


def drop_privileges(keep: int = 0) -> None:
    """Keep only the capabilities in the ``keep`` mask that we hold, and set no_new_privs."""
    try:
        keep &= permitted()
        process.prctl(process.PR_SET_NO_NEW_PRIVS, 1)
        process.prctl(process.PR_CAP_AMBIENT, process.PR_CAP_AMBIENT_CLEAR_ALL)
        _drop_bounding(keep)
        process.capset(keep, keep, 0)
    except OSError as err:
        raise _failed(err) from None


def _failed(err: OSError) -> AlfError:
    return AlfError(
        "dropping privileges before exec",
        err.strerror or str(err),
        "the application was not started; check the unit's capability settings",
        EX_OSERR,
    )


def drop_reaching_filter() -> int:
    """Remove REACHES_FILTER from every set and set no_new_privs; keep the rest.
    Returns the permitted set kept."""
    try:
        process.prctl(process.PR_SET_NO_NEW_PRIVS, 1)
        for cap in REACHES_FILTER:
            try:
                process.prctl(process.PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER, cap)
            except OSError as err:
                if err.errno != errno.EINVAL:  # a capability this kernel does not know
                    raise
        _drop_bounding(((1 << (CAP_LAST + 1)) - 1) & ~REACHES_FILTER_MASK)
        keep = permitted() & ~REACHES_FILTER_MASK
        process.capset(effective() & keep, keep, permitted("CapInh") & ~REACHES_FILTER_MASK)
        return keep
    except OSError as err:
        raise _failed(err) from None


SOL_SOCKET, SO_REUSEPORT = 1, 15  # asm-generic/socket.h


def deny_bpf_syscall(handed_sockets: bool = False) -> None:
    """A seccomp filter (libseccomp) that fails bpf(2) with EPERM from now on, for this
    process and all it starts; no capability removes it.  On x86-64 the 32-bit entry
    points get the same rule, so a 32-bit helper program works as well.

    ``handed_sockets``: the application is handed filtered sockets; then setting
    SO_REUSEPORT fails with EPERM too (the native system call; a 32-bit one through
    socketcall cannot be told apart).  Set on a handed socket, it would let a socket
    of the application's own bind the same port beside it, unfiltered, and take a
    share of its connections: nginx does so for `listen ... reuseport`."""
    import seccomp  # noqa: PLC0415  (python3-seccomp)

    try:
        rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
        # no_new_privs is the capability step's to set (and, without CAP_SYS_ADMIN,
        # what lets this filter load at all): libseccomp would set it quietly.
        rules.set_attr(seccomp.Attr.CTL_NNP, 0)
        if os.uname().machine == "x86_64":  # (system_arch() is unsigned, Arch signed)
            for arch in (seccomp.Arch.X86, seccomp.Arch.X32):
                rules.add_arch(arch)
        rules.add_rule(seccomp.ERRNO(errno.EPERM), "bpf")
        if handed_sockets:
            rules.add_rule(
                seccomp.ERRNO(errno.EPERM),
                "setsockopt",
                seccomp.Arg(1, seccomp.EQ, SOL_SOCKET),
                seccomp.Arg(2, seccomp.EQ, SO_REUSEPORT),
            )
        rules.load()
    except (OSError, RuntimeError, ValueError) as err:
        raise AlfError(
            "denying bpf(2) to the application (seccomp)",
            str(err),
            "the application was not started; the unit's SystemCallFilter= must allow "
            "seccomp(2) and prctl(2)",
            EX_OSERR,
        ) from None


def hide_bpf_file_systems(mounts: list[str]) -> str:
    """A mount namespace for the application with these BPF file systems unmounted
    (the host's stay); "" once done, else why not."""
    if not effective() >> CAP_SYS_ADMIN & 1:
        return "no CAP_SYS_ADMIN to make a mount namespace"
    try:
        process.unshare_mounts()
        for target in mounts:
            process.umount_detach(target)
    except OSError as err:
        return err.strerror or str(err)
    return ""


def bpf_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Where BPF file systems are mounted, deepest first (proc(5): the mount point is
    field 5, the file system type follows the " - " separator)."""
    found = []
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as lines:
        for line in lines:
            fields, _, rest = line.partition(" - ")
            if rest.split(" ", 1)[0] == "bpf":
                found.append(_unescape(fields.split(" ")[4]))
    return sorted(found, key=lambda path: path.count("/"), reverse=True)


def _unescape(path: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code in ("\\040", "\\011", "\\012", "\\134"):
        path = path.replace(code, chr(int(code[1:], 8)))
    return path


def writable_outside(excluded: list[str], top: str = "/") -> list[str]:
    """The folders that together hold everything under ``top`` but the ``excluded``
    paths: the sibling folders of every folder on the way down to each one.
    (Landlock allows; it cannot deny beneath an allowed folder.)  Files directly in
    a folder on the way down (/, /sys, /sys/fs) are left out with it."""
    found = []
    for entry in sorted(os.listdir(top)):
        path = os.path.join(top, entry)
        if path in excluded or os.path.islink(path) or not os.path.isdir(path):
            continue
        if any(e.startswith(path + "/") for e in excluded):
            found += writable_outside(excluded, path)
        else:
            found.append(path)
    return found


def landlock_application(mounts: list[str]) -> str:
    """Landlock: from now on this process and all it starts may change the file
    system anywhere but in a BPF file system (no pin renamed, removed, linked or
    made), whatever their capabilities; may reach /proc/PID/root of no process
    outside their own tree; and may signal none of those either (the interface
    watcher, the log forwarder).  "" once done, else why not."""
    try:
        landlock.landlock_restrict(writable_outside(mounts), scope_signals=True)
    except OSError as err:
        return err.strerror or str(err)
    return ""


def confine_application(keep_granted: bool, handed_sockets: bool = False) -> str:
    """Everything before exec, in order (the module's docstring).  Returns a note for
    the user ("" if none): what the application keeps that the kernel cannot fully
    hold back from its pinned state."""
    mounts = bpf_mounts()  # before they are hidden: Landlock keeps the host's too
    not_hidden = hide_bpf_file_systems(mounts)  # while CAP_SYS_ADMIN is still ours
    if keep_granted:
        kept = drop_reaching_filter()
    else:
        drop_privileges()
        kept = 0
    past = [name for cap, name in PAST_GUARDS.items() if kept >> cap & 1]
    unprotected = landlock_application(mounts) if past else ""
    deny_bpf_syscall(handed_sockets)
    if unprotected:
        view = f"in its view ({not_hidden})" if not_hidden else "hidden from its view"
        return (
            f"the application keeps {', '.join(past)} and Landlock could not confine it "
            f"({unprotected}); the BPF file system is {view}: it cannot read or change "
            "its filter, but could rename or remove pinned state, or stop the interface "
            "watcher (use --no-capabilities; Landlock needs Linux 5.13 and a container "
            "or the boot's lsm= may refuse it)"
        )
    return ""
