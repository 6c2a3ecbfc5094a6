"""What a start tells its service manager while it runs: a STATUS= line
(sd_notify(3), through python-systemd), which `systemctl status` shows, and how
long this process has run (/proc/self/stat), for the line that says the filters
are in force.

Only STATUS= is sent, never READY=1: the unit's type, and what the application
itself tells systemd after exec, are left as they are (NOTIFY_SOCKET stays set).
Under a Type=simple unit systemd takes STATUS= only with NotifyAccess=main, which
the shipped units set.
"""

from __future__ import annotations

import os

_STAT_START = 21  # starttime, field 22 of /proc/PID/stat (proc(5)), in clock ticks


def tell_manager(status: str) -> None:
    """STATUS= for the service manager, when one listens (NOTIFY_SOCKET).  Control
    characters become spaces: a newline in a name the policy gave (an interface, a
    filter's file) must not add a line of its own, READY=1 or MAINPID=."""
    if not os.environ.get("NOTIFY_SOCKET"):
        return
    line = "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in status)
    try:
        from systemd import daemon  # noqa: PLC0415

        daemon.notify(f"STATUS={line}")
    except (ImportError, OSError, ValueError):
        return  # progress is a courtesy: a start never fails for it


def seconds_running() -> float:
    """How long ago this process started (exec keeps the start: a re-exec counts)."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    started = int(fields[_STAT_START - 2]) / os.sysconf("SC_CLK_TCK")
    return max(0.0, uptime - started)
