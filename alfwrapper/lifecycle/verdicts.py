"""Kept verdicts: an Accept=yes peer judged before the wrapper's own start-up.

Each connection of an Accept=yes socket (systemd's, `systemd-socket-activate
--inetd`'s, inetd's) starts a wrapper, and the wrapper judges the peer by its
subnet rules (backlog.judge_connection).  Building the policy for that costs
Python's start-up and then tens of milliseconds of imports and parsing, for a
peer the wrapper then resets or hands to COMMAND.  So the first start that judges
a connection keeps what the verdict depended on, and the next start with the same
command line and the same files judges from it, here, before anything else is
imported (door.py):

- **Kept**: the subnet rules of the connection's socket (every prefix, by
  length, for a lookup per length), COMMAND, whether the application keeps the
  capabilities its unit gave (--no-capabilities), and every file the policy read
  or looked for (policy/inputs.CONSULTED: the policy, its drop-in folders, rule
  files), each with its identity (device, inode, size, modification and change
  times) and where its path led (os.path.realpath, before and after it was read),
  in the cache folder (host/cachedir.py: this user's alone) as
  ``verdict-KEY``, sealed with its SHA-256.  Not kept for more than
  ``MAX_RULES`` prefixes: reading them would cost what it saves.
- **Key**: a SHA-256 of this format, alfwrapper's version, the code a verdict
  comes from, the working directory, the arguments, ``ALFWRAPPER_POLICY_PATH``,
  ``LISTEN_FDS``, ``LISTEN_FDNAMES``, whether ``LISTEN_PID`` is this process,
  and the handed-over sockets (fd, family, type, connected or not, which fds are
  one socket).
- **Used** only when the entry is sound and every consulted file is still what it
  was, found where it was (a `current` link switched to a release folder of hard
  links to the same files leads a full start to other rule files beside them).
  A peer the kept rules deny is reset (SO_LINGER 0) with the note the full start
  gives (resets.py: a journal entry with fields, counted by `status`), and the
  wrapper exits 0.  A peer they allow, on the one socket an
  inetd-style start hands over on fd 0 with rules that are not empty, gets
  COMMAND as the full start would run it: confined, then exec'd (handover.py;
  a COMMAND gone since fails at exec, with EX_NOINPUT).  COMMAND and whether
  capabilities are kept come from this command line, and the entry must agree:
  an entry decides whether a peer is let in, never what runs or with what.
  Consulted files are opened for their identity (on NFS a stat may be stale).  Anything else (no
  entry, a changed file, a peer already gone, stderr on the connection, any
  error before confinement) goes on to the full start, which judges again and
  keeps its verdict for the next.

Standard library only, imported lazily: an ordinary start pays two fstat calls.
"""

from __future__ import annotations

import os
import stat

from alfwrapper import __version__
from alfwrapper.host import cachedir

FORMAT = 4
MAX_RULES = 100_000
MAX_ENTRY_BYTES = 8 << 20
PREFIX = "verdict-"
_WIDTH = {4: 32, 6: 128}

TYPE_CHECKING = False  # typing itself costs a denied peer 3 ms
if TYPE_CHECKING:
    from typing import Any

# The code a verdict comes from: its version stays 0.1.0 through a patch or a rebuild.
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CODE = [os.path.join(_HERE, *part) for part in (("lifecycle", "verdicts.py"),
         ("policy", "files.py"), ("policy", "rules.py"), ("policy", "prefix_list.py"),
         ("policy", "prefixes.py"), ("lifecycle", "backlog.py"), ("cli", "options.py"),
         ("cli", "parser.py"), ("cli", "wrapper.py"), ("door.py",),
         ("lifecycle", "wrapper.py"), ("lifecycle", "sockets.py"),
         ("lifecycle", "handover.py"), ("host", "activation.py"))]  # fmt: skip

# Set by denied_early when it found no sound entry: (folder, name, key material),
# for keep() to write once the full start has judged the connection.
PENDING: tuple[str, str, str] | None = None


def _net() -> Any:
    """The socket module's C core (socket.py and its enums cost 4 ms of imports)."""
    try:
        import _socket  # noqa: PLC0415

        return _socket
    except ImportError:  # not CPython
        import socket  # noqa: PLC0415

        return socket


def _candidates() -> list[int]:
    """The fds a wrapper would take as handed over: 0 if it is a socket, and LISTEN_FDS'."""
    fds = []
    try:
        if stat.S_ISSOCK(os.fstat(0).st_mode):
            fds.append(0)
    except OSError:
        pass
    if os.environ.get("LISTEN_PID") == str(os.getpid()):
        count = os.environ.get("LISTEN_FDS", "")
        if count.isdigit() and 0 < int(count) <= 64:
            fds += range(3, 3 + int(count))
    return fds


def _handed_over() -> tuple[str, list[int]] | None:
    """The sockets' shape (for the key) and the connected ones' fds; None when no
    connected socket was handed over (nothing for this module to do)."""
    fds = _candidates()
    if not fds:
        return None
    socket = _net()
    shape, connected = [], []
    seen: dict[tuple[int, int], int] = {}
    for fd in fds:
        try:
            info = os.fstat(fd)
        except OSError:
            return None
        if not stat.S_ISSOCK(info.st_mode):
            shape.append(f"{fd}:-")
            continue
        sock = socket.socket(fileno=fd)
        try:
            family, kind = sock.family, sock.type
            try:
                sock.getpeername()
                is_connected = True
            except OSError:
                is_connected = False
        finally:
            sock.detach()
        same = seen.setdefault((info.st_dev, info.st_ino), fd)
        shape.append(f"{fd}:{int(family)}:{int(kind)}:{int(is_connected)}:{same}")
        if is_connected and family in (socket.AF_INET, socket.AF_INET6):
            connected.append(fd)
    if not connected:
        return None
    return ";".join(shape), connected


def _material(argv: list[str], shape: str) -> str:
    env = os.environ
    facts = [
        str(FORMAT),
        __version__,
        os.getcwd(),
        env.get("ALFWRAPPER_POLICY_PATH", "\1"),
        env.get("LISTEN_FDS", "\1"),
        env.get("LISTEN_FDNAMES", "\1"),
        str(env.get("LISTEN_PID") == str(os.getpid())),
        shape,
        *(str(cachedir.identity_at(path)) for path in _CODE),  # an upgrade or a patch misses
        *argv,
    ]
    return "\0".join(facts)


def _unseal(raw: bytes) -> Any:
    import marshal  # noqa: PLC0415

    if len(raw) < 32 or cachedir.sha256(raw[32:]).digest() != raw[:32]:
        return None
    try:
        return marshal.loads(raw[32:])
    except (ValueError, EOFError, TypeError):
        return None


def _peer(fd: int) -> tuple[str, int, int]:
    """The peer's address, its family (4 or 6; an IPv4-mapped one is IPv4, as its
    packets carry it, and written as IPv4) and its value."""
    socket = _net()
    sock = socket.socket(fileno=fd)
    try:
        text = sock.getpeername()[0]
    finally:
        sock.detach()
    if ":" not in text:
        return text, 4, int.from_bytes(socket.inet_pton(socket.AF_INET, text), "big")
    packed = socket.inet_pton(socket.AF_INET6, text.split("%", 1)[0])
    if packed[:12] == b"\0" * 10 + b"\xff\xff":
        v4 = packed[12:]
        return socket.inet_ntop(socket.AF_INET, v4), 4, int.from_bytes(v4, "big")
    return text, 6, int.from_bytes(packed, "big")


def _local_port(fd: int) -> int:
    socket = _net()
    sock = socket.socket(fileno=fd)
    try:
        return int(sock.getsockname()[1])
    except OSError:
        return 0
    finally:
        sock.detach()


def passes(table: dict[str, dict[int, dict[int, frozenset[int]]]], family: int, value: int) -> bool:
    """SubnetRules.passes over a kept table: denied if a deny prefix covers the
    source; else passed if an allow prefix does, or if there are no allow prefixes."""
    width = _WIDTH[family]

    def covered(kind: str) -> bool:
        lengths = table[kind][family]
        return any(value >> (width - length) in nets for length, nets in lengths.items())

    if covered("deny"):
        return False
    return not any(table["allow"].values()) or covered("allow")


def table_of(allow: Any, deny: Any) -> dict[str, dict[int, dict[int, frozenset[int]]]]:
    """The kept table of two prefix sequences ((family, value, length) each)."""
    table: dict[str, dict[int, dict[int, set[int]]]] = {}
    for kind, prefixes in (("allow", allow), ("deny", deny)):
        by_family: dict[int, dict[int, set[int]]] = {4: {}, 6: {}}
        for family, value, length in prefixes:
            by_family[family].setdefault(length, set()).add(value >> (_WIDTH[family] - length))
        table[kind] = by_family
    return {
        kind: {f: {n: frozenset(s) for n, s in lengths.items()} for f, lengths in fams.items()}
        for kind, fams in table.items()
    }


def _reset(fd: int) -> None:
    import struct  # noqa: PLC0415

    socket = _net()
    sock = socket.socket(fileno=fd)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()


def decided_early(argv: list[str]) -> bool:
    """True when a kept verdict denies the handed-over connection's peer: it has been
    reset, the note printed, and the wrapper must exit 0 at once.  A peer it allows
    on fd 0 gets COMMAND here (never returns; an AlfError once confinement began).
    False in every other case, for the full start to judge (the module's docstring)."""
    try:
        allowed = _judge_early(argv)
    except Exception:  # noqa: BLE001  (the full start judges, and says what is wrong)
        return False
    if allowed is None:
        return False
    if not allowed:
        return True
    command, keep_capabilities = allowed
    try:
        from alfwrapper.lifecycle import handover  # noqa: PLC0415  (only for this)

        handover.load_seccomp()
    except ImportError:
        return False  # the full start says what is missing
    handover.confine_and_exec(command, keep_capabilities, (), (), None)


def _judge_early(argv: list[str]) -> Any:
    """False: denied (reset, noted); (COMMAND, keep capabilities): allowed, to be
    exec'd here; None: for the full start."""
    global PENDING
    handed = _handed_over()
    if handed is None:
        return None
    shape, connected = handed
    folder = cachedir.directory()
    if folder is None:
        return None
    material = _material(argv, shape)
    name = PREFIX + cachedir.sha256(material.encode("utf-8", "surrogateescape")).hexdigest()
    PENDING = (folder, name, material)
    raw = cachedir.read_entry(folder, name, MAX_ENTRY_BYTES)
    body = None if raw is None else _unseal(raw)
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        return None
    if body.get("material") != material:
        return None
    if not still_found(body["consulted"]):
        return None
    PENDING = None  # sound: nothing to keep again
    # The note, or anything said before exec, must not reach the peer: where stderr
    # is the connection (an inetd unit that leaves StandardError= to inherit it), or
    # is closed, the full start judges, and puts its notes in the journal.
    streams = {_file(fd) for fd in connected}
    if _file(2) in streams or _file(2) is None:
        return None
    for fd in connected:
        text, family, value = _peer(fd)
        if passes(body["table"], family, value):
            continue
        port = _local_port(fd)
        for other in connected:
            _reset(other)
        from alfwrapper.lifecycle import resets  # noqa: PLC0415  (a denied peer's alone)

        resets.note(str(body["service"]), text, port, str(body["command"]))
        return False
    run = body["exec"]
    if run is None or connected != [0] or ";" in shape or "--" not in argv:
        return None  # one socket in all, on fd 0, and a COMMAND
    # COMMAND and --no-capabilities come from this command line (which the key holds),
    # never from the entry alone: the entry must agree with them, else the full start.
    # (Whoever could write the folder could otherwise pick what runs, and with what.)
    split = argv.index("--")
    command = argv[split + 1 :]
    keep_capabilities = not any(word.startswith("--no-c") for word in argv[:split])
    if not command or run != {"command": command, "capabilities": keep_capabilities}:
        return None
    return command, keep_capabilities


def still_found(consulted: Any) -> bool:
    """Is every consulted path still what it was, and found where it was (every symbolic
    link on it leading where it led)?  Then a full start reads the same files."""
    return all(
        bool(real) and os.path.realpath(path) == real and _identity(path) == tuple_or_none(ident)
        for path, ident, real in consulted
    )


def _identity(path: str) -> cachedir.Identity:
    """A consulted path's identity now: a regular file's from the file opened (on NFS an
    open revalidates what a stat may take from a cache for a minute), as the full start
    reads it; a folder's, or a missing path's, from stat."""
    return cachedir.identity_opened(path) or cachedir.identity_at(path)


def _file(fd: int) -> tuple[int, int] | None:
    """What the fd is open on (device, inode); None if it is closed."""
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def tuple_or_none(ident: Any) -> tuple[int, ...] | None:
    return None if ident is None else tuple(ident)


def keep(
    allow: Any,
    deny: Any,
    command: list[str],
    consulted: list[tuple[str, Any, str]],
    run: dict[str, Any] | None,
    service: str,
) -> None:
    """Keep the verdict's inputs for the next start (see the module's docstring), if
    decided_early asked for it.  ``run``: how an allowed peer's COMMAND starts
    ({"command": [...], "capabilities": bool}), or None where only the full start
    may start it; ``service``: what a reset is counted under (resets.py).  Never an
    error: the next start judges in full."""
    global PENDING
    if PENDING is None or len(allow) + len(deny) > MAX_RULES:
        return
    folder, name, material = PENDING
    PENDING = None
    try:
        import marshal  # noqa: PLC0415
        import time  # noqa: PLC0415

        now = time.time_ns()
        if not all(cachedir.settled(ident, now) and real for _, ident, real in consulted):
            return
        body = marshal.dumps(
            {
                "format": FORMAT,
                "material": material,
                "consulted": [(path, ident, real) for path, ident, real in consulted],
                "command": command[0],
                "service": service,
                "exec": run,
                "table": table_of(allow, deny),
            }
        )
        if len(body) + 32 <= MAX_ENTRY_BYTES:
            cachedir.write_entry(folder, name, cachedir.sha256(body).digest() + body)
    except Exception:  # noqa: BLE001  (nothing kept: the next start judges in full)
        pass
