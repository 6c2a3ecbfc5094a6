"""Small processes that live beside the application: the interface watcher and the drop
log forwarder.

Each is a fresh interpreter (``python3 -m MODULE``) that never loads BCC,
started double-forked (so it is not the application's child) in the service's
cgroup, holding only the fds it needs.  It gets the application's pidfd and
exits with it, writes its messages where the application's stderr goes, and
says "ready" on a pipe once it works; until then the wrapper does not go on.
"""

from __future__ import annotations

import os
import select
import sys
from collections.abc import Sequence

from alfwrapper.errors import EX_OSERR, AlfError

READY_SECONDS = 20.0


def _cgroup_mounts() -> dict[str, str]:
    """Where the hierarchies that place a process in a unit are mounted: "" for cgroup
    v2, "name=systemd" for systemd's v1 hierarchy (a hybrid layout has both)."""
    found: dict[str, str] = {}
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields, _, after = line.partition(" - ")
            kind, _, options = after.split()[:3]
            if kind == "cgroup2":
                found.setdefault("", fields.split()[4])
            elif kind == "cgroup" and "name=systemd" in options.split(","):
                found.setdefault("name=systemd", fields.split()[4])
    return found


def _cgroups(pid: int) -> dict[str, str]:
    """A process's cgroup in each hierarchy, by its controllers ("" for v2)."""
    with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
        return {c: path for _, c, path in (x.rstrip("\n").split(":", 2) for x in f)}


def join_cgroup(app_pid: int) -> None:
    """Move this process into the application's cgroup, when a command started it from
    elsewhere (`alfwrapper reload` from a shell): then the journal files its lines
    under the service's unit, and stopping the unit stops it too."""
    try:
        theirs, ours = _cgroups(app_pid), _cgroups(os.getpid())
        for hierarchy, mount in _cgroup_mounts().items():
            path = theirs.get(hierarchy)
            if path and path != ours.get(hierarchy):
                with open(f"{mount}{path}/cgroup.procs", "w") as procs:
                    procs.write(str(os.getpid()))
    except (OSError, ValueError) as err:
        print(f"alfwrapper: note: staying out of the service's cgroup: {err}", file=sys.stderr)


def name_process(title: str) -> None:
    """What ps shows for this helper process (its command line, and its 15-character
    name): ``alfwrapper-watch web`` rather than the interpreter and its arguments."""
    from setproctitle import setproctitle  # noqa: PLC0415

    setproctitle(title)


def check_libraries() -> None:
    """What the helpers import that the wrapper does not: missing, it is the wrapper's
    one-line error (cli) before anything has changed, not a helper's failure later."""
    import setproctitle  # noqa: F401, PLC0415


def spawn(
    module: str, what: str, args: Sequence[str], keep_fds: Sequence[int], app_pid: int = 0
) -> int:
    """Start ``python3 -m MODULE LABEL... PIDFD READYFD ARGS...``; its pid, once ready.

    ``app_pid`` (default: this process, which becomes the application) is the
    process it lives as long as.  ``args`` come after the pidfd and ready fd.
    """
    app_pid = app_pid or os.getpid()
    pidfd = os.pidfd_open(app_pid)
    ready_r, ready_w = os.pipe()
    pid_r, pid_w = os.pipe()
    child = os.fork()
    if child:
        os.close(pidfd)
        os.close(ready_w)
        os.close(pid_w)
        os.waitpid(child, 0)
        ready, _, _ = select.select([ready_r], [], [], READY_SECONDS)
        word = os.read(ready_r, 16) if ready else b""
        pid = int(os.read(pid_r, 16) or b"0")
        os.close(ready_r)
        os.close(pid_r)
        if word != b"ready":
            raise AlfError(
                f"starting the {what}",
                "it did not report ready",
                "its own message above says why",
                EX_OSERR,
            )
        return pid
    try:
        os.close(ready_r)
        os.close(pid_r)
        os.setsid()
        if os.fork():
            os._exit(0)
        os.write(pid_w, str(os.getpid()).encode())
        os.close(pid_w)
        # Its messages belong in the application's log (when `alfwrapper reload`
        # starts it, its caller's stdout and stderr are not to be held open).
        try:
            log = os.open(f"/proc/{app_pid}/fd/2", os.O_WRONLY | os.O_APPEND)
        except OSError:  # a socket (the journal's stream) cannot be opened by path
            try:
                from alfwrapper.host.notify import take_fd  # noqa: PLC0415

                log = take_fd(pidfd, 2)
            except OSError:
                log = os.open(os.devnull, os.O_WRONLY)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        join_cgroup(app_pid)
        keep = [pidfd, ready_w, *keep_fds]
        for fd in keep:
            os.set_inheritable(fd, True)
        # Nothing else of the wrapper's: no listening socket, no other map.
        for name in os.listdir("/proc/self/fd"):
            if int(name) > 2 and int(name) not in keep:
                try:
                    os.close(int(name))
                except OSError:
                    pass  # the listing's own fd
        argv = [sys.executable, "-m", module, *args[:1], str(pidfd), str(ready_w), *args[1:]]
        os.execv(sys.executable, argv)
    except BaseException as err:  # noqa: BLE001  (never return into the wrapper's code)
        print(f"alfwrapper: starting the {what}: {err}", file=sys.stderr)
    os._exit(1)
