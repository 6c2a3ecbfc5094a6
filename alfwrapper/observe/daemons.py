"""``alfwrapper doctor --for COMMAND``: will this command work behind alfwrapper?

Two questions decide it.  How does the command take its sockets: from
LISTEN_FDS (sd_listen_fds(3)), inetd style on fds 0 and 1, or does it bind
its own, which alfwrapper intercepts (lifecycle/intercept.py) when it is given
no socket, on Linux 5.6 and later, for a 64-bit executable, or takes given sockets
its own way (nginx's NGINX variable, HAProxy's fd@N)?  And does it need a capability that
alfwrapper removes (capabilities.REACHES_FILTER, or all with --no-capabilities)?
KNOWN answers both for daemons from Debian's archive; for any other command
the executable's bytes are searched for sd_listen_fds / LISTEN_FDS, and its
file capabilities and set-user-ID bit are read.  A heuristic: it says
"unlikely", never "certain".
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Sequence

from alfwrapper.errors import EX_NOINPUT, AlfError
from alfwrapper.host import capabilities
from alfwrapper.record import Record

INETD, LISTEN_FDS, OWN = "inetd", "listen-fds", "own"
HOW = {
    INETD: "its connection on fds 0 and 1, inetd style (StandardInput=socket)",
    LISTEN_FDS: "sockets from LISTEN_FDS (sd_listen_fds)",
    OWN: "binds its own sockets",
}
INTERCEPTED = (
    "alfwrapper intercepts its binds when given rules and no socket (no --listen, no "
    "socket unit): alfwrapper(1), DAEMONS THAT BIND THEIR OWN SOCKETS"
)
_INTERCEPTION_KERNEL = (5, 6)  # pidfd_getfd(2)
_SCAN_LIMIT = 64 << 20  # bytes of an executable searched for sd_listen_fds
# capability(7)'s names, by number (linux/capability.h).
_CAP_NAMES = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP "
    "LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER "
    "SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE "
    "SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP "
    "MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF "
    "CHECKPOINT_RESTORE"
).split()


class Daemon(Record):
    """What one daemon does with a given option: how it takes sockets, what it needs."""

    program: str  # the executable's file name
    option: str  # a regular expression its arguments must match ("" for any)
    sockets: str  # INETD, LISTEN_FDS or OWN
    needs: tuple[int, ...] = ()  # capabilities, when it runs as root
    why: str = ""
    native: str = ""  # how it takes the sockets alfwrapper is given, its own way


_NGINX_NATIVE = (
    "given sockets (--listen, a socket unit), it takes them from the NGINX variable "
    "alfwrapper sets, for each `listen` of the same address and port"
)
_HAPROXY_NATIVE = (
    "given sockets (--listen, a socket unit), it takes them where its configuration "
    "says `bind fd@3` (fd@4 for the second, and so on)"
)
_PRIVSEP = (capabilities.CAP_SETUID, capabilities.CAP_SETGID, capabilities.CAP_SYS_CHROOT)
KNOWN = (
    # -i alone or among sshd's flags that take no argument (-Di), not in -oIdentity...
    Daemon(
        "sshd", r"(^| )-[46DdeqTtGV]*i[46DdeqTtGV]*( |$)", INETD, _PRIVSEP, "privilege separation"
    ),
    Daemon("sshd", "", OWN, _PRIVSEP, "privilege separation"),
    Daemon("in.tftpd", r"(^| )(-l|--listen)\b", OWN, _PRIVSEP, "-s chroots, -u changes user"),
    Daemon("in.tftpd", "", INETD, _PRIVSEP, "-s chroots, -u changes user"),
    Daemon("rsync", r"--daemon", INETD, _PRIVSEP, "`use chroot` and `uid` in rsyncd.conf"),
    Daemon("git-daemon", r"--inetd", INETD),
    Daemon("git-daemon", "", OWN),
    Daemon("git", r"^daemon .*--inetd", INETD),
    Daemon("git", r"^daemon", OWN),
    Daemon("dnsmasq", "", OWN),
    Daemon("nginx", "", OWN, native=_NGINX_NATIVE),
    Daemon("apache2", "", OWN),
    Daemon("postgres", "", OWN),
    Daemon("redis-server", "", OWN),
    Daemon("haproxy", "", OWN, native=_HAPROXY_NATIVE),
    Daemon("mariadbd", "", OWN),
    Daemon("unbound", "", OWN),
    Daemon("named", "", OWN),
    Daemon("lighttpd", "", LISTEN_FDS, why="server.systemd-socket-activation"),
    Daemon("systemd-socket-proxyd", "", LISTEN_FDS),
)


class Finding(Record):
    ok: bool
    text: str


def known(argv: Sequence[str]) -> Daemon | None:
    name, args = os.path.basename(argv[0]), " ".join(argv[1:])
    return next((d for d in KNOWN if d.program == name and re.search(d.option, args)), None)


def own_sockets(program: str, path: str, inetd: bool, native: str = "") -> Finding:
    """A command that binds its own sockets: intercepted, unless it is started with a
    socket, is a 32-bit executable (whose binds are refused), or the kernel is older
    than pidfd_getfd.  ``native``: how it takes given sockets its own way, which
    works whatever the executable and kernel."""
    if native and not inetd:
        return Finding(True, f"{program} {HOW[OWN]}: {INTERCEPTED}; or, {native}")
    if inetd:
        return Finding(
            False,
            f"{program} {HOW[OWN]}, not its connection on fd 0: start it "
            "with no socket (leave out --inetd)",
        )
    with open(path, "rb") as exe:
        head = exe.read(5)
    if head[:4] == b"\x7fELF" and head[4:5] == b"\x01":
        return Finding(
            False,
            f"{program} {HOW[OWN]}, and is a 32-bit executable, whose "
            "binds alfwrapper refuses: use its 64-bit build",
        )
    release = tuple(int(n) for n in re.findall(r"\d+", os.uname().release)[:2])
    if release < _INTERCEPTION_KERNEL:
        return Finding(
            False,
            f"{program} {HOW[OWN]}, which alfwrapper intercepts on Linux "
            "5.6 and later only: this is " + os.uname().release,
        )
    return Finding(True, f"{program} {HOW[OWN]}: {INTERCEPTED}")


def scan_sockets(path: str) -> str:
    """LISTEN_FDS when the executable (or script) names sd_listen_fds or LISTEN_FDS,
    else "" (cannot tell: inetd style or its own)."""
    with open(path, "rb") as exe:
        data = exe.read(_SCAN_LIMIT)
    return LISTEN_FDS if re.search(rb"sd_listen_fds|LISTEN_FDS|listen_fds", data) else ""


def file_capabilities(path: str) -> int:
    """The permitted set of the executable's file capabilities (security.capability)."""
    try:
        return permitted_of(os.getxattr(path, "security.capability"))
    except OSError:
        return 0


def permitted_of(raw: bytes) -> int:
    """struct vfs_cap_data (linux/capability.h): magic_etc, then permitted and
    inheritable per 32-bit word, low word first (revision 1 has one word)."""
    low = int.from_bytes(raw[4:8], "little")
    high = int.from_bytes(raw[12:16], "little") if len(raw) >= 16 else 0
    return low | high << 32


def names(mask: int) -> str:
    return ", ".join(
        f"CAP_{_CAP_NAMES[cap]}" if cap < len(_CAP_NAMES) else f"capability {cap}"
        for cap in range(64)
        if mask >> cap & 1
    )


def examine(argv: Sequence[str], inetd: bool, no_capabilities: bool) -> list[Finding]:
    """What stands in the way of running argv behind alfwrapper, started inetd style or
    with LISTEN_FDS, keeping the unit's capabilities (but REACHES_FILTER) or none."""
    path = shutil.which(argv[0])
    if path is None:
        raise AlfError(
            f"doctor --for {argv[0]}", "not found or not executable", "give a path", EX_NOINPUT
        )
    findings = []
    daemon = known(argv)
    given = INETD if inetd else LISTEN_FDS
    takes = daemon.sockets if daemon else scan_sockets(path)
    if takes == OWN:
        findings.append(own_sockets(argv[0], path, inetd, daemon.native if daemon else ""))
    elif takes and takes != given:
        findings.append(
            Finding(
                False,
                f"{argv[0]} expects {HOW[takes]}, but would get {HOW[given]}"
                + (" (leave out --inetd)" if inetd else " (check with --inetd if so started)"),
            )
        )
    elif takes:
        findings.append(Finding(True, f"{argv[0]} takes {HOW[takes]}"))
    else:
        findings.append(
            Finding(
                True,
                f"{argv[0]} does not name sd_listen_fds: it may take {HOW[INETD]}, or "
                f"bind its own sockets ({INTERCEPTED})",
            )
        )
    removed = (1 << 64) - 1 if no_capabilities else capabilities.REACHES_FILTER_MASK
    needs = sum(1 << cap for cap in daemon.needs) if daemon else 0
    needs |= file_capabilities(path)
    lost = needs & removed
    if lost:
        why = f" ({daemon.why})" if daemon and daemon.why else ""
        option = "--no-capabilities" if no_capabilities else "alfwrapper"
        findings.append(
            Finding(False, f"{argv[0]} needs {names(lost)}{why}, which {option} removes")
        )
    elif needs:
        findings.append(Finding(True, f"{argv[0]} keeps what it needs: {names(needs)}"))
    mode = os.stat(path).st_mode
    if mode & (stat.S_ISUID | stat.S_ISGID):
        findings.append(
            Finding(
                False,
                f"{path} is set-user-ID or set-group-ID: no_new_privs keeps exec "
                "from granting that",
            )
        )
    return findings
